"""Hold rather than thrash (issue #51): with flow control on, a long conversation whose home pod
(the one holding its KV) is saturated waits in the EPP's queue for that pod, rather than
recomputing its history elsewhere or joining the full pod; it is counted in
`inference_extension_held_for_home_total`, and routed home once a scrape shows room."""

from __future__ import annotations

import asyncio
import json
import random

from prometheus_client import CollectorRegistry

from epp.datalayer.endpoint_records import Endpoint, Metrics
from epp.datalayer.pool import Pool
from epp.requestcontrol.context import EppContext
from epp.requestcontrol.flow_control import FlowController
from epp.requestcontrol.processor import EppProcessor
from epp.requestcontrol.telemetry import Telemetry
from epp.scheduling.weighted import WeightedScheduler
from extproc.headers import DESTINATION_HEADER
from extproc.stream import RequestRoute
from gateway.config import parse_config
from tests.waiting import until

PODS = ["10.0.0.1:8000", "10.0.0.2:8000"]


def text(n: int, seed: int) -> str:
    rng = random.Random(seed)
    return "".join(rng.choice("abcdefghij ") for _ in range(n))


def body(prompt: str) -> bytes:
    return json.dumps({"model": "llama", "messages": [{"role": "user", "content": prompt}]}).encode()


def make_ctx(flow_on: bool) -> EppContext:
    config = parse_config(
        {"pools": [{"name": "llama", "models": [{"name": "llama"}]}], "flowControl": {"enabled": flow_on}}
    )
    pool = Pool([Endpoint(a, frozenset({"llama"}), frozenset()) for a in PODS])
    ctx = EppContext(
        "llama", pool, WeightedScheduler(config.scheduler_profiles()), lambda: config, Telemetry("llama")
    )
    ctx.flow = FlowController(CollectorRegistry(), config.flow_control, clock=pool.clock)
    pool.capacity_hook = ctx.flow.signal
    for address in PODS:
        scrape(ctx, address, 0.05)
    return ctx


def scrape(ctx: EppContext, address: str, kv: float) -> None:
    ctx.pool.record_metrics(
        address,
        Metrics(kv_usage=kv, block_size=16, num_gpu_blocks=16_000, scraped_at=ctx.pool.clock()),
    )


def held(ctx: EppContext) -> float:
    return ctx.telemetry.registry.get_sample_value("inference_extension_held_for_home_total") or 0.0


async def first_turn(ctx: EppContext, history: str) -> str:
    route = await EppProcessor(ctx).on_request({}, body(history))
    assert isinstance(route, RequestRoute)
    return route.set_headers[DESTINATION_HEADER]


async def test_a_turn_whose_home_is_saturated_waits_for_it_in_the_queue() -> None:
    ctx = make_ctx(flow_on=True)
    history = text(200_000, 1)
    home = await first_turn(ctx, history)
    scrape(ctx, home, 0.9)  # over the 0.8 KV threshold; the other pod is idle
    task = asyncio.create_task(EppProcessor(ctx).on_request({}, body(history + text(8_000, 2))))
    assert ctx.flow is not None
    await until(lambda: len(ctx.flow.queue) == 1, "the turn waits in the EPP's queue")  # type: ignore[union-attr]
    assert held(ctx) == 1 and not task.done()
    scrape(ctx, home, 0.3)  # room again: the scrape signals the queue
    route = await asyncio.wait_for(task, 5)
    assert isinstance(route, RequestRoute) and route.set_headers[DESTINATION_HEADER] == home
    assert len(ctx.flow.queue) == 0


async def test_without_flow_control_the_turn_goes_home_at_once() -> None:
    ctx = make_ctx(flow_on=False)
    history = text(200_000, 1)
    home = await first_turn(ctx, history)
    scrape(ctx, home, 0.9)
    route = await EppProcessor(ctx).on_request({}, body(history + text(8_000, 2)))
    assert isinstance(route, RequestRoute) and route.set_headers[DESTINATION_HEADER] == home
    assert held(ctx) == 0
