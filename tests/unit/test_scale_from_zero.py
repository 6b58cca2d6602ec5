"""Scale from zero (epp/requestcontrol/scale_from_zero.py): a request that finds no ready pod waits for one."""

from __future__ import annotations

import asyncio
import json

from prometheus_client import CollectorRegistry

from epp.datalayer.endpoint_records import Endpoint, Metrics
from epp.datalayer.pool import Pool
from epp.requestcontrol.context import EppContext
from epp.requestcontrol.processor import EppProcessor
from epp.requestcontrol.scale_from_zero import EmptyPoolHold
from epp.requestcontrol.telemetry import Telemetry
from epp.scheduling.weighted import WeightedScheduler
from extproc.errors import ErrorResponse
from extproc.headers import DESTINATION_HEADER
from extproc.stream import RequestRoute
from gateway.config import parse_config

A = "10.0.0.1:8000"
BODY = json.dumps({"model": "llama", "messages": [{"role": "user", "content": "hi"}]}).encode()


def make_ctx(wait_ms: int | None, *, discovered: bool = True) -> tuple[EppContext, EmptyPoolHold]:
    pool_config: dict[str, object] = {"name": "llama", "models": [{"name": "llama"}]}
    if wait_ms is not None:
        pool_config["scaleFromZero"] = {"maxWaitMs": wait_ms}
    config = parse_config({"pools": [pool_config], "admission": {"retryAfterSeconds": 7}})
    # discovered, never scraped; or no pod at all (a pool scaled to zero before discovery saw one)
    pool = Pool([Endpoint(A, frozenset({"llama"}), frozenset())] if discovered else [])
    hold = EmptyPoolHold(CollectorRegistry(), "llama")
    pool.capacity_hook = hold.signal
    ctx = EppContext(
        "llama", pool, WeightedScheduler(config.scheduler_profiles()), lambda: config, Telemetry("llama")
    )
    ctx.empty_pool = hold
    return ctx, hold


async def held(hold: EmptyPoolHold) -> None:
    """Until the request task has reached the wait (a few loop turns; bounded, never hangs)."""
    for _ in range(1000):
        if hold.waiting:
            return
        await asyncio.sleep(0)
    raise AssertionError("the request never waited")


async def test_a_held_request_is_routed_when_the_first_pod_answers_its_scrape() -> None:
    ctx, hold = make_ctx(9_000)
    task = asyncio.create_task(EppProcessor(ctx).on_request({}, BODY))
    await held(hold)
    assert not task.done() and ctx.pool.inflight_total() == 0
    ctx.pool.record_metrics(A, Metrics(scraped_at=ctx.pool.snapshot().taken_at))  # the pod is up
    route = await asyncio.wait_for(task, 5)
    assert isinstance(route, RequestRoute) and route.set_headers[DESTINATION_HEADER] == A
    assert hold.waiting == 0 and ctx.pool.inflight_total() == 1


async def test_no_pod_within_the_wait_is_a_503_with_retry_after() -> None:
    ctx, hold = make_ctx(50)
    refusal = await EppProcessor(ctx).on_request({}, BODY)
    assert isinstance(refusal, ErrorResponse)
    assert refusal.status == 503 and refusal.code == "no_endpoint_available"
    assert refusal.headers == {"retry-after": "7"} and "scaling from zero" in refusal.message
    assert hold.waiting == 0 and ctx.pool.inflight_total() == 0


async def test_without_scale_from_zero_nothing_waits() -> None:
    ctx, hold = make_ctx(None)
    route = await EppProcessor(ctx).on_request({}, BODY)  # an unscraped pod is still tried
    assert isinstance(route, RequestRoute) and hold.waiting == 0


async def test_a_client_that_leaves_while_held_holds_nothing() -> None:
    ctx, hold = make_ctx(9_000)
    task = asyncio.create_task(EppProcessor(ctx).on_request({}, BODY))
    await held(hold)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert hold.waiting == 0 and ctx.pool.inflight_total() == 0


async def test_a_scrape_that_leaves_the_pool_unready_keeps_the_request_waiting() -> None:
    ctx, hold = make_ctx(9_000)
    task = asyncio.create_task(EppProcessor(ctx).on_request({}, BODY))
    await held(hold)
    hold.signal()  # a completion elsewhere: the pool is looked at, still no ready pod
    for _ in range(5):
        await asyncio.sleep(0)
    assert not task.done() and hold.waiting == 1
    ctx.pool.record_metrics(A, Metrics(scraped_at=ctx.pool.snapshot().taken_at))
    assert isinstance(await asyncio.wait_for(task, 5), RequestRoute)


