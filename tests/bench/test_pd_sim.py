"""bench/probes/pd_sim.py in a few simulated seconds: the P/D shape keeps long prefills off the decode
pods (no stalled decode steps), and pinning a data-parallel rank keeps its prefix hits."""

from __future__ import annotations

from bench.probes.pd_sim import Scenario, run

# The page's scenarios (docs/benchmarks/pd.md), 25 simulated seconds instead of 60.
MIXED = Scenario("t", 20.0, 25.0, ((0.2, 8192, 256, 0), (0.8, 256, 256, 0)), (), "")
PREFIX = Scenario("p", 12.0, 25.0, ((1.0, 3072, 128, 96),), (), "")


def test_disaggregation_removes_the_prefill_stalls_from_decoding() -> None:
    agg, pd = run(MIXED, "agg-least-ttft", 1), run(MIXED, "pd", 1)
    assert agg["requests"] == pd["requests"] > 0
    assert agg["itl_max"] > 0.25  # an 8,192-token prefill step (~296 ms) inside the decodes
    assert pd["itl_max"] < 0.05


def test_pinning_the_rank_beats_leaving_it_to_the_engine() -> None:
    aware, blind = run(PREFIX, "dp-rank-aware", 1), run(PREFIX, "dp-rank-blind", 1)
    assert aware["ttft_p50"] < 0.6 * blind["ttft_p50"]
