"""Hostile metric values and snapshots: the parser and the scheduler never raise and never
let a non-finite or negative number through.

Pages are generated per dialect with NaN, +-Inf, huge, negative and out-of-range values and
odd label values (`max_lora="inf"`, `"1e400"`, `"-1"`, 5,000-digit integers, ...); snapshots
are built directly from records with any mix of missing, stale and non-finite fields.
"""

from __future__ import annotations

import json
import math
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from epp.admin import pool_json
from epp.datalayer.endpoint_records import (
    MAX_COUNT,
    MAX_SPEED_S,
    Endpoint,
    EndpointState,
    Metrics,
    PoolSnapshot,
    count_problem,
    fraction_problem,
)
from epp.datalayer.metric_dialects import DIALECTS, Rejection, parse_metrics
from epp.datalayer.metric_lines import MetricsParseError
from epp.datalayer.pool import Pool
from epp.datalayer.scrape import SpeedTracker, _ratio_totals, histogram
from epp.scheduling.registry import SCORER_NAMES, SCORERS
from epp.scheduling.request import InferenceRequest
from epp.scheduling.saturation import is_saturated
from epp.scheduling.scorers import ScoringContext
from epp.scheduling.weighted import WeightedScheduler
from gateway.profiles import BUILTIN_PROFILES, Profile, profile

from .factories import assert_ranked, req, snap

EXAMPLES = 300
HOSTILE = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
REASONS = {
    "non_finite",
    "negative",
    "too_large",
    "out_of_range",
    "not_a_number",
    "not_an_integer",
    "malformed",
}

# -- hostile values ---------------------------------------------------------------------------

hostile_floats = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0.0, -0.0, 1.0, 0.5, 1.005, -0.005, 1e12, 1e12 + 1e6, 1e300, -1e300, 5e-324, -1.0]),
    st.integers(0, 50).map(float),
)
_SPELLINGS = {math.inf: "+Inf", -math.inf: "-Inf"}


def prom(value: float) -> str:
    """A value as an exporter may print it (Prometheus spells NaN/Inf its own way)."""
    if math.isnan(value):
        return "NaN"
    return _SPELLINGS.get(value, repr(value))


value_text = st.one_of(hostile_floats.map(prom), st.sampled_from(["1e999", "-1e999", "nan", "inf", "-Inf"]))
label_value = st.one_of(
    st.sampled_from(
        ["inf", "-inf", "+Inf", "NaN", "1e400", "-1", "4", "4.0", "4.5", "None", "", " 8 ", "0x10"]
    ),
    st.integers(-(10**30), 10**30).map(str),
    st.just("9" * 5000),
    hostile_floats.map(repr),
    st.text(alphabet='ab1,."\\ ', max_size=8),
)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


@st.composite
def pages(draw: st.DrawFn) -> tuple[str, str, dict[str, list[str]]]:
    """(dialect, page text, {metric name: value texts}) for one hostile page."""
    dialect = draw(st.sampled_from(sorted(DIALECTS)))
    d = DIALECTS[dialect]
    lines: list[str] = ["# HELP noise x", "noise_total 1"]
    values: dict[str, list[str]] = {}
    names = [n for group in (d.waiting, d.running, d.kv_usage[:1], d.kv_tokens) for n in group]
    for name in names:
        for i in range(draw(st.integers(0, 3))):
            v = draw(value_text)
            values.setdefault(name, []).append(v)
            lines.append(f'{name}{{model_name="m{i}",engine="{i}"}} {v}')
    if d.lora_info:
        for _ in range(draw(st.integers(0, 2))):
            max_lora = _escape(draw(label_value))
            lines.append(
                f'{d.lora_info}{{max_lora="{max_lora}",running_lora_adapters="a,b",'
                f'waiting_lora_adapters=""}} {draw(value_text)}'
            )
    if d.cache_info and draw(st.booleans()):
        block, blocks = _escape(draw(label_value)), _escape(draw(label_value))
        lines.append(f'{d.cache_info}{{block_size="{block}",num_gpu_blocks="{blocks}"}} 1.0')
    for hist in ("time_to_first_token_seconds", "inter_token_latency_seconds"):
        prefix = dialect + ":" if dialect in ("vllm", "sglang") else dialect + "_"
        for suffix in ("_sum", "_count"):
            if draw(st.booleans()):
                lines.append(f'{prefix}{hist}{suffix}{{model_name="m"}} {draw(value_text)}')
    draw(st.randoms()).shuffle(lines)
    return dialect, "\n".join(lines) + "\n", values