async def test_with_no_pod_discovered_the_request_waits_for_discovery_and_a_first_scrape() -> None:
    ctx, hold = make_ctx(9_000, discovered=False)
    task = asyncio.create_task(EppProcessor(ctx).on_request({}, BODY))
    await held(hold)
    ctx.pool.set_endpoints([Endpoint(A, frozenset({"llama"}), frozenset())])  # discovered, not yet up
    hold.signal()
    for _ in range(5):
        await asyncio.sleep(0)
    assert not task.done() and hold.waiting == 1 and ctx.pool.inflight_total() == 0
    ctx.pool.record_metrics(A, Metrics(scraped_at=ctx.pool.snapshot().taken_at))
    route = await asyncio.wait_for(task, 5)
    assert isinstance(route, RequestRoute) and route.set_headers[DESTINATION_HEADER] == A
    assert hold.waiting == 0 and ctx.pool.inflight_total() == 1


async def test_with_no_pod_discovered_and_none_within_the_wait_it_is_a_503_with_retry_after() -> None:
    ctx, hold = make_ctx(50, discovered=False)
    refusal = await EppProcessor(ctx).on_request({}, BODY)
    assert isinstance(refusal, ErrorResponse) and refusal.status == 503
    assert refusal.code == "no_endpoint_available" and refusal.headers == {"retry-after": "7"}
    assert hold.waiting == 0 and ctx.pool.inflight_total() == 0


async def test_without_scale_from_zero_an_empty_pool_is_a_503_at_once() -> None:
    ctx, hold = make_ctx(None, discovered=False)
    refusal = await EppProcessor(ctx).on_request({}, BODY)
    assert isinstance(refusal, ErrorResponse) and refusal.status == 503 and hold.waiting == 0


def _value(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, {"inference_pool": "llama", **labels})


async def test_the_hold_shows_each_waiter_and_counts_how_each_wait_ended() -> None:
    """The activation gauge counts every request waiting (an autoscaler reads it by name), and
    `gateway_scale_from_zero_holds` each wait's end: served, timeout, cancelled."""
    registry = CollectorRegistry()
    hold = EmptyPoolHold(registry, "llama")
    ready = False
    waiters = [asyncio.create_task(hold.wait(lambda: ready, 30.0)) for _ in range(2)]
    late = asyncio.create_task(hold.wait(lambda: False, 30.0))
    for _ in range(1000):  # a few loop turns until all three wait (bounded, never hangs)
        if hold.waiting == 3:
            break
        await asyncio.sleep(0)
    assert _value(registry, "gateway_pool_requests_waiting_for_endpoints") == 3
    # The client leaves before the pod comes (the same loop turn as a signal: the last test).
    late.cancel()
    await asyncio.gather(late, return_exceptions=True)
    ready = True
    hold.signal()
    assert await asyncio.gather(*waiters) == [True, True]
    assert await hold.wait(lambda: False, 0.01) is False
    assert _value(registry, "gateway_pool_requests_waiting_for_endpoints") == 0
    holds = "gateway_scale_from_zero_holds_total"
    assert _value(registry, holds, outcome="served") == 2
    assert _value(registry, holds, outcome="cancelled") == 1
    assert _value(registry, holds, outcome="timeout") == 1


async def test_a_ready_pool_is_not_a_wait() -> None:
    registry = CollectorRegistry()
    hold = EmptyPoolHold(registry, "llama")
    assert await hold.wait(lambda: True, 5.0) is True
    assert _value(registry, "gateway_scale_from_zero_holds_total", outcome="served") == 0


async def test_the_wait_lasts_until_its_deadline_on_the_holds_clock() -> None:
    """A wait ends at `max_wait_s` by the hold's clock, not before: with the clock standing
    still half a second short of the deadline, the request is still held, then served."""
    hold = EmptyPoolHold(CollectorRegistry(), "llama")
    hold.clock = lambda: 100.0
    ready = False
    task = asyncio.create_task(hold.wait(lambda: ready, 0.5))
    await held(hold)
    for _ in range(5):
        await asyncio.sleep(0)
    assert not task.done()
    ready = True
    hold.signal()
    assert await asyncio.wait_for(task, 5) is True


async def test_a_client_that_leaves_as_a_pod_comes_holds_nothing() -> None:
    """Cancelled in the same loop turn as a signal: the wait ends cancelled at once (Python
    3.11's wait_for returns the event's result and drops the cancel; the hold re-raises it)
    rather than holding a gone client's request to its deadline."""
    registry = CollectorRegistry()
    hold = EmptyPoolHold(registry, "llama")
    late = asyncio.create_task(hold.wait(lambda: False, 30.0))
    await held(hold)
    late.cancel()
    hold.signal()
    done, _ = await asyncio.wait([late], timeout=10)  # a hang guard: the bug held it 30 s
    assert late in done and late.cancelled()
    assert hold.waiting == 0
    assert _value(registry, "gateway_scale_from_zero_holds_total", outcome="cancelled") == 1
