"""Prometheus metrics of one global-router replica (own registry: several apps per test process)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from globalrouter.members import MemberBook


class _MemberCollector(Collector):
    def __init__(self, book: MemberBook, clock: Callable[[], float]) -> None:
        self._book = book
        self._clock = clock

    def collect(self) -> Iterator[GaugeMetricFamily]:
        now = self._clock()
        available = GaugeMetricFamily(
            "global_router_member_available", "1 when the member may take traffic", labels=["cluster"]
        )
        ramp = GaugeMetricFamily("global_router_member_ramp", "Ramp-up weight 0..1", labels=["cluster"])
        recent = GaugeMetricFamily(
            "global_router_member_recent_routes", "Requests routed in the burst window", labels=["cluster"]
        )
        for state in self._book.members.values():
            available.add_metric([state.name], 1.0 if self._book.available(state, now) else 0.0)
            ramp.add_metric([state.name], self._book.ramp(state, now))
            recent.add_metric([state.name], self._book.recent_routed(state, now))
        yield from (available, ramp, recent)


class Telemetry:
    def __init__(self, book: MemberBook, clock: Callable[[], float]) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.routed = Counter(
            "global_router_requests", "Requests routed to a member", ["cluster", "reason"], registry=r
        )
        self.refused = Counter("global_router_refused", "Requests refused", ["code"], registry=r)
        self.outcomes = Counter(
            "global_router_member_outcomes", "Passive health outcomes", ["cluster", "ok"], registry=r
        )
        self.heartbeats = Counter("global_router_heartbeats", "Heartbeats received", ["cluster"], registry=r)
        self.tokens = Counter("global_router_tokens_charged", "LLM tokens charged to tenants", registry=r)
        r.register(_MemberCollector(book, clock))
