"""The per-pod prefill pace: histogram deltas in, smoothed per-pod figures out."""

from __future__ import annotations

import asyncio
import math

import httpx
import pytest

from epp.datalayer.endpoint_records import Endpoint
from epp.datalayer.metric_lines import collect_samples
from epp.datalayer.pod_speeds import PACE_PEAK_HALF_LIVES, SPEED_EWMA_ALPHA, SPEED_EXPIRY_HALF_LIVES
from epp.datalayer.pool import Pool
from epp.datalayer.prefill_pace import PrefillTotals, PrefillTracker, prefill_metric_names, prefill_totals
from epp.datalayer.scrape import Scraper
from epp.scheduling.scorers import ScoringContext
from epp.scheduling.ttft_prediction import predicted_ttft
from modelsim.fleet import FleetSpec, run_fleet
from tests.epp_scheduling.factories import req


def test_pace_uncached_share_and_typical_prompt_come_from_the_interval_deltas() -> None:
    t = PrefillTracker()
    assert t.sample(PrefillTotals(10, 2.0, 4000, 3000)) is None  # first sight: no interval yet
    # 4 requests finished: 0.5 s of prefill, 2,000 prompt tokens of which 1,500 computed.
    s = t.sample(PrefillTotals(14, 2.5, 6000, 4500))
    assert s is not None
    assert s.tokens_per_s == pytest.approx(1500 / 0.5)
    assert s.uncached_fraction == pytest.approx(0.75)
    assert s.mean_prompt_tokens == pytest.approx(500)
    assert t.sample(PrefillTotals(14, 2.5, 6000, 4500)) is None  # nothing finished meanwhile
    assert t.sample(None) is None


def test_a_server_restart_rebaselines_without_a_sample() -> None:
    t = PrefillTracker()
    t.sample(PrefillTotals(100, 20.0, 50_000, 40_000))
    assert t.sample(PrefillTotals(2, 0.1, 800, 800)) is None  # counters began again from zero
    s = t.sample(PrefillTotals(3, 0.2, 1200, 1200))  # the next interval counts from the new base
    assert s is not None and s.tokens_per_s == pytest.approx(400 / 0.1)


def test_without_the_computed_tokens_histogram_prompt_tokens_stand_in() -> None:
    t = PrefillTracker()
    t.sample(PrefillTotals(1, 0.1, 100))
    s = t.sample(PrefillTotals(2, 0.2, 300))
    assert s is not None
    assert s.tokens_per_s == pytest.approx(2000) and s.uncached_fraction is None


def test_reads_are_due_once_per_interval() -> None:
    t = PrefillTracker(interval_s=1.0)
    assert t.due(0.0)
    t.sample(PrefillTotals(1, 0.1, 100), now=5.0)
    assert not t.due(5.5) and t.due(6.0)
    t.sample(None, now=6.0)  # a page without the series still waits an interval
    assert not t.due(6.9)


def test_zero_prefill_time_or_fully_cached_intervals_say_nothing() -> None:
    t = PrefillTracker()
    t.sample(PrefillTotals(1, 0.1, 100, 100))
    assert t.sample(PrefillTotals(2, 0.1, 200, 200)) is None  # no measurable time
    assert t.sample(PrefillTotals(3, 0.2, 300, 200)) is None  # every new token was cached


def test_totals_are_summed_over_series_and_absent_or_broken_pages_give_none() -> None:
    page = (
        "# TYPE vllm:request_prefill_time_seconds histogram\n"
        'vllm:request_prefill_time_seconds_sum{engine="0",model_name="m"} 1.5\n'
        'vllm:request_prefill_time_seconds_sum{engine="1",model_name="m"} 0.5\n'
        'vllm:request_prefill_time_seconds_count{engine="0",model_name="m"} 3\n'
        'vllm:request_prefill_time_seconds_count{engine="1",model_name="m"} 1\n'
        'vllm:request_prompt_tokens_sum{engine="0",model_name="m"} 900\n'
        'vllm:request_prompt_tokens_sum{engine="1",model_name="m"} 100\n'
    )
    names = prefill_metric_names("vllm")
    totals = prefill_totals(collect_samples(page, names, lenient=names), "vllm")
    assert totals == PrefillTotals(4, 2.0, 1000, None)
    assert prefill_totals(collect_samples(page, names, lenient=names), "sglang") is None
    broken = page.replace("0.5", "NaN")
    assert prefill_totals(collect_samples(broken, names, lenient=names), "vllm") is None
    assert prefill_totals({}, "vllm") is None


