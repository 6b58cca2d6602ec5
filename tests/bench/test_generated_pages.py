"""The generated tables of identical-fleets.md and slo.md, and costs.md's workers claim, regenerate
from the committed data (issue #53): a page and its data that disagree fail here."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from bench.reports import identical_pods, slo
from bench.vtime.workers_table import pairs

REPO = Path(__file__).resolve().parents[2]
WORKERS = REPO / "bench/results-committed/2026-12-06-workers-virtual"


def test_identical_fleets_tables_are_the_generated_ones() -> None:
    page = (REPO / identical_pods.PAGE).read_text()
    assert identical_pods.render_page(page, REPO) == page, (
        "run `python -m bench.reports.identical_pods --write` and commit docs/benchmarks/identical-fleets.md"
    )


def test_a_changed_identical_fleets_cell_is_caught() -> None:
    page = (REPO / identical_pods.PAGE).read_text()
    changed = page.replace("| `docqa` | 11.0 / 14.4", "| `docqa` | 11.0 / 15.4", 1)
    assert changed != page and identical_pods.render_page(changed, REPO) == page


def test_slo_tables_are_the_generated_ones(tmp_path: Path) -> None:
    doc = tmp_path / "slo.md"
    shutil.copy(REPO / slo.DOC, doc)
    slo.render_doc(REPO / slo.SLO_VIRTUAL_SUMMARIES, REPO / "bench/summaries", "quick", doc)
    assert doc.read_text() == (REPO / slo.DOC).read_text(), (
        "run `python -m bench slo-report` and commit docs/benchmarks/slo.md"
    )


def test_costs_workers_claim_is_what_the_campaign_gives() -> None:
    """costs.md states "**N of M the same run**" for 2 workers against one process: the pairs of
    its campaign (bench.vtime.workers_table) give the same counts."""
    text = (REPO / "docs/benchmarks/costs.md").read_text()
    claim = re.search(r"\*\*(\d+) of (\d+) the same run\*\*", text)
    assert claim is not None
    rows = pairs(WORKERS, "quick", "epp-default", 2)
    assert (int(claim[1]), int(claim[2])) == (sum(1 for r in rows if r.same), len(rows))


def test_agentic_sessions_tables_are_the_generated_ones(tmp_path: Path) -> None:
    """Issue #51's two tables in docs/benchmarks/agentic.md regenerate from its campaigns."""
    from bench.reports import sessions

    page = tmp_path / "agentic.md"
    shutil.copy(REPO / sessions.PAGE, page)
    sessions.render(REPO, page)
    assert page.read_text() == (REPO / sessions.PAGE).read_text(), (
        "run `python -m bench.reports.sessions --write` and commit docs/benchmarks/agentic.md"
    )
