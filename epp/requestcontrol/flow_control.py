"""Flow control: hold requests in the EPP while every candidate pod is saturated.

Without it (`flowControl.enabled: false`, the default) a saturated pool sheds sheddable
requests at once (epp/requestcontrol/admission.py) and pushes everything else onto full model servers, where
it waits in vLLM's FIFO queue with no notion of priority or tenant. With it, such a request
waits here, in `FlowQueue` order (critical before standard before sheddable; tenants of a band
take turns; FCFS or earliest deadline within a tenant), and leaves the queue the moment the
pool has headroom again: the pool signals every in-flight completion and every scrape
(`Pool.capacity_hook`), and one dispatcher task then tries the head of the queue with a fresh
snapshot. No timer polls. Headroom is judged on each pod's backlog (epp/scheduling/saturation.py:
waiting requests plus the just-routed ones its free KV cache cannot admit), not on its raw
effective queue, which counts every request in transit and released about one request per pod
per scrape. A request that waits longer than its band's `maxWaitMs`, or finds its
band's `maxQueue` full, gets 429 with Retry-After; a client that goes away while queued (the
ext_proc stream is cancelled) leaves the queue and holds nothing.

Tenants (fair share within a band) honour the trust rule of epp/requestcontrol/header_policy.py: a verified JWT claim
(`flowControl.tenantClaim`, copied by Envoy's jwt_authn) always counts; the tenant header only
for trusted requests. An untrusted client's tenant header is ignored and all untrusted traffic
without a claim is one tenant, `anonymous`: otherwise a client could name another tenant to
spend that tenant's share, or invent many tenants to get many shares.

Agent programs: a request that would be `anonymous` but comes from a known coding agent
(epp/requestcontrol/agent_session.py: Claude Code, Codex, opencode, Gemini CLI, by User-Agent)
queues as the tenant `agent:<program>`, so one agent's tool loop takes turns with the other
agents' requests instead of starving them while the pool is saturated. The set is fixed and
small (an unknown program stays `anonymous`), so a client that forges its User-Agent gains at
most one of a handful of shares; an explicit tenant (claim, or a trusted tenant header) wins.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Generic, TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from epp.requestcontrol.agent_session import OTHER as OTHER_AGENT
from epp.requestcontrol.agent_session import agent_program
from epp.requestcontrol.flow_queue import BANDS, FlowQueue, Waiting, band_of
from epp.requestcontrol.header_policy import HeaderPolicy
from extproc.headers import TENANT_CLAIM_HEADER
from gateway.config import FlowControlConfig

log = logging.getLogger(__name__)

ANONYMOUS = "anonymous"
AGENT_TENANT_PREFIX = "agent:"  # the tenant of an anonymous request from a known agent program
OTHER_TENANTS = "other"  # metric label once MAX_TENANT_LABELS tenants have been seen
MAX_TENANT_LABELS = 64
# A client may ask for an earlier deadline than its band's maxWaitMs (EDF ordering uses it).
DEADLINE_HEADER = "x-gateway-deadline-ms"
_WAIT_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)

T = TypeVar("T")


class Outcome(enum.Enum):
    DISPATCHED = "dispatched"
    TIMEOUT = "timeout"
    OVERFLOW = "overflow"
    CANCELLED = "cancelled"


@dataclass(frozen=True, slots=True)
class Ticket:
    """Where a request queues: its band, tenant and how long it may wait."""

    band: str
    tenant: str
    max_wait_s: float
    # `edf` ordering: seconds after arrival by which it should leave the queue (its latency
    # objective, when shorter than the wait); None: `max_wait_s`.
    due_s: float | None = None


@dataclass(frozen=True, slots=True)
class Result(Generic[T]):
    outcome: Outcome
    value: T | None = None  # what the attempt returned, when dispatched
    waited_s: float = 0.0


class FlowMetrics:
    """Queue length, wait time and outcomes per band and tenant."""

    def __init__(self, registry: CollectorRegistry) -> None:
        labels = ["band", "tenant"]
        self.queued = Gauge(
            "inference_flow_control_queue_size", "Requests waiting in the EPP", labels, registry=registry
        )
        self.wait = Histogram(
            "inference_flow_control_wait_seconds",
            "Time from queueing to leaving the queue, any outcome",
            labels,
            buckets=_WAIT_BUCKETS,
            registry=registry,
        )
        self.outcomes = Counter(
            "inference_flow_control_outcomes",
            "Requests leaving the queue: dispatched, timeout, overflow, cancelled",
            [*labels, "outcome"],
            registry=registry,
        )
        self._tenants: set[str] = set()

    def label(self, tenant: str) -> str:
        """Bounded label cardinality: tenants beyond the first MAX_TENANT_LABELS share one."""
        if tenant in self._tenants:
            return tenant
        if len(self._tenants) < MAX_TENANT_LABELS:
            self._tenants.add(tenant)
            return tenant
        return OTHER_TENANTS


def tenant_of(headers: Mapping[str, str], policy: HeaderPolicy, config: FlowControlConfig) -> str:
    """The fair-share tenant of a request (see the module docstring for the trust rule)."""
    if config.tenant_claim is not None:
        claim = headers.get(TENANT_CLAIM_HEADER)
        if claim:
            return claim
    value = headers.get(config.tenant_header.lower())
    if value and policy.trusted(headers):
        return value
    agent = agent_program(headers)
    return ANONYMOUS if agent == OTHER_AGENT else AGENT_TENANT_PREFIX + agent


def ticket_for(
    priority: int,
    headers: Mapping[str, str],
    policy: HeaderPolicy,
    config: FlowControlConfig,
    slo_ttft_s: float | None = None,
) -> Ticket:
    """`slo_ttft_s`: the request's latency objective (epp/scheduling/slo.py), which orders it in
    an `edf` band; it still waits up to its band's bound (a critical answer late beats none)."""
    band = band_of(priority)
    max_wait_s = getattr(config, band).max_wait_ms / 1000.0
    asked = headers.get(DEADLINE_HEADER, "")
    if asked.isdigit():
        max_wait_s = min(max_wait_s, int(asked) / 1000.0)
    due_s = slo_ttft_s if slo_ttft_s is not None and slo_ttft_s < max_wait_s else None
    return Ticket(band, tenant_of(headers, policy, config), max_wait_s, due_s)


