import pytest

from epp.datalayer.prefix_index import PrefixIndex, prompt_hashes
from epp.scheduling.registry import SCORERS
from epp.scheduling.scorers import (
    ScoringContext,
    inflight,
    kv_cache,
    lora_affinity,
    observed_speed,
    prefix_cache,
    queue,
    queue_speed,
    running_requests,
)
from gateway.scheduling_params import Thresholds

from .factories import req, state

CTX = ScoringContext()


def test_every_registered_scorer_documents_its_formula_and_returns_unit_scores():
    pods = [state("a", waiting=1, kv=0.2), state("b", scraped=False)]
    for name, entry in SCORERS.items():
        assert entry.formula, name
        values = entry.score(req(), pods, CTX)
        assert len(values) == 2 and all(0.0 <= v <= 1.0 for v in values), name


def test_kv_cache_is_one_minus_usage_and_unknown_is_worst():
    pods = [state("a", kv=0.25), state("b", kv=1.0), state("c", scraped=False)]
    assert kv_cache(req(), pods, CTX) == [0.75, 0.0, 0.0]


def test_queue_is_min_max_normalised():
    pods = [state("a", waiting=2), state("b", waiting=10), state("c", waiting=6)]
    assert queue(req(), pods, CTX) == [1.0, 0.0, 0.5]


def test_queue_all_equal_scores_one_but_unknown_scores_zero():
    pods = [state("a", waiting=3), state("b", waiting=3), state("c", scraped=False)]
    assert queue(req(), pods, CTX) == [1.0, 1.0, 0.0]


def test_queue_counts_inflight_the_scrape_has_not_seen():
    # a: scrape says idle, but the EPP sent it 4 requests since; b: its 3 in-flight are
    # already visible as running, so they must not be counted twice.
    pods = [state("a", inflight=4), state("b", waiting=1, running=2, inflight=3)]
    assert queue(req(), pods, CTX) == [0.0, 1.0]


def test_running_requests_min_max():
    pods = [state("a", running=4), state("b", running=0), state("c", running=2)]
    assert running_requests(req(), pods, CTX) == [0.0, 1.0, 0.5]


@pytest.mark.parametrize(
    ("pod", "expected"),
    [
        (state("a", running_adapters=("x",), max_lora=2), 1.0),
        (state("a", running_adapters=("y",), max_lora=2), 0.8),
        (state("a", running_adapters=("y",), waiting_adapters=("x",), max_lora=2), 0.6),
        (state("a", running_adapters=("y", "z"), max_lora=2), 0.0),
        (state("a", running_adapters=("y",), max_lora=0), 0.8),
        (state("a", scraped=False), 0.0),
    ],
)
def test_lora_affinity_levels(pod, expected):
    assert lora_affinity(req(adapter="x"), [pod], CTX) == [expected]


def test_lora_affinity_neutral_for_base_model():
    pods = [state("a", running_adapters=("x",), max_lora=1), state("b")]
    assert lora_affinity(req(), pods, CTX) == [1.0, 1.0]


def test_prefix_score_is_matched_over_max_of_total_and_minimum():
    index = PrefixIndex()
    long_prompt = "d" * (64 * 40)
    hashes = prompt_hashes("m", long_prompt)
    index.add("a", hashes[:30])
    index.add("b", hashes)
    ctx = ScoringContext(thresholds=Thresholds(prefixMinBlocks=16), prefix_hashes=hashes, prefix_index=index)
    assert prefix_cache(req(long_prompt), [state("a"), state("b"), state("c")], ctx) == [30 / 40, 1.0, 0.0]

    short = prompt_hashes("m", "s" * 128)  # 2 blocks, fully cached on a
    index.add("a", short)
    ctx = ScoringContext(thresholds=Thresholds(prefixMinBlocks=16), prefix_hashes=short, prefix_index=index)
    assert prefix_cache(req("s" * 128), [state("a")], ctx) == [2 / 16]


def test_inflight_is_proportional_to_own_load():
    pods = [
        state("a", inflight=0, tokens=0),
        state("b", inflight=4, tokens=1000),
        state("c", inflight=2, tokens=250),
    ]
    assert inflight(req(), pods, CTX) == [1.0, 0.0, pytest.approx(1 - (0.5 + 0.25) / 2)]


def test_inflight_works_without_any_scrape():
    pods = [state("a", scraped=False, inflight=1, tokens=10), state("b", scraped=False)]
    assert inflight(req(), pods, CTX) == [0.0, 1.0]


def test_observed_speed_five_times_slower_scores_a_fifth():
    pods = [state("fast", ttft=0.1, tpot=0.01), state("slow", ttft=0.5, tpot=0.05)]
    assert observed_speed(req(max_tokens=100), pods, CTX) == [1.0, pytest.approx(0.2)]


def test_observed_speed_combines_load_and_speed():
    # slow pod idle (wait 1 x 5) beats a fast pod with 9 ahead (10 x 1)
    pods = [state("fast", ttft=1.0, inflight=9), state("slow", ttft=5.0)]
    assert observed_speed(req(max_tokens=None), pods, CTX) == [0.5, 1.0]


def test_observed_speed_unknown_pod_takes_median_not_best():
    pods = [state("a", ttft=1.0), state("b", ttft=3.0), state("c", ttft=2.0), state("new")]
    scores = observed_speed(req(max_tokens=None), pods, CTX)
    assert scores[3] == scores[2] == pytest.approx(0.5)


def test_queue_speed_busy_fast_pod_beats_idle_slow_pod_while_nothing_queues():
    # 40 running on the fast pod share its batch: it still starts a new request at once.
    pods = [state("fast", running=40, tpot=0.008), state("slow", tpot=0.035)]
    assert queue_speed(req(), pods, CTX) == [1.0, pytest.approx(0.008 / 0.035)]
    assert (
        observed_speed(
            req(),
            [state("fast", running=40, ttft=0.05, tpot=0.008), state("slow", ttft=0.1, tpot=0.035)],
            CTX,
        )[0]
        < 1.0
    )


def test_queue_speed_queue_tips_traffic_to_the_slow_pod():
    # 5 queued (2 scraped + 3 unseen in-flight) at 8 ms: 6 x 8 = 48 ms > 35 ms on the idle slow pod.
    pods = [state("fast", waiting=2, running=10, inflight=15, tpot=0.008), state("slow", tpot=0.035)]
    assert queue_speed(req(), pods, CTX) == [pytest.approx(0.035 / 0.048), 1.0]


def test_queue_speed_unknown_pace_takes_the_median():
    pods = [state("a", tpot=0.01), state("b", tpot=0.03), state("c", tpot=0.02), state("new", scraped=False)]
    scores = queue_speed(req(), pods, CTX)
    assert scores[3] == scores[2] == pytest.approx(0.5)


def test_kv_cache_scores_out_of_range_usage_as_unknown_and_clamps_rounding():
    assert kv_cache(req(), [state("a", kv=1.3), state("b", kv=-0.2)], CTX) == [0.0, 0.0]
    assert kv_cache(req(), [state("a", kv=1.004), state("b", kv=-0.004)], CTX) == [0.0, 1.0]
