"""bench/micro/hot_path.py's reading of its rounds: the highest rate held and the report."""

from __future__ import annotations

import json
from pathlib import Path

from bench.micro.hot_path import highest_held, report


def step(rate: int, p99: float, achieved: float | None = None, errors: int = 0) -> dict[str, object]:
    return {
        "offered": rate,
        "achieved": rate if achieved is None else achieved,
        "errors": errors,
        "p50_ms": 3.0,
        "p99_ms": p99,
        "epp_cpu_ms": 1.0,
    }


def test_highest_held_stops_at_the_first_missed_step() -> None:
    direct = {"200": 2.0, "400": 2.0, "600": 2.0}
    # 400 misses on p99 added (12 - 2 >= 10): 600 holding again does not count.
    assert highest_held([step(200, 5.0), step(400, 12.0), step(600, 5.0)], direct) == 200
    assert highest_held([step(200, 5.0), step(400, 5.0, achieved=300)], direct) == 200
    assert highest_held([step(200, 5.0, errors=1)], direct) == 0


def cell(epp: float, received: float) -> dict[str, float]:
    return {"p50_ms": 4.0, "p99_ms": 9.0, "errors": 0, "epp_cpu_ms": epp, "envoy_cpu_ms": 1.0,
            "msgs_sent": 3.0, "msgs_received": received}  # fmt: skip


def test_report_gives_median_and_range_per_side(tmp_path: Path) -> None:
    paths = []
    for i, (before, after) in enumerate([(1.4, 1.0), (1.6, 1.2), (1.5, 0.9)]):
        round_ = {
            "load": [1.0, 2.0],
            "envoy_alone": {"1024": {"p50_ms": 1.0, "p99_ms": 2.0, "envoy_cpu_ms": 0.3}},
            "direct_p99_ms": {"200": 2.0},
            "base": {"sizes": {"1024": cell(before, 8.0)}, "steps": [step(200, 5.0)]},
            "this": {"sizes": {"1024": cell(after, 2.0)}, "steps": [step(200, 15.0)]},
        }
        paths.append(tmp_path / f"round-{i}.json")
        paths[-1].write_text(json.dumps(round_))
    text = report(paths)
    assert "| base | 1 KB | 1.50 [1.40-1.60] |" in text
    assert "| this | 1 KB | 1.00 [0.90-1.20] |" in text
    assert "/ 8.0 [8.0-8.0] |" in text and "/ 2.0 [2.0-2.0] |" in text  # messages received per request
    assert "| base | 200 [200-200] |" in text and "| this | 0 [0-0] |" in text  # p99 added 13 ms: not held