@dataclass(eq=False, slots=True)
class _Entry:
    attempt: Callable[[], object | None]
    future: asyncio.Future[object]


class FlowController:
    """One per EPP process (one pool). `signal()` is the pool's capacity hook."""

    def __init__(
        self,
        registry: CollectorRegistry,
        config: FlowControlConfig | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.metrics = FlowMetrics(registry)
        self.config = config or FlowControlConfig()
        self.clock = clock  # queueing times and deadlines (the pool's clock; virtual in bench/vtime)
        self.queue = self._new_queue(self.config)
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None

    @staticmethod
    def _new_queue(config: FlowControlConfig) -> FlowQueue:
        limits = {band: getattr(config, band).max_queue for band in BANDS}
        return FlowQueue(limits, config.ordering)

    @property
    def enabled(self) -> bool:
        return self.config.enabled

    def configure(self, config: FlowControlConfig) -> None:
        """A reload keeps the waiting requests; the new bounds apply to new arrivals."""
        self.config = config
        self.queue.max_queue = {band: getattr(config, band).max_queue for band in BANDS}
        self.queue.ordering = config.ordering

    def must_queue(self, band: str) -> bool:
        """A request of `band` queues even with headroom when one of its band or above waits."""
        return self.enabled and self.queue.waiting_ahead(band)

    def signal(self) -> None:
        """Capacity may have freed (a request finished, a scrape arrived): try the queue's head."""
        if len(self.queue):
            self._wake_dispatcher()

    async def wait(self, ticket: Ticket, attempt: Callable[[], T | None]) -> Result[T]:
        """Queue until `attempt()` (called by the dispatcher, in queue order) returns a value.

        `attempt` returns None while the pool is still saturated; otherwise it has routed the
        request (and owns the in-flight slot: its caller releases it on stream close).
        """
        now = self.clock()
        label = self.metrics.label(ticket.tenant)
        entry = _Entry(attempt, self._new_future())
        due = ticket.max_wait_s if ticket.due_s is None else ticket.due_s
        item = Waiting(ticket.band, ticket.tenant, now, now + due, payload=entry)
        if not self.queue.push(item):
            self.metrics.outcomes.labels(ticket.band, label, Outcome.OVERFLOW.value).inc()
            return Result(Outcome.OVERFLOW)
        self.metrics.queued.labels(ticket.band, label).inc()
        self._wake_dispatcher()  # there may be headroom right now: the dispatcher decides who goes
        outcome = Outcome.CANCELLED
        try:
            await self._until_done(entry.future, ticket.max_wait_s)
            if entry.future.done():
                outcome = Outcome.DISPATCHED
                return Result(outcome, entry.future.result(), self.clock() - now)  # type: ignore[arg-type]
            outcome = Outcome.TIMEOUT
            return Result(outcome, waited_s=self.clock() - now)
        finally:
            # Runs on timeout and on cancellation (the client left) as well: nothing stays queued.
            if self.queue.remove(item):
                entry.future.cancel()
            elif outcome is Outcome.CANCELLED and entry.future.done() and not entry.future.cancelled():
                outcome = Outcome.DISPATCHED  # routed just before the cancel: the caller releases it
            self.metrics.queued.labels(ticket.band, label).dec()
            self.metrics.wait.labels(ticket.band, label).observe(self.clock() - now)
            self.metrics.outcomes.labels(ticket.band, label, outcome.value).inc()

    # The three seams of the asyncio plumbing (bench/vtime/flow.py runs the queue on a virtual
    # clock through them): a waiter's future, the dispatcher's wake-up, the wait itself.
    def _new_future(self) -> asyncio.Future[object]:
        """A future of the running loop; its dispatcher task serves the queue."""
        self._ensure_dispatcher()
        return asyncio.get_running_loop().create_future()

    def _wake_dispatcher(self) -> None:
        """Have `dispatch()` run soon (the dispatcher task, once started, on the next loop turn)."""
        if self._wake is not None:
            self._wake.set()

    async def _until_done(self, future: asyncio.Future[object], timeout_s: float) -> None:
        """Return when `future` is done or after `timeout_s`, whichever comes first."""
        await asyncio.wait((future,), timeout=timeout_s)

    def _ensure_dispatcher(self) -> None:
        if self._task is None or self._task.done():
            self._wake = asyncio.Event()
            self._task = asyncio.get_running_loop().create_task(
                self._dispatch_forever(), name="flow-dispatch"
            )

    async def _dispatch_forever(self) -> None:
        assert self._wake is not None
        while True:
            await self._wake.wait()
            self._wake.clear()
            try:
                self.dispatch()
            except Exception:  # a bug in one attempt must not stop the queue for everyone
                log.exception("flow-control dispatch failed")

    def dispatch(self) -> int:
        """Route queued requests, head first, until one finds the pool still saturated."""
        sent = 0
        while (item := self.queue.peek()) is not None:
            entry: _Entry = item.payload
            if entry.future.done():  # its waiter left; `wait` removes it, this is belt and braces
                self.queue.remove(item)
                continue
            try:
                value = entry.attempt()
            except Exception as exc:
                self.queue.remove(item)
                entry.future.set_exception(exc)
                continue
            if value is None:
                break
            self.queue.remove(item, served=True)
            entry.future.set_result(value)
            sent += 1
        return sent

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
