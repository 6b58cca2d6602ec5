"""The A10G sensitivity table is rendered from summaries alone."""

from __future__ import annotations

from typing import Any

from bench.reports.sensitivity import render


def _run(seed: int, ttft_p95: float, a10g: float, ok: int = 90) -> dict[str, Any]:
    steady = {"requests": 100, "ok": ok, "ttft_p95": ttft_p95, "e2e_p95": 10 * ttft_p95,
              "pod_share": {"a10g-0": a10g / 2, "a10g-1": a10g / 2, "h100-0": 1 - a10g}}  # fmt: skip
    return {"seed": seed, "stats": {"steady": steady}}


def test_each_variant_row_shows_the_change_vs_round_robin_and_the_a10g_share() -> None:
    runs = {
        "mixed-gpu-a10g-fast": {
            "round-robin": [_run(1, 2.0, 0.5), _run(2, 4.0, 0.5), _run(3, 3.0, 0.5)],
            "epp-best": [_run(1, 0.3, 0.2, ok=100), _run(2, 0.3, 0.1, ok=100), _run(3, 0.3, 0.3, ok=100)],
        }
    }
    lines = render(runs).splitlines()
    assert lines[2].startswith(
        "| +30 % | round-robin | 1,2,3 | 90.0 % [90.0-90.0] | 3,000 ms [2,000-4,000] |"
    )
    assert lines[2].endswith("| 50.0 % [50.0-50.0] |")
    assert lines[3].startswith(
        "| +30 % | epp-best | 1,2,3 | 100.0 % [100.0-100.0] | 300 ms [300-300] (-90 %) |"
    )
    assert "20.0 % [10.0-30.0]" in lines[3]
    assert len(lines) == 4  # variants without summaries add no rows


def test_the_section_is_skipped_without_variant_summaries(tmp_path) -> None:
    from bench.reports.sensitivity import section_for

    assert section_for(str(tmp_path)) is None
