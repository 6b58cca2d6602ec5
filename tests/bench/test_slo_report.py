"""docs/benchmarks/slo.md's tables: attainment per policy and class, median [min-max] over seeds."""

from __future__ import annotations

import json
from pathlib import Path

from bench.reports.slo import render_doc, slo_tables


def _write(root: Path, scenario: str, policy: str, seed: int, attained: float | None) -> None:
    steady = {"errors": 0, "ttft_p50": 0.02, "ttft_p95": 0.05 * seed, "by_tag": {}}
    if attained is not None:
        steady |= {"slo_attainment": attained, "slo_goodput_rps": 100 * attained}
        steady["by_tag"] = {"tight": {"slo_attainment": attained - 0.1}, "loose": {"slo_attainment": 1.0}}
    summary = {
        "schema": 1,
        "seed": seed,
        "scenario": {"name": scenario, "description": f"{scenario} fleet."},
        "policy": {"name": policy},
        "stats": {"steady": steady},
    }
    path = root / "quick" / scenario / policy / f"seed-{seed}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(summary))


def test_tables_list_ours_first_with_spreads_and_skip_scenarios_without_objectives(tmp_path: Path) -> None:
    for seed, (slo, off) in zip((1, 2, 3), ((0.90, 0.99), (0.92, 0.98), (0.95, 0.97)), strict=True):
        _write(tmp_path, "slo-x", "oracle", seed, 0.99)
        _write(tmp_path, "slo-x", "epp-default", seed, off)
        _write(tmp_path, "slo-x", "epp-slo", seed, slo)
        _write(tmp_path, "plain", "epp-default", seed, None)
    _write(tmp_path, "slo-x", "epp-slo", 100, 0.0)  # a tuning seed: never reported
    table = slo_tables(tmp_path, "quick")
    assert "plain" not in table and "**slo-x**: slo-x fleet." in table
    rows = [line for line in table.splitlines() if line.startswith("| epp") or line.startswith("| oracle")]
    assert [r.split(" | ")[0] for r in rows] == ["| epp-slo", "| epp-default", "| oracle"]
    assert rows[0].startswith(
        "| epp-slo | 1,2,3 | 92.0 [90.0-95.0] | 82.0 [80.0-85.0] | 100.0 [100.0-100.0] "
    )
    assert "| 92.0 [90.0-95.0] |" in rows[0]  # goodput req/s
    assert "| 100 [50.0-150] |" in rows[0]  # TTFT P95 ms
    doc = tmp_path / "slo.md"
    render_doc(tmp_path, tmp_path / "none", "quick", doc)
    text = doc.read_text()
    assert "<!-- bench:slo-virtual:start -->" in text and "_No runs yet._" in text


def test_class_columns_follow_the_tags_the_runs_report(tmp_path: Path) -> None:
    for seed in (1, 2, 3):
        _write(tmp_path, "slo-y", "epp-slo", seed, 0.9)
        path = tmp_path / "quick" / "slo-y" / "epp-slo" / f"seed-{seed}.json"
        summary = json.loads(path.read_text())
        summary["stats"]["steady"]["by_tag"] = {
            "batch": {"slo_attainment": 1.0},
            "interactive": {"slo_attainment": 0.5},
        }
        path.write_text(json.dumps(summary))
    table = slo_tables(tmp_path, "quick")
    assert "| policy | seeds | SLO attainment % | interactive % | batch % | goodput req/s |" in table
    assert "| epp-slo | 1,2,3 | 90.0 [90.0-90.0] | 50.0 [50.0-50.0] | 100.0 [100.0-100.0] | 90.0" in table
