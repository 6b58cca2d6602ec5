"""The `predicted-ttft` scorer: queue wait + uncached prefill at the pod's pace + adapter load +
KV-admission wait, scored min(pred) / pred_i."""

from __future__ import annotations

import dataclasses

import pytest

from epp.datalayer.adapter_residency import AdapterResidency
from epp.datalayer.endpoint_records import Endpoint, EndpointState, Metrics
from epp.datalayer.prefix_index import PrefixIndex, prompt_hashes
from epp.scheduling.scorers import ScoringContext
from epp.scheduling.ttft_prediction import DEFAULT_TPOT_S, predicted_ttft
from epp.scheduling.weighted import WeightedScheduler
from gateway.profiles import BUILTIN_PROFILES, profile

from .factories import req, snap, state

PREDICTED = BUILTIN_PROFILES["predicted"]
CTX = ScoringContext()
# The per-request adapter terms, without adapter placement (`adapterPlacement: false`).
GREEDY = profile("greedy", {"predicted-ttft": 1}, thresholds={"adapterPlacement": False}).thresholds
PROMPT = "y" * 1600  # 400 estimated tokens, 25 blocks of 64 characters


def pod(
    address: str,
    pace: float | None,
    *,
    typical: float | None = None,
    uncached: float | None = None,
    **kw: object,
) -> EndpointState:
    return dataclasses.replace(
        state(address, **kw),  # type: ignore[arg-type]
        prefill_tps=pace,
        mean_prompt_tokens=typical,
        uncached_fraction=uncached,
    )


def test_a_fast_idle_pod_beats_a_slow_idle_one_by_their_pace_ratio() -> None:
    pods = [pod("h100", 20_000.0), pod("a10g", 2_000.0)]
    assert predicted_ttft(req(PROMPT), pods, CTX) == [1.0, pytest.approx(0.1)]


def test_a_slow_idle_pod_beats_a_fast_one_whose_queue_takes_longer_than_its_prefill() -> None:
    # a10g idle: 400 / 2,000 = 0.2 s. h100 with 30 queued 400-token prompts: 12,400 / 20,000 = 0.62 s.
    long_queue = [pod("h100", 20_000.0, waiting=30, typical=400.0), pod("a10g", 2_000.0)]
    assert predicted_ttft(req(PROMPT), long_queue, CTX) == [pytest.approx(0.2 / 0.62), 1.0]
    # Three queued: 1,600 / 20,000 = 0.08 s, still ahead of the idle A10G.
    short_queue = [pod("h100", 20_000.0, waiting=3, typical=400.0), pod("a10g", 2_000.0)]
    assert predicted_ttft(req(PROMPT), short_queue, CTX) == [1.0, pytest.approx(0.08 / 0.2)]


def test_requests_routed_but_not_yet_scraped_count_as_queued() -> None:
    """A burst between two scrapes: the scraped queue is still empty, the in-flight is not."""
    burst = [pod("h100", 20_000.0, inflight=30, tokens=30 * 500, typical=400.0), pod("a10g", 2_000.0)]
    assert predicted_ttft(req(PROMPT), burst, CTX)[1] == 1.0


def test_the_queue_counts_only_the_share_its_prefix_cache_does_not_hold() -> None:
    pods = [pod("a", 10_000.0, waiting=10, typical=400.0, uncached=0.25), pod("b", 10_000.0, waiting=10)]
    # a: 10 x 400 x 0.25 + 400 = 1,400 tokens; b: 10 x 400 (this prompt's length) + 400 = 4,400.
    assert predicted_ttft(req(PROMPT), pods, CTX) == [1.0, pytest.approx(1400 / 4400)]


def test_a_cache_hit_cuts_the_pods_predicted_ttft() -> None:
    index = PrefixIndex()
    hashes = prompt_hashes("m", PROMPT)
    index.add("a", hashes[:20])  # 20 of 25 blocks: 320 of 400 tokens cached, 80 to prefill
    ctx = ScoringContext(prefix_hashes=hashes, prefix_index=index, addresses=["a", "b"])
    # Steps of 0.1 ms, so the token counts decide (a prefill takes at least one step).
    pods = [pod("a", 10_000.0, tpot=1e-4), pod("b", 10_000.0, tpot=1e-4)]
    assert predicted_ttft(req(PROMPT), pods, ctx) == [1.0, pytest.approx(80 / 400)]
    # A slower pod holding the whole prompt still prefills one token: it wins.
    index.add("c", hashes)
    ctx = ScoringContext(prefix_hashes=hashes, prefix_index=index, addresses=["b", "c"])
    slow_hit = [pod("b", 10_000.0, tpot=1e-4), pod("c", 1_000.0, tpot=1e-4)]
    assert predicted_ttft(req(PROMPT), slow_hit, ctx) == [pytest.approx(0.001 / 0.04), 1.0]