def _sane_total(texts: list[str], fraction: bool) -> float | None:
    """What the parser must make of one field's series: the aggregate, or None if any is bad."""
    vals = [float(t) for t in texts]
    check = fraction_problem if fraction else count_problem
    if any(check(v) for v in vals):
        return None
    if fraction:
        return min(1.0, max(0.0, math.fsum(vals) / len(vals)))
    total = math.fsum(vals)
    return None if count_problem(total) else total


def _assert_sane(m: Metrics) -> None:
    for v in (m.waiting, m.running):
        assert v is None or (math.isfinite(v) and 0.0 <= v <= MAX_COUNT * 4)
    assert m.kv_usage is None or 0.0 <= m.kv_usage <= 1.0
    assert isinstance(m.max_lora, int) and 0 <= m.max_lora <= MAX_COUNT
    assert m.block_size is None or 0 < m.block_size <= MAX_COUNT
    assert m.num_gpu_blocks is None or 0 <= m.num_gpu_blocks <= MAX_COUNT


@HOSTILE
@given(page=pages())
def test_hostile_pages_parse_to_sane_metrics_or_a_parse_error(page):
    dialect, text, values = page
    d = DIALECTS[dialect]
    rejected: list[Rejection] = []
    try:
        m = parse_metrics(text, dialect, 1.0, rejected=rejected, kv_capacity_tokens=1000)
    except MetricsParseError:
        m = None
    assert {r.reason for r in rejected} <= REASONS
    want = {
        "waiting": _sane_total(values.get(d.waiting[0], []), False) if d.waiting[0] in values else None,
        "running": _sane_total(values.get(d.running[0], []), False) if d.running[0] in values else None,
    }
    if d.kv_usage and d.kv_usage[0] in values:
        want["kv_usage"] = _sane_total(values[d.kv_usage[0]], True)
    if m is None:  # only when no core field is usable
        assert all(v is None for v in want.values())
        return
    _assert_sane(m)
    assert (m.waiting, m.running) == (want["waiting"], want["running"])  # rejected = unknown, never 0
    if "kv_usage" in want:
        assert m.kv_usage == want["kv_usage"]
    present = {
        "waiting": d.waiting[0] in values,
        "running": d.running[0] in values,
        "kv_usage": "kv_usage" in want,
    }
    for field, v in want.items():
        if v is None and present[field]:  # on the page but unusable: reported, not silently dropped
            assert any(r.field == field for r in rejected), (field, rejected)
    # The speed histograms of the same page: no exception, no insane total.
    speed = SpeedTracker()
    for name in ("time_to_first_token_seconds", "inter_token_latency_seconds"):
        prefix = dialect + ":" if dialect in ("vllm", "sglang") else dialect + "_"
        totals = _ratio_totals(text, histogram(prefix + name), "ttft", rejected)
        if totals is not None:
            assert math.isfinite(totals.sum) and math.isfinite(totals.count)
            assert totals.sum >= 0 and totals.count >= 0
        mean = speed.mean_since_last(name, totals)
        assert mean is None or (math.isfinite(mean) and mean >= 0)


@pytest.mark.parametrize(
    ("label", "want", "reason"),
    [
        ('max_lora="inf"', 0, "non_finite"),
        ('max_lora="1e400"', 0, "non_finite"),
        ('max_lora="-1"', 0, "negative"),
        ('max_lora="2.5"', 0, "not_an_integer"),
        ('max_lora="lots"', 0, "not_a_number"),
        ('max_lora="1e13"', 0, "too_large"),
        ('max_lora="4.0"', 4, None),
    ],
)
def test_lora_label_values_that_are_not_counts_are_rejected(label, want, reason):
    rejected: list[Rejection] = []
    page = f'vllm:num_requests_waiting 1\nvllm:lora_requests_info{{{label},running_lora_adapters="a"}} 1\n'
    m = parse_metrics(page, "vllm", 0.0, rejected=rejected)
    assert m.max_lora == want and m.running_adapters == {"a"} and m.waiting == 1.0
    assert [(r.field, r.reason) for r in rejected] == ([("max_lora", reason)] if reason else [])