def test_the_pool_smooths_prefill_figures_and_forgets_them_like_the_speeds() -> None:
    pool = Pool([Endpoint("a:1", frozenset({"m"}))], speed_half_life_s=1.0)
    assert pool.snapshot(now=0.0).endpoints[0].prefill_tps is None  # nothing learned: unknown
    pool.observe_prefill("a:1", tokens_per_s=1000.0, uncached_fraction=0.5, mean_prompt_tokens=200.0, now=0.0)
    pool.observe_prefill(
        "a:1", tokens_per_s=2000.0, uncached_fraction=None, mean_prompt_tokens=400.0, now=0.0
    )
    pool.observe_prefill(
        "a:1", tokens_per_s=math.nan, uncached_fraction=2.0, mean_prompt_tokens=-1.0, now=0.0
    )
    s = pool.snapshot(now=0.0).endpoints[0]
    # The pace is the best recent sample; the other figures weigh the newest sample
    # SPEED_EWMA_ALPHA; None, NaN and out-of-range samples are ignored.
    assert s.prefill_tps == 2000.0
    assert s.uncached_fraction == 0.5
    assert s.mean_prompt_tokens == pytest.approx(200.0 + SPEED_EWMA_ALPHA * 200.0)
    later = pool.snapshot(now=SPEED_EXPIRY_HALF_LIVES * 1.0 + 0.01).endpoints[0]
    assert later.prefill_tps is None and later.mean_prompt_tokens is None


FLEET = {
    "time_scale": 20.0,
    "pods": [
        {"name": "fast", "model": "m", "profile": "h100-llama3.1-8b"},
        {"name": "slow", "model": "m", "profile": "a10g-llama3.1-8b"},
    ],
}


async def test_paces_learned_from_real_modelsim_pages_tell_an_h100_from_an_a10g() -> None:
    """Requests sent straight to each simulated pod; the scraper learns their prefill paces
    from the histograms on their real /metrics pages, and the scorer ranks the idle H100
    first by about the pace ratio (calibration: c_p 0.036 vs 0.36 ms per token)."""
    async with run_fleet(FleetSpec.from_dict(FLEET), host="127.0.0.1") as fleet:
        fast, slow = fleet.pod("fast"), fleet.pod("slow")
        pool = Pool([Endpoint(p.address, frozenset({"m"}), engine="vllm") for p in (fast, slow)])
        scraper = Scraper(pool, interval_s=0.02, timeout_s=0.5)
        scraper.sync()
        try:
            prompt = "the quick brown fox jumps over the lazy dog " * 60  # ~600 tokens
            # A request to each pod per round until both paces are learned: a pace needs a
            # read of the totals before some requests finish and one after (reads come
            # about once a second).
            async with httpx.AsyncClient(timeout=30) as client:
                for i in range(200):
                    if all(s.prefill_tps is not None for s in pool.snapshot().endpoints):
                        break
                    for pod in (fast, slow):
                        body = {"model": "m", "prompt": f"{i} {prompt}", "max_tokens": 2}
                        reply = await client.post(f"{pod.url}/v1/completions", json=body)
                        assert reply.status_code == 200
                    await asyncio.sleep(0.1)
            assert all(s.prefill_tps is not None for s in pool.snapshot().endpoints), "paces not learned"
            by = pool.snapshot().by_address()
            fast_tps, slow_tps = by[fast.address].prefill_tps, by[slow.address].prefill_tps
            assert fast_tps is not None and slow_tps is not None
            assert fast_tps > 4 * slow_tps, (fast_tps, slow_tps)
            assert by[fast.address].uncached_fraction == pytest.approx(1.0, abs=0.1)  # distinct prompts
            pods = [by[fast.address], by[slow.address]]
            scores = predicted_ttft(req("x" * 2400), pods, ScoringContext())
            assert scores[0] == 1.0 and scores[1] < 0.25
        finally:
            await scraper.stop()


def test_overlapping_prefills_are_timed_by_the_wall_clock_not_their_summed_spans() -> None:
    t = PrefillTracker()
    t.sample(PrefillTotals(0, 0.0, 0, 0), now=10.0)
    # A burst: 10 requests of 1,000 tokens prefilled together within one second, each
    # spanning 0.5 s: 5 s of summed prefill time. The pod did 10,000 tokens in <= 1 s.
    burst = t.sample(PrefillTotals(10, 5.0, 10_000, 10_000), now=11.0)
    assert burst is not None and burst.tokens_per_s == 10_000.0
    # One request alone, 0.1 s for 1,000 tokens: its own span is shorter than the interval.
    alone = t.sample(PrefillTotals(11, 5.1, 11_000, 11_000), now=12.0)
    assert alone is not None and alone.tokens_per_s == pytest.approx(10_000.0)


def test_the_pace_is_the_best_recent_sample_and_decays_so_a_slower_gpu_is_learned_again() -> None:
    pool = Pool([Endpoint("a:1", frozenset({"m"}))], speed_half_life_s=1.0)

    def observe(tps: float, now: float) -> float | None:
        pool.observe_prefill(
            "a:1", tokens_per_s=tps, uncached_fraction=None, mean_prompt_tokens=100.0, now=now
        )
        return pool.snapshot(now=now).endpoints[0].prefill_tps

    assert observe(12_000.0, 0.0) == 12_000.0  # a second of long prompts: the GPU's pace
    assert observe(4_000.0, 1.0) == pytest.approx(12_000.0 * 0.5 ** (1 / PACE_PEAK_HALF_LIVES))
    # Short prompts alone for a while: the peak halves every PACE_PEAK_HALF_LIVES half-lives.
    assert observe(4_000.0, 3.0) == pytest.approx(12_000.0 * 0.5 ** (3 / PACE_PEAK_HALF_LIVES))
    assert observe(4_000.0, 6.0) == 4_000.0  # decayed below the samples: they are the pace now
