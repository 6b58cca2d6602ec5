"""The targets table: hit/missed decided from the runs' own TTFT percentiles."""

from __future__ import annotations

from bench.loadgen import RequestResult
from bench.report import PolicyRun
from bench.scorecard import check_scenario, render_scorecard
from bench.stats import summarize


def _run(scenario: str, policy: str, ttft_s: float) -> PolicyRun:
    results = [
        RequestResult(i, "t", i * 0.1, ttft_s=ttft_s, e2e_s=ttft_s + 1, output_tokens=10, status=200)
        for i in range(50)
    ]
    return PolicyRun(scenario, policy, "quick", results, wall_s=5.0)


def _summaries(**ttft: float) -> dict[str, object]:
    return {name.replace("_", "-"): summarize(_run("x", name, t).results) for name, t in ttft.items()}


def test_mixed_gpu_hit_and_miss_follow_the_cut() -> None:
    hit = check_scenario("mixed-gpu", _summaries(round_robin=10.0, epp_best=0.2))  # type: ignore[arg-type]
    assert hit[0][2] is True and "-98.0 %" in hit[0][1]
    miss = check_scenario("mixed-gpu", _summaries(round_robin=10.0, epp_best=0.5))  # type: ignore[arg-type]
    assert miss[0][2] is False


def test_uniform_is_a_band_and_peers_and_oracle_are_checked() -> None:
    rows = check_scenario(
        "uniform",
        {
            "round-robin": summarize(_run("u", "round-robin", 1.0).results),
            "epp-best": summarize(_run("u", "epp-best", 1.04).results),
            "sglang-cache_aware": summarize(_run("u", "s", 1.02).results),
            "oracle": summarize(_run("u", "oracle", 1.0).results),
        },
    )
    by_what = {what: hit for what, _, hit in rows}
    assert by_what["TTFT P95 vs round-robin"] is True  # +4 % is inside +-5 %
    assert by_what["TTFT P95 below every peer"] is False  # the peer is faster
    assert by_what["TTFT P95 within 10 % of the oracle"] is True


def test_missing_runs_render_as_not_applicable() -> None:
    text = render_scorecard({"bursty": {"round-robin": _run("bursty", "round-robin", 1.0)}})
    assert "run missing | n/a" in text and "**missed**" not in text
