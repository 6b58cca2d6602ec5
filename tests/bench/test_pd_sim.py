"""bench/probes/pd_sim.py in a few simulated seconds: the P/D shape keeps long prefills off the decode
pods (no stalled decode steps), pinning a data-parallel rank keeps its prefix hits, and the
`epp-*` policies route with the EPP's own decision (`pick_disaggregated` for `epp-pd`)."""

from __future__ import annotations

import random

from bench.probes.engine_check import VirtualClock
from bench.probes.pd_sim import PROFILE, EppRouter, Scenario, Sim, Unit, prompt_ids, prompt_text, run
from bench.vtime.pods import address_for
from epp.scheduling.request import CHARS_PER_TOKEN
from modelsim.engine import Engine
from modelsim.profiles import get_profile

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


def _epp(disaggregated: bool) -> tuple[Sim, EppRouter]:
    clock, profile = VirtualClock(), get_profile(PROFILE)
    roles = ("prefill", "prefill", "decode", "decode") if disaggregated else ("both",) * 4
    units = [Unit(Engine(profile, clock, seed=p), p, role) for p, role in enumerate(roles)]
    sim = Sim(units, clock)
    router = EppRouter(sim, units, disaggregated=disaggregated, seed=1, until_s=1.0)
    sim.run(0.2)  # every pod scraped a few times
    return sim, router


def test_epp_pd_splits_a_long_uncached_prompt_and_keeps_a_short_one_on_its_decode_pod() -> None:
    _, router = _epp(disaggregated=True)
    vocab = get_profile(PROFILE).vocab_size
    rng = random.Random(1)
    decode, prefill, processor = router.decide(prompt_ids(rng, 8192, None, vocab), 256)
    assert decode.role == "decode"
    assert prefill is not None and prefill.role == "prefill"
    # both pods count the request in flight until the decode pod answers (the prefill's slot)
    assert router.app.pool.inflight(address_for(prefill.pod)) == 1
    processor.on_response_headers({":status": "200"})
    assert router.app.pool.inflight(address_for(prefill.pod)) == 0
    assert router.app.pool.inflight(address_for(decode.pod)) == 1

    decode, prefill, _ = router.decide(prompt_ids(rng, 256, None, vocab), 256)
    assert decode.role == "decode" and prefill is None  # under minUncachedTokens: aggregated


def test_epp_pd_stops_splitting_when_the_prefill_pods_queue_too_much() -> None:
    _, router = _epp(disaggregated=True)
    vocab = get_profile(PROFILE).vocab_size
    rng = random.Random(2)
    # No scrape in between: the EPP's own in-flight count is the prefill pods' queue.
    picks = [router.decide(prompt_ids(rng, 8192, None, vocab), 256) for _ in range(12)]
    prefills = [p.pod for _, p, _ in picks if p is not None]
    assert {prefills.count(pod) for pod in (0, 1)} == {5}  # maxPrefillQueue 4: a fifth waits, no sixth
    assert all(d.role == "decode" for d, _, _ in picks)


def test_epp_agg_routes_over_every_pod_and_never_splits() -> None:
    _, router = _epp(disaggregated=False)
    vocab = get_profile(PROFILE).vocab_size
    rng = random.Random(3)
    picks = [router.decide(prompt_ids(rng, 8192, None, vocab), 256) for _ in range(8)]
    assert all(p is None for _, p, _ in picks)
    assert {d.pod for d, _, _ in picks} == {0, 1, 2, 3}  # the in-flight picks spread them


def test_epp_pd_run_splits_the_long_prompts_only() -> None:
    result = run(MIXED, "epp-pd", 1)
    assert result["split_short"] == 0.0
    assert result["split_long"] > 0.9
    assert result["itl_max"] < 0.05  # no long prefill on a decode pod


def test_the_prompt_text_is_the_engines_token_count() -> None:
    assert len(prompt_text([0, 1, 128_255])) == 3 * CHARS_PER_TOKEN
    assert prompt_text([5, 6])[:CHARS_PER_TOKEN] == prompt_text([5, 7])[:CHARS_PER_TOKEN]
