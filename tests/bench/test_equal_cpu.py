"""The equal-CPU table: pinned runs beside shared-core runs, and runs whose harness fell behind flagged."""

from __future__ import annotations

from typing import Any

from bench.reports.equal_cpu import kept_up, render


def _run(
    seed: int, p50: float, p95: float, fleet_lag_ms: float = 1.0, send_lag_s: float = 0.005
) -> dict[str, Any]:
    return {
        "seed": seed,
        "run": {"fleet_lag": {"mean_lag_ms": fleet_lag_ms}},
        "stats": {"steady": {"ttft_p50": p50, "ttft_p95": p95, "lag_p99": send_lag_s}},
    }


def test_pinned_rows_sit_beside_shared_core_rows_and_compare_with_round_robin_pinned() -> None:
    runs = {
        "uniform": {
            "round-robin": [_run(1, 0.014, 0.031)],
            "round-robin-pinned": [_run(1, 0.016, 0.034)],
            "epp-default": [_run(1, 0.019, 0.036)],
            "epp-default-pinned": [_run(1, 0.020, 0.037)],
            "vllm-round_robin-pinned": [_run(1, 0.016, 0.034, fleet_lag_ms=11.0)],
        }
    }
    table = render(runs)
    assert table is not None
    rows = [line for line in table.splitlines() if line.startswith("| uniform")]
    assert [r.split(" | ")[1] for r in rows] == ["round-robin", "epp-default", "vllm-round_robin"]
    ours = rows[1]
    assert "19 ms" in ours and "20 ms" in ours and "(+25 %)" in ours  # 20 vs 16 ms pinned
    assert "not run" in rows[2] and "fell behind" in rows[2]
    assert "fell behind" not in ours


def test_a_run_kept_up_only_when_both_the_fleet_and_the_load_generator_did() -> None:
    assert kept_up([_run(1, 0.1, 0.2), _run(2, 0.1, 0.2)])
    assert not kept_up([_run(1, 0.1, 0.2), _run(2, 0.1, 0.2, fleet_lag_ms=10.9)])
    assert not kept_up([_run(1, 0.1, 0.2, send_lag_s=1.4)])


def test_no_pinned_run_no_table() -> None:
    assert render({"uniform": {"round-robin": [_run(1, 0.01, 0.03)]}}) is None