def test_vllm_num_gpu_blocks_none_is_unknown_not_an_error():
    page = 'vllm:num_requests_waiting 0\nvllm:cache_config_info{block_size="16",num_gpu_blocks="None"} 1\n'
    rejected: list[Rejection] = []
    m = parse_metrics(page, "vllm", 0.0, rejected=rejected)
    assert (m.block_size, m.num_gpu_blocks, rejected) == (16, None, [])


def test_a_page_whose_every_core_value_is_rejected_is_a_parse_error_with_the_reasons():
    rejected: list[Rejection] = []
    with pytest.raises(MetricsParseError, match="no usable vllm metrics"):
        parse_metrics(
            "vllm:num_requests_waiting NaN\nvllm:num_requests_running -Inf\n", "vllm", 0, rejected=rejected
        )
    assert [(r.field, r.reason) for r in rejected] == [("waiting", "non_finite"), ("running", "non_finite")]


# -- hostile snapshots ------------------------------------------------------------------------

any_float = st.one_of(st.none(), hostile_floats)
any_int = st.one_of(st.integers(-5, 40), st.integers(-(10**20), 10**20), st.just(10**400))


@st.composite
def endpoint_states(draw: st.DrawFn, i: int) -> EndpointState:
    metrics = None
    if draw(st.booleans()):
        metrics = Metrics(
            waiting=draw(any_float),
            running=draw(any_float),
            kv_usage=draw(any_float),
            running_adapters=frozenset(draw(st.sampled_from([(), ("x",), ("x", "y")]))),
            waiting_adapters=frozenset(draw(st.sampled_from([(), ("x",)]))),
            max_lora=draw(any_int),
            block_size=draw(st.one_of(st.none(), any_int)),
            num_gpu_blocks=draw(st.one_of(st.none(), any_int)),
            scraped_at=draw(hostile_floats),
        )
    return EndpointState(
        endpoint=Endpoint(
            f"10.0.0.{i}:8000",
            frozenset(draw(st.sampled_from([("m",), ("m", "n"), ("n",)]))),
            frozenset(draw(st.sampled_from([(), ("x",)]))),
        ),
        metrics=metrics,
        metrics_age=draw(st.one_of(hostile_floats, st.just(math.inf))),
        inflight_requests=draw(st.integers(-3, 10**6)),
        inflight_tokens=draw(st.one_of(st.integers(-3, 10**9), st.just(10**400))),
        ttft_ewma=draw(any_float),
        tpot_ewma=draw(any_float),
        prefill_tps=draw(any_float),
        uncached_fraction=draw(any_float),
        mean_prompt_tokens=draw(any_float),
        healthy=draw(st.booleans()),
    )


@st.composite
def snapshots(draw: st.DrawFn) -> PoolSnapshot:
    n = draw(st.integers(0, 6))
    return PoolSnapshot(
        endpoints=tuple(draw(endpoint_states(i)) for i in range(n)), taken_at=draw(hostile_floats)
    )


def _all_profiles(weights: list[float], picker: str) -> dict[str, Profile]:
    every = profile("every", dict(zip(SCORER_NAMES, weights, strict=True)), picker=picker)
    return {**BUILTIN_PROFILES, "every": every}


requests = st.builds(
    lambda prompt, adapter, objective, max_tokens: InferenceRequest(
        request_id="r",
        model=adapter or "m",
        target_model="m",
        adapter=adapter,
        prompt=prompt,
        prompt_tokens=len(prompt) // 4,
        max_tokens=max_tokens,
        objective=objective,
    ),
    prompt=st.sampled_from(["", "hi", "x" * 5000]),
    adapter=st.sampled_from([None, "x", "zz"]),
    objective=st.sampled_from([None, *sorted(BUILTIN_PROFILES), "every", "unknown"]),
    max_tokens=st.one_of(st.none(), st.integers(0, 10**6), st.just(10**400)),
)


def _finite_unit(values: list[float]) -> bool:
    return all(0.0 <= v <= 1.0 for v in values)  # False for NaN as well


