"""Latency objectives (epp/scheduling/slo.py and their use in the EPP): pods that meet the
objective keep the profile's order, a request no pod can serve in time gets the least-bad pod
or, when sheddable, a 429; only trusted callers may set an objective by header."""

from __future__ import annotations

import json

import pytest

from epp.datalayer.endpoint_records import Endpoint, Metrics
from epp.datalayer.pool import Pool
from epp.requestcontrol.context import EppContext
from epp.requestcontrol.header_policy import HeaderPolicy
from epp.requestcontrol.processor import EppProcessor
from epp.requestcontrol.telemetry import Telemetry
from epp.scheduling.request import parse_request
from epp.scheduling.scorers import ScoringContext
from epp.scheduling.slo import slo_order
from epp.scheduling.ttft_prediction import predict_ttft
from epp.scheduling.weighted import WeightedScheduler
from extproc.errors import ErrorResponse
from extproc.headers import DESTINATION_HEADER, OBJECTIVE_HEADER, SLO_TTFT_HEADER
from extproc.stream import RequestRoute
from gateway.config import parse_config

FAST, SLOW = "10.0.0.1:8000", "10.0.0.2:8000"
BODY = json.dumps({"model": "llama", "messages": [{"role": "user", "content": "hi " * 200}]}).encode()


def test_pods_that_meet_keep_the_profiles_order_and_missed_ones_go_least_bad_first() -> None:
    preds = [0.05, 0.40, None, 0.20]
    assert slo_order([0, 1, 2, 3], preds, 1.0) == ([0, 1, 3, 2], True)  # all meet: the ranking
    assert slo_order([1, 0, 2, 3], preds, 0.25) == ([0, 3, 1, 2], True)  # the best that meets
    assert slo_order([1, 0, 2, 3], preds, 0.01) == ([0, 3, 1, 2], False)  # none meets: least bad
    assert slo_order([2], preds, 1.0) == ([2], False)  # nothing predicted: nothing promised


def test_a_prediction_exactly_at_the_objective_meets_it() -> None:
    assert slo_order([0, 1], [0.2, 0.1], 0.2) == ([0, 1], True)  # each pod listed once


def make_ctx(trusted: bool = True) -> EppContext:
    config = parse_config(
        {
            "pools": [
                {"name": "llama", "models": [{"name": "llama", "objectives": ["batch", "loose", "kv"]}]}
            ],
            "profiles": {
                "batch": {"weights": {"predicted-ttft": 1}, "priority": -1, "sloTtftMs": 1},
                # sheddable, with an objective every pod meets: only a tighter header sheds it
                "loose": {"weights": {"predicted-ttft": 1}, "priority": -1, "sloTtftMs": 600_000},
                # ranks the pod with the most free KV first: SLOW (kv 0.0), predicted late
                "kv": {"weights": {"kv-cache": 1}, "thresholds": {"queue": 50}},
            },
            "listener": {"trust": {"internal": trusted}},
            "admission": {"retryAfterSeconds": 4},
        }
    )
    pool = Pool([Endpoint(a, frozenset({"llama"}), frozenset()) for a in (FAST, SLOW)])
    now = pool.snapshot().taken_at
    pool.record_metrics(FAST, Metrics(waiting=0.0, running=1.0, kv_usage=0.5, scraped_at=now))
    pool.record_metrics(SLOW, Metrics(waiting=20.0, running=4.0, kv_usage=0.0, scraped_at=now))
    ctx = EppContext(
        "llama", pool, WeightedScheduler(config.scheduler_profiles()), lambda: config, Telemetry("llama")
    )
    ctx.header_policy = HeaderPolicy.from_config(config)
    return ctx


async def route(ctx: EppContext, headers: dict[str, str]) -> RequestRoute | ErrorResponse:
    return await EppProcessor(ctx).on_request(headers, BODY)


async def test_without_an_objective_the_ranking_stands() -> None:
    out = await route(make_ctx(), {})
    assert isinstance(out, RequestRoute) and out.set_headers[DESTINATION_HEADER] == FAST


async def test_a_loose_objective_keeps_the_profiles_pick() -> None:
    out = await route(make_ctx(), {SLO_TTFT_HEADER: "600000"})
    assert isinstance(out, RequestRoute) and out.set_headers[DESTINATION_HEADER] == FAST


async def test_an_objective_no_pod_meets_takes_the_least_bad_pod() -> None:
    out = await route(make_ctx(), {SLO_TTFT_HEADER: "1"})
    assert isinstance(out, RequestRoute) and out.set_headers[DESTINATION_HEADER] == FAST