def test_a_non_resident_adapter_adds_its_load_time() -> None:
    request = req(PROMPT, adapter="sql")
    pods = [
        pod("resident", 10_000.0, running_adapters=("sql",), max_lora=2),
        pod("cold", 10_000.0, max_lora=2),
        pod("recent", 10_000.0, max_lora=2),
    ]
    residency = AdapterResidency()
    residency.on_routed("recent", "sql")
    residency.on_finished("recent", "sql")  # idle but still in its GPU slots (lora-affinity's model)
    ctx = ScoringContext(thresholds=GREEDY, residency=residency)
    # 400 / 10,000 = 0.04 s; + 0.2 s default adapterLoadMs when not resident.
    assert predicted_ttft(request, pods, ctx) == [1.0, pytest.approx(0.04 / 0.24), 1.0]
    # With adapter placement (the default) the cold pod's free slot is also priced: + 0.5 s
    # adapterSlotMs (tests/epp_scheduling/test_adapter_placement.py).
    placed = ScoringContext(residency=residency)
    assert predicted_ttft(request, pods, placed) == [1.0, pytest.approx(0.04 / 0.74), 1.0]


def test_a_pod_whose_kv_cache_cannot_admit_waits_for_a_running_request_to_end() -> None:
    roomy = pod("roomy", 10_000.0, kv=0.5, tpot=0.01)
    full = dataclasses.replace(roomy, endpoint=Endpoint("full", frozenset({"m"})))

    def kv(usage: float) -> Metrics:  # 1,000 blocks of 16 tokens
        return Metrics(kv_usage=usage, running=3, num_gpu_blocks=1000, block_size=16)

    roomy = dataclasses.replace(roomy, metrics=kv(0.5))
    full = dataclasses.replace(full, metrics=kv(0.98))  # 160 tokens free
    # full: 0.04 s + tpot 0.01 x 100 expected output tokens / (3 running + 1) = 0.29 s.
    assert predicted_ttft(req(PROMPT), [roomy, full], CTX) == [1.0, pytest.approx(0.04 / 0.29)]


def test_unknown_paces_take_the_median_of_known_ones_then_the_configured_default() -> None:
    pods = [pod("a", 4_000.0), pod("b", 20_000.0), pod("new", None)]
    assert predicted_ttft(req(PROMPT), pods, CTX) == [pytest.approx(0.2), 1.0, 1.0]
    th = profile("p", {"predicted-ttft": 1}, thresholds={"prefillTokensPerS": 100}).thresholds
    none_known = [pod("a", None), pod("b", None, waiting=1)]
    ctx = ScoringContext(thresholds=th)
    assert predicted_ttft(req(PROMPT), none_known, ctx) == [1.0, pytest.approx(4.0 / 8.0)]


def test_unknown_metrics_never_look_idle() -> None:
    never_scraped = pod("dark", 50_000.0, scraped=False)
    waiting_unknown = dataclasses.replace(pod("nan", 50_000.0), metrics=Metrics(waiting=float("nan")))
    busy = pod("busy", 2_000.0, waiting=4)
    assert waiting_unknown.queue is None
    assert predicted_ttft(req(PROMPT), [never_scraped, waiting_unknown, busy], CTX) == [0.0, 0.0, 1.0]
    assert predicted_ttft(req(PROMPT), [never_scraped], CTX) == [0.0]


def test_the_kv_wait_assumes_the_default_decode_pace_when_none_is_observed() -> None:
    full = dataclasses.replace(pod("full", 10_000.0), metrics=Metrics(kv_usage=1.0))
    roomy = pod("roomy", 10_000.0)
    expected = 0.04 / (0.04 + DEFAULT_TPOT_S * 100)
    assert predicted_ttft(req(PROMPT), [roomy, full], CTX) == [1.0, pytest.approx(expected)]