@HOSTILE
@given(
    snapshot=snapshots(),
    request=requests,
    weights=st.lists(
        st.sampled_from([0.0, 0.5, 1.0, 3.0, 1e6]), min_size=len(SCORER_NAMES), max_size=len(SCORER_NAMES)
    ).map(lambda w: [*w[:-1], w[-1] or 1.0]),  # at least one weight > 0
    picker=st.sampled_from(["max", "weighted-random"]),
    seed=st.integers(0, 2**32),
)
def test_every_profile_picks_a_candidate_from_any_snapshot(snapshot, request, weights, picker, seed):
    sched = WeightedScheduler(_all_profiles(weights, picker), rng=random.Random(seed))
    serving = {
        s.address for s in snapshot.endpoints if s.endpoint.serves(request.target_model, request.adapter)
    }
    for state in snapshot.endpoints:  # the records themselves are sane whatever they were given
        assert state.metrics_age >= 0 and state.inflight_requests >= 0 and state.inflight_tokens >= 0
        for v in (state.ttft_ewma, state.tpot_ewma):
            assert v is None or 0 < v <= MAX_SPEED_S
        if state.metrics is not None:
            _assert_sane(state.metrics)
    decision = sched.pick(request, snapshot)
    if not serving:
        assert decision.ranked == () and decision.reason
    else:
        assert decision.ranked and set(decision.ranked) <= serving
        assert len(set(decision.ranked)) == len(decision.ranked)
        totals = [decision.scores[a]["total"] for a in decision.ranked]
        assert all(math.isfinite(t) and t >= 0 for t in totals)
        profile = sched.profile_for(request)
        assert_ranked(totals if profile.picker == "max" else totals[1:], profile.thresholds.tie_band)
        for row in decision.scores.values():
            assert _finite_unit([v for k, v in row.items() if k != "total"])
    candidates = list(snapshot.endpoints)
    ctx = ScoringContext(prefix_index=sched.prefix_index)
    for name, entry in SCORERS.items():
        values = entry.score(request, candidates, ctx)
        assert len(values) == len(candidates) and _finite_unit(values), name
    for state in candidates:
        assert state.queue is None or (math.isfinite(state.queue) and state.queue >= 0)
        assert isinstance(is_saturated(state), bool)
    json.dumps(pool_json(snapshot), allow_nan=False)  # /debug/pool stays valid JSON


def test_non_finite_speeds_no_longer_rank_a_pod_first():
    from .factories import state

    slow = state("slow", tpot=0.05, ttft=0.2)
    nan = state("nan", tpot=math.nan, ttft=math.nan)  # was clamped to 1e-6: "the fastest pod"
    inf = state("inf", tpot=math.inf)
    assert nan.tpot_ewma is None and inf.tpot_ewma is None
    sched = WeightedScheduler()
    for objective_name in ("chat",):
        d = sched.pick(req(objective=objective_name), snap(slow, nan, inf))
        assert d.scores["nan"]["observed-speed"] == d.scores["slow"]["observed-speed"]  # median, not best


def test_all_infinite_paces_do_not_raise():
    from .factories import state

    pods = [state(f"p{i}", tpot=math.inf, ttft=math.inf) for i in range(3)]
    queue_speed_only = profile("qs", {"queue-speed": 1.0, "observed-speed": 1.0})
    d = WeightedScheduler({"default": queue_speed_only}).pick(req(), snap(*pods))
    assert sorted(d.ranked) == ["p0", "p1", "p2"]


# -- pool boundary ------------------------------------------------------------------------------


@HOSTILE
@given(
    samples=st.lists(st.tuples(any_float, any_float, st.floats(0, 100)), max_size=20),
    half_life=st.sampled_from([0.1, 1.0, 10.0]),
)
def test_pool_speed_observations_never_poison_the_ewma(samples, half_life):
    pool = Pool([Endpoint("a:1", frozenset({"m"}))], speed_half_life_s=half_life)
    now = 0.0
    for ttft, tpot, dt in samples:
        now += dt
        pool.observe_speed("a:1", ttft=ttft, tpot=tpot, now=now)
        s = pool.snapshot(now).endpoints[0]
        for v in (s.ttft_ewma, s.tpot_ewma):
            assert v is None or 0 < v <= MAX_SPEED_S
