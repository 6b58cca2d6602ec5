"""The flow-control queue's order (pure logic) and the controller's lifecycle on one event loop."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable

import pytest
from prometheus_client import CollectorRegistry

from epp.requestcontrol.flow_control import ANONYMOUS, FlowController, Outcome, Ticket, tenant_of, ticket_for
from epp.requestcontrol.flow_queue import FlowQueue, Waiting, band_of
from epp.requestcontrol.header_policy import HeaderPolicy
from extproc.headers import CLAIM_HEADER, TENANT_CLAIM_HEADER
from gateway.config import FlowControlConfig
from tests.waiting import until

BIG = {"critical": 100, "standard": 100, "sheddable": 100}


def item(band: str, tenant: str, t: float, deadline: float | None = None, name: str = "") -> Waiting:
    return Waiting(
        band, tenant, t, t + 10 if deadline is None else deadline, payload=name or f"{tenant}{t:g}"
    )


def drain(q: FlowQueue) -> list[str]:
    out = []
    while (w := q.pop()) is not None:
        out.append(w.payload)
    return out


def test_bands_map_from_priority() -> None:
    assert [band_of(p) for p in (5, 1, 0, -1, -9)] == ["critical"] * 2 + ["standard"] + ["sheddable"] * 2


def test_bands_dispatch_strictly_by_priority_whatever_the_arrival_order() -> None:
    q = FlowQueue(BIG)
    for i, band in enumerate(["sheddable", "standard", "critical", "standard", "critical"]):
        q.push(item(band, "t", i, name=f"{band}{i}"))
    assert drain(q) == ["critical2", "critical4", "standard1", "standard3", "sheddable0"]


def test_tenants_of_a_band_take_turns_so_a_heavy_one_gets_no_more_than_an_equal_share() -> None:
    q = FlowQueue(BIG)
    for i in range(30):
        q.push(item("standard", "heavy", i))
    for i in range(5):
        q.push(item("standard", "light", 100 + i))
    first_ten = drain(q)[:10]
    assert Counter(p[:5] for p in first_ten) == {"heavy": 5, "light": 5}
    assert first_ten[0] == "heavy0"  # the tenant that queued first goes first


def test_a_tenant_that_leaves_and_returns_queues_behind_the_waiting_ones() -> None:
    q = FlowQueue(BIG)
    for t in ("a", "b", "c"):
        q.push(item("standard", t, 0))
    assert q.pop().tenant == "a"  # type: ignore[union-attr]
    q.push(item("standard", "a", 1))
    assert [w.tenant for w in iter(q.pop, None)] == ["b", "c", "a"]


def test_fcfs_within_a_tenant_and_edf_by_deadline() -> None:
    fcfs, edf = FlowQueue(BIG), FlowQueue(BIG, "edf")
    for q in (fcfs, edf):
        q.push(item("standard", "t", 0, deadline=9, name="late-deadline"))
        q.push(item("standard", "t", 1, deadline=2, name="early-deadline"))
    assert drain(fcfs) == ["late-deadline", "early-deadline"]
    assert drain(edf) == ["early-deadline", "late-deadline"]


def test_each_band_is_bounded_on_its_own() -> None:
    q = FlowQueue({"critical": 1, "standard": 2, "sheddable": 0})
    assert q.push(item("standard", "a", 0)) and q.push(item("standard", "b", 1))
    assert not q.push(item("standard", "a", 2))
    assert not q.push(item("sheddable", "a", 3))
    assert q.push(item("critical", "a", 4))
    assert len(q) == 3 and q.length("standard") == 2 and q.length("standard", "a") == 1


def test_remove_takes_out_one_item_without_spending_a_turn() -> None:
    q = FlowQueue(BIG)
    a0, a1, b0 = item("standard", "a", 0), item("standard", "a", 1), item("standard", "b", 2)
    for w in (a0, a1, b0):
        q.push(w)
    assert q.remove(a0) and not q.remove(a0)
    assert q.pop() is a1  # a timed-out head does not pass a's turn to b
    assert q.pop() is b0 and q.pop() is None and len(q) == 0


def test_waiting_ahead_sees_only_equal_or_higher_bands() -> None:
    q = FlowQueue(BIG)
    q.push(item("standard", "a", 0))
    assert q.waiting_ahead("standard") and q.waiting_ahead("sheddable")
    assert not q.waiting_ahead("critical")


def test_tenant_header_counts_only_for_trusted_requests_and_claims_always() -> None:
    config = FlowControlConfig(enabled=True, tenantHeader="x-tenant")
    untrusted, trusted = HeaderPolicy(), HeaderPolicy(internal=True)
    assert tenant_of({"x-tenant": "acme"}, untrusted, config) == ANONYMOUS
    assert tenant_of({"x-tenant": "acme"}, trusted, config) == "acme"
    claimed = FlowControlConfig(enabled=True, tenantClaim="org")
    claim_policy = HeaderPolicy(claim_value="yes")
    headers = {TENANT_CLAIM_HEADER: "org-7", "x-gateway-tenant": "org-1"}
    assert tenant_of(headers, claim_policy, claimed) == "org-7"
    assert tenant_of({"x-gateway-tenant": "org-1"}, claim_policy, claimed) == ANONYMOUS
    assert tenant_of({"x-gateway-tenant": "org-1", CLAIM_HEADER: "yes"}, claim_policy, claimed) == "org-1"


def test_ticket_takes_the_band_bound_and_a_shorter_client_deadline() -> None:
    config = FlowControlConfig(enabled=True)
    assert ticket_for(1, {}, HeaderPolicy(), config).max_wait_s == 9.0
    assert ticket_for(-1, {}, HeaderPolicy(), config).max_wait_s == 1.0
    assert ticket_for(0, {"x-gateway-deadline-ms": "250"}, HeaderPolicy(), config).max_wait_s == 0.25
    assert ticket_for(0, {"x-gateway-deadline-ms": "99999999"}, HeaderPolicy(), config).max_wait_s == 5.0


def test_a_latency_objective_orders_the_request_but_keeps_its_bands_wait() -> None:
    config = FlowControlConfig(enabled=True)
    ticket = ticket_for(0, {}, HeaderPolicy(), config, slo_ttft_s=0.3)
    assert (ticket.max_wait_s, ticket.due_s) == (5.0, 0.3)
    assert ticket_for(0, {}, HeaderPolicy(), config, slo_ttft_s=30.0).due_s is None  # past the wait


async def test_edf_serves_the_tighter_objective_first_whatever_the_arrival() -> None:
    flow = FlowController(CollectorRegistry(), FlowControlConfig(enabled=True, ordering="edf"))
    gate = Gate()
    loose = asyncio.create_task(flow.wait(Ticket("standard", "t", 5.0, 4.0), gate.attempt("loose")))
    await until(lambda: len(flow.queue) == 1, "loose queued")
    tight = asyncio.create_task(flow.wait(Ticket("standard", "t", 5.0, 0.2), gate.attempt("tight")))
    await until(lambda: len(flow.queue) == 2, "tight queued")
    gate.open = 2
    flow.signal()
    await asyncio.gather(loose, tight)
    assert gate.order == ["tight", "loose"]
    await flow.stop()


class Gate:
    """A pool stand-in for the controller: `open` slots of capacity, taken by attempts."""

    def __init__(self) -> None:
        self.open = 0
        self.order: list[str] = []

    def attempt(self, name: str) -> Callable[[], str | None]:
        def go() -> str | None:
            if self.open <= 0:
                return None
            self.open -= 1
            self.order.append(name)
            return name

        return go


def value(registry: CollectorRegistry, name: str, **labels: str) -> float:
    return registry.get_sample_value(name, labels) or 0.0


async def test_the_queue_drains_on_signal_in_priority_order_and_gauges_return_to_zero() -> None:
    registry = CollectorRegistry()
    flow = FlowController(registry, FlowControlConfig(enabled=True))
    gate = Gate()
    waits = [
        asyncio.create_task(flow.wait(Ticket(band, "t", 5.0), gate.attempt(band)))
        for band in ("sheddable", "standard", "critical")
    ]
    await until(lambda: len(flow.queue) == 3, "three queued")
    assert value(registry, "inference_flow_control_queue_size", band="critical", tenant="t") == 1
    gate.open = 3
    flow.signal()  # what the pool does on a finish or a scrape
    results = await asyncio.gather(*waits)
    assert gate.order == ["critical", "standard", "sheddable"]
    assert all(r.outcome is Outcome.DISPATCHED for r in results)
    for band in ("critical", "standard", "sheddable"):
        assert value(registry, "inference_flow_control_queue_size", band=band, tenant="t") == 0
        labels = {"band": band, "tenant": "t", "outcome": "dispatched"}
        assert value(registry, "inference_flow_control_outcomes_total", **labels) == 1
    await flow.stop()


async def test_timeout_overflow_and_cancel_leave_nothing_queued() -> None:
    registry = CollectorRegistry()
    config = FlowControlConfig(enabled=True, standard={"maxQueue": 1, "maxWaitMs": 50})
    flow = FlowController(registry, config)
    gate = Gate()
    first = asyncio.create_task(flow.wait(Ticket("standard", "t", 0.05), gate.attempt("a")))
    await until(lambda: len(flow.queue) == 1, "one queued")
    overflow = await flow.wait(Ticket("standard", "t", 0.05), gate.attempt("b"))
    assert overflow.outcome is Outcome.OVERFLOW
    assert (await first).outcome is Outcome.TIMEOUT
    leaving = asyncio.create_task(flow.wait(Ticket("critical", "t", 5.0), gate.attempt("c")))
    await until(lambda: len(flow.queue) == 1, "one queued")
    leaving.cancel()  # the client went away: the ext_proc stream's task is cancelled
    with pytest.raises(asyncio.CancelledError):
        await leaving
    assert len(flow.queue) == 0 and gate.order == []
    for band, outcome in (("standard", "timeout"), ("standard", "overflow"), ("critical", "cancelled")):
        labels = {"band": band, "tenant": "t", "outcome": outcome}
        assert value(registry, "inference_flow_control_outcomes_total", **labels) == 1
        assert value(registry, "inference_flow_control_queue_size", band=band, tenant="t") == 0
    await flow.stop()
