"""docs/benchmarks/replicas.md: N replicas against one EPP in virtual time (every scenario, one
commit, one default) and in one real-time campaign; rows missing render as "not run"."""

from __future__ import annotations

import shutil
from pathlib import Path

from bench.reports.replicas import PAGE, REAL_SCENARIOS, REAL_SECTION, VIRTUAL_SECTION, render_page
from bench.vtime.cli import REPLICA_SUMMARIES
from tests.bench.replica_summaries import earlier, today, write

REPO = Path(__file__).parents[2]


def _section(page: Path, key: str) -> str:
    text = page.read_text()
    return text.split(f"<!-- bench:{key}:start -->", 1)[1].split(f"<!-- bench:{key}:end -->", 1)[0]


def _rows(section: str) -> dict[tuple[str, str], list[str]]:
    """(scenario, replicas) -> the row's other cells."""
    out = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.split("|")[1:-1]]
        if len(cells) == 8 and cells[0] not in ("scenario", "---"):
            out[(cells[0], cells[1])] = cells[2:]
    return out


def _sim(root: Path, policy: str, scale: float, scenario: str = "toy", commit: str = "c1") -> None:
    write(root, policy, today(), scale, commit=commit, scenario_name=scenario, command="sim")


def test_virtual_rows_change_vs_one_epp_within_three_percent(tmp_path: Path) -> None:
    virtual = tmp_path / REPLICA_SUMMARIES
    (tmp_path / "bench/scenarios").mkdir(parents=True)
    (tmp_path / "bench/scenarios/idle.yaml").write_text("")  # a scenario with no virtual run yet
    _sim(virtual, "epp-default", 0.010)
    _sim(virtual, "epp-default-2replicas", 0.0102)  # +2 %: within
    _sim(virtual, "epp-default-4replicas", 0.0110)  # +10 %: missed
    _sim(virtual, "epp-default", 0.010, scenario="other", commit="aaaaaaa")
    _sim(virtual, "epp-default-2replicas", 0.010, scenario="other", commit="bbbbbbb")
    page = render_page(tmp_path, virtual)
    rows = _rows(_section(page, VIRTUAL_SECTION))
    assert rows[("toy", "1")][-2] == "(one EPP: epp-default)"
    assert rows[("toy", "2")][-2:] == ["+2.0 % / +2.0 %", "hit"]
    assert rows[("toy", "4")][-2:] == ["+10.0 % / +10.0 %", "**missed**"]
    assert rows[("toy", "8")][0] == "not run"
    assert rows[("idle", "1, 2, 4, 8")][0] == "not run"
    text, verdict = rows[("other", "2")][-2:]  # two commits: no change, no verdict
    assert verdict == "n/a" and text.startswith("not comparable:") and "commit bbbbbbb" in text
    section = _section(page, VIRTUAL_SECTION)
    assert "python -m bench sim --scenario bench/scenarios/<scenario>.yaml --policy epp-default" in section
    # Without a campaign the real-time table says so, every row not run.
    real = _rows(_section(page, REAL_SECTION))
    assert all(real[(s, "1, 2")][0] == "not run" for s in REAL_SCENARIOS)
    assert "No replicas campaign found" in _section(page, REAL_SECTION)


def test_real_rows_come_from_the_newest_committed_campaign(tmp_path: Path) -> None:
    campaigns = tmp_path / "bench/results-committed"
    old, new = campaigns / "2026-12-01-replicas" / "quick", campaigns / "2026-12-05-replicas"
    old.mkdir(parents=True)
    write(new, "epp-default", today(), 0.010)
    write(new, "epp-default-2replicas", today(), 0.0104, "replicas=2")  # +4 %: within +5 %
    write(new, "epp-default", today(), 0.010, scenario_name="lora")
    write(new, "epp-default-2replicas", earlier(), 0.08, "replicas=2", scenario_name="lora")
    page = render_page(tmp_path, tmp_path / REPLICA_SUMMARIES)
    section = _section(page, REAL_SECTION)
    assert "From `bench/results-committed/2026-12-05-replicas`" in section
    rows = _rows(section)
    assert rows[("bursty", "2")][-2:] == ["+4.0 % / +4.0 %", "hit"]
    text, verdict = rows[("lora", "2")][-2:]
    assert verdict == "n/a" and text.startswith("stale: re-run epp-default-2replicas")
    assert rows[("docqa", "1, 2")][0] == "not run"
    # A campaign named on the command line wins; a page's hand-written text stays.
    page.write_text(page.read_text() + "\nHand-written.\n")
    render_page(tmp_path, tmp_path / REPLICA_SUMMARIES, campaign=old.parent)
    assert "Hand-written." in page.read_text()
    assert _rows(_section(page, REAL_SECTION))[("bursty", "1, 2")][0] == "not run"


def test_the_committed_replicas_page_is_the_generated_one(tmp_path: Path) -> None:
    """`python -m bench report` on the committed summaries changes nothing in the page."""
    page = tmp_path / "replicas.md"
    shutil.copy(REPO / PAGE, page)
    render_page(REPO, REPO / REPLICA_SUMMARIES, page=page)
    assert page.read_text() == (REPO / PAGE).read_text(), f"run `python -m bench report` and commit {PAGE}"
