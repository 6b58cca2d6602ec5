"""Headroom for tight objectives (epp/scheduling/slo.py): a request whose objective a slow pod
meets with margin goes to the slow pod and leaves the fast one to requests only it serves in
time; without an objective, with a tighter one, or from an untrusted caller, the profile's
pick stands."""

from __future__ import annotations

import json
import math

from epp.datalayer.endpoint_records import Endpoint, Metrics
from epp.datalayer.pool import Pool
from epp.requestcontrol.context import EppContext
from epp.requestcontrol.header_policy import HeaderPolicy
from epp.requestcontrol.processor import EppProcessor
from epp.requestcontrol.telemetry import Telemetry
from epp.scheduling.request import parse_request
from epp.scheduling.scorers import ScoringContext
from epp.scheduling.slo import HEADROOM_MARGIN, slo_order
from epp.scheduling.ttft_prediction import predict_ttft
from epp.scheduling.weighted import WeightedScheduler
from extproc.headers import DESTINATION_HEADER, SLO_TTFT_HEADER
from extproc.stream import RequestRoute
from gateway.config import parse_config

FAST, SLOW = "10.0.0.1:8000", "10.0.0.2:8000"  # an H100's and an A10G's prefill pace
BODY = json.dumps({"model": "llama", "messages": [{"role": "user", "content": "hi " * 200}]}).encode()


def make_ctx(trusted: bool = True, slow_tps: float = 2_000.0, slow_waiting: float = 0.0) -> EppContext:
    config = parse_config(
        {
            "pools": [{"name": "llama", "models": [{"name": "llama"}]}],
            "profiles": {"ttft": {"weights": {"predicted-ttft": 1}}},
            "defaultProfile": "ttft",
            "listener": {"trust": {"internal": trusted}},
        }
    )
    pool = Pool([Endpoint(a, frozenset({"llama"}), frozenset()) for a in (FAST, SLOW)])
    now = pool.snapshot().taken_at
    for address, tps, waiting in ((FAST, 20_000.0, 0.0), (SLOW, slow_tps, slow_waiting)):
        pool.record_metrics(address, Metrics(waiting=waiting, running=0.0, kv_usage=0.0, scraped_at=now))
        pool.observe_prefill(address, tokens_per_s=tps, uncached_fraction=1.0, mean_prompt_tokens=200.0)
    ctx = EppContext(
        "llama", pool, WeightedScheduler(config.scheduler_profiles()), lambda: config, Telemetry("llama")
    )
    ctx.header_policy = HeaderPolicy.from_config(config)
    return ctx


def predicted(ctx: EppContext) -> dict[str, float]:
    """Each pod's predicted TTFT (s) for BODY."""
    request = parse_request(
        json.loads(BODY), request_id="probe", target_model="llama", adapter=None, headers={}, objective="ttft"
    )
    candidates = list(ctx.pool.snapshot().endpoints)
    preds = predict_ttft(
        request, candidates, ScoringContext(addresses=[s.endpoint.address for s in candidates])
    )
    return {s.endpoint.address: p.total_s for s, p in zip(candidates, preds, strict=True) if p is not None}


async def destination(ctx: EppContext, headers: dict[str, str]) -> str:
    out = await EppProcessor(ctx).on_request(headers, BODY)
    assert isinstance(out, RequestRoute), out
    return out.set_headers[DESTINATION_HEADER]


def ms(seconds: float) -> str:
    return str(math.ceil(seconds * 1000))


async def test_an_objective_the_slow_pod_meets_with_margin_goes_to_the_slow_pod() -> None:
    pred = predicted(make_ctx())
    assert pred[FAST] < pred[SLOW]  # the profile ranks FAST first
    assert await destination(make_ctx(), {}) == FAST
    loose = ms(pred[SLOW] / HEADROOM_MARGIN * 1.5)
    assert await destination(make_ctx(), {SLO_TTFT_HEADER: loose}) == SLOW


async def test_an_objective_the_slow_pod_meets_without_margin_stays_on_the_fast_pod() -> None:
    pred = predicted(make_ctx())
    tight = ms(pred[SLOW] * 1.2)  # met on SLOW, but not within the margin
    assert await destination(make_ctx(), {SLO_TTFT_HEADER: tight}) == FAST


async def test_an_untrusted_callers_loose_objective_leaves_the_request_on_the_fast_pod() -> None:
    pred = predicted(make_ctx())
    loose = ms(pred[SLOW] / HEADROOM_MARGIN * 1.5)
    assert await destination(make_ctx(trusted=False), {SLO_TTFT_HEADER: loose}) == FAST


async def test_pods_of_one_speed_keep_the_profiles_order() -> None:
    def equal() -> EppContext:  # one speed, SLOW a request behind: nothing to keep free
        return make_ctx(slow_tps=20_000.0, slow_waiting=1.0)

    assert await destination(equal(), {}) == FAST
    assert await destination(equal(), {SLO_TTFT_HEADER: "600000"}) == FAST


def test_the_slow_class_goes_first_only_with_margin_and_a_faster_pod_beside_it() -> None:
    # pods 0, 1 fast (prefill 10 ms), 2, 3 slow (100 ms); predictions: 0 and 1 idle, 2 idle, 3 busy
    preds, prefill = [0.02, 0.03, 0.12, 0.9], [0.01, 0.01, 0.1, 0.1]
    assert slo_order([0, 1, 2, 3], preds, 1.0, prefill) == ([2, 0, 1, 3], True)  # 3 is not roomy
    assert slo_order([0, 1, 2, 3], preds, 0.2, prefill) == ([0, 1, 2, 3], True)  # 2 not roomy: order
    assert slo_order([0, 1, 2, 3], preds, 1.0) == ([0, 1, 2, 3], True)  # no speeds: no headroom step
    assert slo_order([1, 0], preds, 1.0, prefill) == ([1, 0], True)  # one speed: the profile's order
