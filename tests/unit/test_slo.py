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
from epp.scheduling.slo import slo_order
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


def make_ctx(trusted: bool = True) -> EppContext:
    config = parse_config(
        {
            "pools": [{"name": "llama", "models": [{"name": "llama", "objectives": ["batch"]}]}],
            "profiles": {"batch": {"weights": {"predicted-ttft": 1}, "priority": -1, "sloTtftMs": 1}},
            "listener": {"trust": {"internal": trusted}},
            "admission": {"retryAfterSeconds": 4},
        }
    )
    pool = Pool([Endpoint(a, frozenset({"llama"}), frozenset()) for a in (FAST, SLOW)])
    now = pool.snapshot().taken_at
    pool.record_metrics(FAST, Metrics(waiting=0.0, running=1.0, kv_usage=0.1, scraped_at=now))
    pool.record_metrics(SLOW, Metrics(waiting=2.0, running=4.0, kv_usage=0.3, scraped_at=now))
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
