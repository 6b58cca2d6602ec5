"""A family's page table (bench/vtime/report.py family_table): every policy on the family's
scenarios, reporting seeds only, with per-pod KV use from the summaries' engines."""

from __future__ import annotations

import json
from pathlib import Path

from bench.harness.summary import SCHEMA
from bench.vtime.report import family_table


def _summary(root: Path, scenario: str, policy: str, seed: int, p95: float, kv: tuple[float, float]) -> None:
    data = {
        "schema": SCHEMA,
        "scenario": {"name": scenario},
        "policy": {"name": policy},
        "seed": seed,
        "run": {
            "engines": [
                {"pod": f"p-{i}", "prefix_hit_rate": 0.5, "preemptions": 1, "kv_usage_mean": k, "kv_usage_peak": k + 0.1}
                for i, k in enumerate(kv)
            ]
        },
        "stats": {"steady": {"requests": 90, "ttft_p50": 0.02, "ttft_p95": p95, "goodput": 1.0,
                             "pod_share": {"p-0": 0.75, "p-1": 0.25}}},
    }  # fmt: skip
    path = root / "quick" / scenario / policy / f"seed-{seed}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))


def test_family_table_lists_every_policy_of_the_family_on_reporting_seeds(tmp_path: Path) -> None:
    for seed, p95 in ((1, 0.5), (2, 0.7), (3, 0.6), (100, 9.0)):  # 100: a tuning seed, left out
        for policy in ("epp-default", "round-robin", "epp-gie"):
            _summary(tmp_path, "agentic-coding", policy, seed, p95, (0.2, 0.4))
    _summary(tmp_path, "uniform", "round-robin", 1, 0.1, (0.1, 0.1))
    table = family_table(tmp_path, "quick", "agentic-")
    rows = [line for line in table.splitlines()[2:]]
    assert [r.split(" | ")[1] for r in rows] == ["round-robin", "epp-default", "epp-gie"]
    assert all("| 1,2,3 |" in r and "| 600 [500-700] |" in r for r in rows)
    assert all(
        "| 20 / 40 |" in r and "| 50 |" in r and "| 75 / 25 |" in r for r in rows
    )  # KV mean, peak, shares
    assert "uniform" not in table