async def test_a_sheddable_request_no_pod_can_serve_in_time_gets_429() -> None:
    ctx = make_ctx()
    out = await route(ctx, {OBJECTIVE_HEADER: "batch"})  # the profile's own 1 ms objective
    assert isinstance(out, ErrorResponse)
    assert (out.status, out.code, out.headers) == (429, "slo_unattainable", {"retry-after": "4"})
    assert ctx.pool.inflight_total() == 0


async def test_an_untrusted_callers_objective_header_is_ignored() -> None:
    out = await route(make_ctx(trusted=False), {SLO_TTFT_HEADER: "600000"})
    assert isinstance(out, RequestRoute) and out.set_headers[DESTINATION_HEADER] == FAST


@pytest.mark.parametrize("value", ["abc", "0", "-5", "600001", "1.5"])
async def test_a_malformed_objective_from_a_trusted_caller_is_a_400(value: str) -> None:
    out = await route(make_ctx(), {SLO_TTFT_HEADER: value})
    assert isinstance(out, ErrorResponse) and (out.status, out.code) == (400, "invalid_slo")


async def test_an_untrusted_callers_tight_objective_does_not_shed_its_request() -> None:
    """The trust check bites: the same tight header sheds a trusted caller's sheddable request
    and leaves an untrusted caller's to its profile's own (loose) objective."""
    asked = {OBJECTIVE_HEADER: "loose", SLO_TTFT_HEADER: "1"}
    trusted = await route(make_ctx(trusted=True), asked)
    assert isinstance(trusted, ErrorResponse) and trusted.code == "slo_unattainable"
    untrusted = await route(make_ctx(trusted=False), asked)
    assert isinstance(untrusted, RequestRoute), untrusted
    assert untrusted.set_headers[DESTINATION_HEADER] == FAST


async def test_an_untrusted_callers_malformed_objective_is_ignored_not_a_400() -> None:
    out = await route(make_ctx(trusted=False), {SLO_TTFT_HEADER: "soon"})
    assert isinstance(out, RequestRoute) and out.set_headers[DESTINATION_HEADER] == FAST


def test_the_policy_gives_an_untrusted_caller_its_profiles_objective_not_its_header() -> None:
    policy = make_ctx(trusted=False).header_policy
    assert policy.slo_ttft_s({SLO_TTFT_HEADER: "5"}, "loose") == 600.0
    assert policy.slo_ttft_s({SLO_TTFT_HEADER: "5"}, "kv") is None
    assert make_ctx(trusted=True).header_policy.slo_ttft_s({SLO_TTFT_HEADER: "5"}, "loose") == 0.005


async def test_an_objective_moves_the_request_off_the_profiles_pick_when_that_pod_would_miss_it() -> None:
    """The ordering bites: the `kv` profile ranks SLOW first (free KV) though its 20 queued
    requests put it late; a trusted caller's objective that only FAST meets sends it to FAST,
    and the same request without one (or with one both meet) stays on SLOW."""
    kv = {OBJECTIVE_HEADER: "kv"}
    plain = await route(make_ctx(), kv)
    assert isinstance(plain, RequestRoute) and plain.set_headers[DESTINATION_HEADER] == SLOW
    loose = await route(make_ctx(), {**kv, SLO_TTFT_HEADER: "600000"})
    assert isinstance(loose, RequestRoute) and loose.set_headers[DESTINATION_HEADER] == SLOW
    ctx = make_ctx()
    decision_fast, decision_slow = _predicted(ctx)
    assert decision_fast < decision_slow
    between = str(int((decision_fast + decision_slow) / 2 * 1000))
    tight = await route(ctx, {**kv, SLO_TTFT_HEADER: between})
    assert isinstance(tight, RequestRoute) and tight.set_headers[DESTINATION_HEADER] == FAST
    assert ctx.pool.inflight_total() == 1  # charged once, to FAST


def _predicted(ctx: EppContext) -> tuple[float, float]:
    """FAST's and SLOW's predicted TTFT (s) for BODY under the `kv` profile."""
    request = parse_request(
        json.loads(BODY), request_id="probe", target_model="llama", adapter=None, headers={}, objective="kv"
    )
    snapshot = ctx.pool.snapshot()
    candidates = list(snapshot.endpoints)
    preds = predict_ttft(
        request, candidates, ScoringContext(addresses=[s.endpoint.address for s in candidates])
    )
    by = {s.endpoint.address: p.total_s for s, p in zip(candidates, preds, strict=True) if p is not None}
    return by[FAST], by[SLOW]
