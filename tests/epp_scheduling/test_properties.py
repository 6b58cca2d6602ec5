"""Property tests: the parser never crashes on arbitrary input, label values survive
prometheus_client's escaping, and every pick is a valid ranking with scores in [0, 1]."""

import copy
import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Gauge, generate_latest

from epp.datalayer.metric_dialects import DIALECTS, parse_metrics
from epp.datalayer.metric_lines import MetricsParseError
from epp.scheduling.registry import SCORERS
from epp.scheduling.scorers import ScoringContext
from epp.scheduling.weighted import WeightedScheduler
from gateway.profiles import BUILTIN_PROFILES

from .factories import assert_ranked, req, snap, state

FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FAST
@given(running=st.text(max_size=40), waiting=st.text(max_size=40), value=st.floats(0, 2e9))
def test_lora_label_values_round_trip_through_prometheus_client(running, waiting, value):
    registry = CollectorRegistry()
    Gauge("vllm:num_requests_waiting", "w", registry=registry).set(1)
    lora = Gauge("vllm:lora_requests_info", "l", ["max_lora", "running_lora_adapters", "waiting_lora_adapters"],
                 registry=registry)  # fmt: skip
    lora.labels("8", running, waiting).set(value)
    m = parse_metrics(generate_latest(registry), "vllm", 0.0)
    assert m.running_adapters == {a.strip() for a in running.split(",") if a.strip()}
    assert m.waiting_adapters == {a.strip() for a in waiting.split(",") if a.strip()}
    assert m.max_lora == 8


@FAST
@given(
    text=st.one_of(
        st.text(max_size=300),
        st.binary(max_size=300),
        st.lists(
            st.sampled_from(
                [
                    "vllm:num_requests_waiting",
                    "vllm:kv_cache_usage_perc",
                    "vllm:lora_requests_info",
                    "vllm:cache_config_info",
                    "sglang:token_usage",
                    "tgi_queue_size",
                    "{",
                    "}",
                    '"',
                    "\\",
                    "=",
                    ",",
                    " ",
                    "\n",
                    "1",
                    "NaN",
                    "-2.5e3",
                    "a",
                    'max_lora="',
                    "block_size=",
                ]
            ),
            max_size=40,
        ).map("".join),
    ),
    dialect=st.sampled_from(sorted(DIALECTS)),
)
def test_parser_returns_metrics_or_parse_error_never_crashes(text, dialect):
    try:
        m = parse_metrics(text, dialect, 1.0)
    except MetricsParseError:
        return
    assert all(v is None or 0 <= v for v in (m.waiting, m.running, m.kv_usage))
    assert m.kv_usage is None or m.kv_usage <= 1


pods_strategy = st.lists(
    st.builds(
        dict,
        waiting=st.integers(0, 30),
        running=st.integers(0, 60),
        kv=st.floats(0, 1),
        age=st.sampled_from([0.01, 0.5, 5.0]),
        scraped=st.booleans(),
        inflight=st.integers(0, 40),
        tokens=st.integers(0, 50_000),
        ttft=st.none() | st.floats(0.0, 10.0),
        tpot=st.none() | st.floats(0.0, 0.2),
        healthy=st.booleans(),
        running_adapters=st.sampled_from([(), ("x",), ("y", "z")]),
        max_lora=st.integers(0, 3),
    ),
    min_size=0,
    max_size=12,
)


@FAST
@given(
    pods=pods_strategy,
    profile=st.sampled_from(sorted(BUILTIN_PROFILES)),
    adapter=st.sampled_from([None, "x"]),
    seed=st.integers(0, 2**32),
)
def test_every_pick_is_a_valid_ranking(pods, profile, adapter, seed):
    states = [state(f"p{i}", **kw) for i, kw in enumerate(pods)]
    sched = WeightedScheduler(rng=random.Random(seed))
    r = req("w" * (seed % 3000), adapter=adapter, objective=profile)
    if states:
        sched.on_routed(r, states[seed % len(states)].address)
    before = [copy.copy(s) for s in states]
    d = sched.pick(r, snap(*states))
    # EndpointState is read-only by contract (plain slots for speed, not frozen): no filter,
    # scorer or picker writes it.
    assert states == before
    if not states:
        assert d.ranked == () and d.reason
        return
    # Unhealthy pods are skipped unless none is healthy; then all are kept (scrapes starved).
    healthy = {s.address for s in states if s.healthy} or {s.address for s in states}
    assert len(set(d.ranked)) == len(d.ranked) and set(d.ranked) <= healthy
    assert set(d.scores) == set(d.ranked)
    totals = [d.scores[a]["total"] for a in d.ranked]
    assert_ranked(totals, sched.profile_for(r).thresholds.tie_band)
    for row in d.scores.values():
        assert all(0.0 <= v <= 1.0 for k, v in row.items() if k != "total")
    ctx = ScoringContext(prefix_index=sched.prefix_index)
    for entry in SCORERS.values():
        assert all(0.0 <= v <= 1.0 for v in entry.score(r, states, ctx))
    assert states == before