def test_predicted_profile_picks_the_fast_pod_until_its_queue_outweighs_the_slow_prefill() -> None:
    scheduler = WeightedScheduler({"predicted": PREDICTED}, default_profile="predicted")
    idle = snap(pod("h100", 20_000.0), pod("a10g", 2_000.0))
    assert scheduler.pick(req(PROMPT), idle).ranked[0] == "h100"
    # Ten queued on the H100: 4,400 / 20,000 = 0.22 s against the idle A10G's 0.2 s. (Ten is
    # over the default saturation threshold, which would filter the H100 out anyway: relaxed
    # here so the scorer alone decides.)
    queued = snap(
        pod("h100", 20_000.0, inflight=4, tokens=2000, typical=400.0, waiting=10), pod("a10g", 2_000.0)
    )
    relaxed = WeightedScheduler({"p": profile("p", PREDICTED.weights, thresholds={"queue": 100})}, "p")
    assert relaxed.pick(req(PROMPT), queued).ranked[0] == "a10g"


def test_an_adapter_that_finds_every_lora_slot_pinned_waits_for_a_whole_decode() -> None:
    # vLLM admits no request of an unloaded adapter while running adapters fill max_lora slots.
    request = req(PROMPT, adapter="sql")
    pods = [
        pod("room", 10_000.0, running_adapters=("a",), max_lora=2, tpot=0.01),
        pod("pinned", 10_000.0, running_adapters=("a", "b"), max_lora=2, tpot=0.01),
        pod("running-it", 10_000.0, running_adapters=("a", "sql"), max_lora=2, tpot=0.01),
    ]
    # room: 0.04 + 0.2 load = 0.24 s; pinned: 0.24 + 0.01 x 100 expected output tokens = 1.24 s,
    # plus another 0.2 load, since its full slots mean evicting an adapter that will load again;
    # running-it: 0.04 s (resident, and its slot is already counted).
    assert predicted_ttft(request, pods, CTX) == [
        pytest.approx(0.04 / 0.24),
        pytest.approx(0.04 / 1.44),
        1.0,
    ]


def test_pace_contrast_damps_the_pods_pace_differences_toward_their_median() -> None:
    pods = [pod("a", 4_000.0), pod("b", 16_000.0), pod("c", 8_000.0)]
    assert predicted_ttft(req(PROMPT), pods, CTX) == [pytest.approx(0.25), 1.0, pytest.approx(0.5)]
    th = profile("p", {"predicted-ttft": 1}, thresholds={"paceContrast": 0.5}).thresholds
    # median 8,000: a -> 8,000 x 0.5 ** 0.5, b -> 8,000 x 2 ** 0.5; c stays at the median.
    damped = predicted_ttft(req(PROMPT), pods, ScoringContext(thresholds=th))
    assert damped == [pytest.approx(0.5), 1.0, pytest.approx(0.5**0.5)]


def test_a_prefill_takes_at_least_one_engine_step_of_the_pod() -> None:
    # 40 tokens: 4 ms at 10,000 tokens/s, but each pod's next step bounds it: 20 ms on the pod
    # decoding a normal batch, 300 ms on the one whose steps carry a long prefill's chunks.
    short = "y" * 160
    pods = [pod("calm", 10_000.0, tpot=0.02), pod("chunking", 10_000.0, tpot=0.3)]
    assert predicted_ttft(req(short), pods, CTX) == [1.0, pytest.approx(0.02 / 0.3)]
    # A long prompt: its tokens outweigh the calm pod's step.
    assert predicted_ttft(req(PROMPT * 10), pods, CTX) == [1.0, pytest.approx(0.4 / 0.4)]


def test_pods_reporting_the_same_kv_cache_share_their_best_pace() -> None:
    # Twins (same blocks): one learned 40,000 tokens/s from long prompts, the other only saw
    # short ones (8,000, a lower bound). A third pod of another class keeps its own pace.
    def twin(address: str, pace: float, blocks: int) -> EndpointState:
        return pod(address, pace, tpot=1e-4, block_size=16, num_gpu_blocks=blocks)

    pods = [twin("long-seen", 40_000.0, 5000), twin("short-seen", 8_000.0, 5000), twin("other", 8_000.0, 900)]
    long_prompt = req(PROMPT * 10)  # 4,000 tokens
    assert predicted_ttft(long_prompt, pods, CTX) == [1.0, 1.0, pytest.approx(0.2)]
