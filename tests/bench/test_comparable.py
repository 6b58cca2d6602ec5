"""The report compares only rows of the same default: a target set between two of our rows that
ran different defaults (profile, default_revision, single- or two-hop, options but the replica
count) says "not comparable" or "stale: re-run" instead of a change and a verdict."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bench.harness.summary import SUMMARIES_DIR, load_summaries
from bench.reports.comparable import options, replica_count, row_default, why_not_comparable
from bench.reports.scorecard import REPLICAS, check_scenario, figures_of, scorecard_for
from tests.bench.replica_summaries import earlier, today, write

REPO = Path(__file__).parents[2]


def _rows(root: Path) -> dict[str, tuple[str, str]]:
    text = scorecard_for(root) or ""
    out = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.split("|")[1:-1]]
        if len(cells) == 4 and cells[0] == "bursty":
            out[cells[1]] = (cells[2], cells[3])
    return out


P95_2 = "2 EPP replicas: TTFT P95 within +5 % of one"
P50_2 = "2 EPP replicas: TTFT P50 within +5 % of one"


def test_replicas_of_the_same_default_are_compared(tmp_path: Path) -> None:
    write(tmp_path, "epp-default", today(), 0.010)
    write(tmp_path, "epp-default-2replicas", today(), 0.0102, "replicas=2")
    rows = _rows(tmp_path)
    assert rows[P95_2][1] == "hit" and "+2.0 %" in rows[P95_2][0]


def test_a_replica_row_of_an_earlier_default_is_stale_not_a_miss(tmp_path: Path) -> None:
    write(tmp_path, "epp-default", today(), 0.010)
    write(tmp_path, "epp-default-2replicas", earlier(), 0.080, "replicas=2")  # +700 %, but not comparable
    rows = _rows(tmp_path)
    for label in (P95_2, P50_2):
        text, result = rows[label]
        assert result == "n/a" and text.startswith("stale: re-run epp-default-2replicas"), text
        assert "two-hop" in text and "default_revision none" in text and "%" not in text


def test_ours_of_an_earlier_default_gives_no_target_figures(tmp_path: Path) -> None:
    """Issue #53: a target of ours (against round-robin, the peers, the oracle, its own replicas)
    whose runs are of an earlier default says "stale: re-run" and gives no figure or verdict."""
    write(tmp_path, "epp-default", earlier(), 0.010)
    write(tmp_path, "epp-default-2replicas", earlier(), 0.010, "replicas=2")
    write(tmp_path, "round-robin", {}, 0.100)
    write(tmp_path, "sglang-cache_aware", {}, 0.050)
    rows = _rows(tmp_path)
    assert {"TTFT P95 vs round-robin", "TTFT P95 below every peer", P95_2} <= set(rows)
    for label, (text, result) in rows.items():
        assert result == "n/a" and text.startswith("stale: re-run epp-default") and "%" not in text, label
    write(tmp_path, "epp-default", today(), 0.010)
    write(tmp_path, "epp-default-2replicas", today(), 0.010, "replicas=2")
    rows = _rows(tmp_path)
    assert all(result != "n/a" and not text.startswith("stale") for text, result in rows.values())


def test_rows_of_two_earlier_defaults_are_not_comparable(tmp_path: Path) -> None:
    write(tmp_path, "epp-default", today(single_hop=False, default_revision=1), 0.010)
    write(tmp_path, "epp-default-2replicas", earlier(), 0.010, "replicas=2")
    text, result = _rows(tmp_path)[P95_2]
    assert result == "n/a" and text.startswith("not comparable:") and "profile" in text


def test_replicas_differ_in_their_count_alone(tmp_path: Path) -> None:
    """Same default, but the replicas ran another shared-state setting: not comparable; the
    replica count (and the shared store it implies) is what may differ."""
    write(tmp_path, "epp-default", today(), 0.010)
    write(tmp_path, "epp-default-2replicas", today(), 0.010, "replicas=2", "shared_publish_ms=5")
    text, result = _rows(tmp_path)[P95_2]
    assert result == "n/a" and text.startswith("not comparable:") and "shared_publish_ms=5" in text
    write(tmp_path, "epp-default-2replicas", today(), 0.010, "replicas=2", "shared_state=1")
    assert _rows(tmp_path)[P95_2][1] == "hit"


def test_precise_and_approximate_rows_of_two_defaults_are_refused(tmp_path: Path) -> None:
    write(tmp_path, "epp-default", today(), 0.010)
    write(tmp_path, "epp-default-precise", today(), 0.008)
    write(tmp_path, "epp-default+tok", today(single_hop=False), 0.010)
    text, result = _rows(tmp_path)["TTFT P95, precise vs approximate prefix (same fleet)"]
    assert result == "n/a" and text.startswith("not comparable:") and "two-hop" in text


def test_seeds_of_one_row_that_ran_different_defaults_refuse_it(tmp_path: Path) -> None:
    write(tmp_path, "epp-default", today(), 0.010)
    write(tmp_path, "epp-default-2replicas", today(), 0.010, "replicas=2")
    runs = load_summaries(tmp_path, "quick")["bursty"]
    runs["epp-default-2replicas"][0]["policy"]["config"]["single_hop"] = False
    reason = why_not_comparable("epp-default-2replicas", runs["epp-default-2replicas"], "epp-default",
                                runs["epp-default"], replicas_differ=True)  # fmt: skip
    assert reason is not None and "seeds of epp-default-2replicas ran different defaults" in reason


def test_virtual_rows_of_two_commits_are_not_comparable(tmp_path: Path) -> None:
    write(tmp_path, "epp-default", today(), 0.010, commit="aaaaaaa1")
    write(tmp_path, "epp-default-2replicas", today(), 0.010, "replicas=2", commit="bbbbbbb2")
    runs = load_summaries(tmp_path, "quick")["bursty"]
    one, many = runs["epp-default"], runs["epp-default-2replicas"]
    assert why_not_comparable("epp-default-2replicas", many, "epp-default", one, replicas_differ=True) is None
    reason = why_not_comparable(
        "epp-default-2replicas", many, "epp-default", one, replicas_differ=True, same_commit=True
    )
    assert reason is not None and "commit bbbbbbb" in reason and "commit aaaaaaa" in reason


def test_options_leave_out_naming_and_the_replica_count() -> None:
    run = {"run": {"command": ["python", "-m", "bench", "sim", "--scenario", "x.yaml", "--policy", "epp-default",
                               "--gateway-ms", "0", "--label", "epp-default-4replicas", "--replicas", "4",
                               "--seeds", "reporting", "--target-opt", "scrape_ms=20",
                               "--store-rtt-ms", "0.3"]}}  # fmt: skip
    assert options(run) == {"--gateway-ms": "0", "scrape_ms": "20"}
    assert replica_count("epp-default-4replicas", run) == 4
    assert replica_count("epp-default-8replicas", {}) == 8 and replica_count("epp-default", {}) == 1


# ------------------------------------------------------------- the committed summaries


def _compared_pairs(policies: dict[str, Any]) -> list[tuple[str, str, bool]]:
    """(row, reference row, across replica counts) of every target set between two of our rows."""
    one = "epp-default-1replica" if "epp-default-1replica" in policies else "epp-default"
    pairs = [
        (f"epp-default-{n}replicas", one, True) for n in REPLICAS if f"epp-default-{n}replicas" in policies
    ]
    if "epp-default-precise" in policies and "epp-default+tok" in policies:
        pairs.append(("epp-default-precise", "epp-default+tok", False))
    return pairs


@pytest.mark.parametrize("scenario", sorted(load_summaries(REPO / SUMMARIES_DIR, "quick")))
def test_no_rendered_target_compares_rows_of_two_defaults(scenario: str) -> None:
    """Over the committed summaries: every target with a verdict between two of our rows has
    both rows of today's default (profile, revision, hop, options); the others give no change."""
    policies = load_summaries(REPO / SUMMARIES_DIR, "quick")[scenario]
    rows = {what: (text, hit) for what, text, hit in check_scenario(scenario, figures_of(policies), policies)}
    for row, ref, replicas in _compared_pairs(policies):
        a, b = row_default(row, policies[row]), row_default(ref, policies[ref])
        same = a is not None and b is not None and (a.profile, a.revision, a.hop, a.settings) == (
            b.profile, b.revision, b.hop, b.settings,
        )  # fmt: skip
        labels = (
            [f"{row.split('-')[2].removesuffix('replicas')} EPP replicas: TTFT {m} within +5 % of one"
             for m in ("P95", "P50")]
            if replicas
            else ["TTFT P95, precise vs approximate prefix (same fleet)"]
        )  # fmt: skip
        for label in labels:
            text, hit = rows[label]
            if same and a is not None and a.is_current():
                assert hit is not None and "%" in text, (scenario, label, text)
            elif same:  # both of one earlier default: stale, no figures (issue #53)
                assert hit is None and text.startswith("stale: re-run"), (scenario, label, text)
            else:
                assert hit is None and "%" not in text, (scenario, label, text)
                assert text.startswith(("not comparable:", "stale: re-run")), (scenario, label, text)
