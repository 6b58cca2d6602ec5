"""Scale from zero: hold a request while its pool has no pod that can serve it.

An autoscaler (KEDA, HPA with external metrics) that takes a pool to zero pods needs two things
from the gateway when traffic returns: the requests must not fail at once (every client would
see a 503 while the first pod starts), and the demand must be visible, or nothing scales the
pool up again. With `pools[].scaleFromZero` set, a request that finds no ready pod (none
discovered, or none that has answered a scrape since it became unhealthy or appeared) waits
here up to `maxWaitMs`, counted in `gateway_pool_requests_waiting_for_endpoints` (the
activation metric: > 0 means demand with no pod to serve it), and is scheduled the moment a pod
answers its first scrape: the pool signals every scrape and every completion
(`Pool.capacity_hook`), no timer polls. A request still waiting at `maxWaitMs` gets a 503 with
Retry-After; a client that leaves while waiting holds nothing.

The wait is bounded by Envoy's ext_proc message timeout (gateway/config.py `MAX_FLOW_WAIT_MS`),
as flow control's is: a cold GPU pod usually takes longer than that to start, so the first
requests of a cold start get the 503 and Retry-After, while the metric has already told the
autoscaler to start the pod; requests arriving once it is ready are served.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge


class EmptyPoolHold:
    """The requests of one pool waiting for a ready pod, and the signal that wakes them."""

    def __init__(self, registry: CollectorRegistry, pool_name: str) -> None:
        labels = {"inference_pool": pool_name}
        self._waiting = Gauge(
            "gateway_pool_requests_waiting_for_endpoints",
            "Requests held because the pool has no ready pod (scale from zero: the activation signal)",
            ["inference_pool"],
            registry=registry,
        ).labels(**labels)
        outcomes = Counter(
            "gateway_scale_from_zero_holds",
            "Requests that waited for a ready pod, by how the wait ended",
            ["inference_pool", "outcome"],
            registry=registry,
        )
        self._served = outcomes.labels(outcome="served", **labels)
        self._timeout = outcomes.labels(outcome="timeout", **labels)
        self._cancelled = outcomes.labels(outcome="cancelled", **labels)
        self._event: asyncio.Event | None = None
        self.waiting = 0
        self.clock: Callable[[], float] = time.monotonic

    def signal(self) -> None:
        """A scrape came in or a request finished: waiters look at the pool again."""
        if self.waiting and self._event is not None:
            self._event.set()

    async def wait(self, is_ready: Callable[[], bool], max_wait_s: float) -> bool:
        """Until `is_ready()` (True) or `max_wait_s` passed (False)."""
        if is_ready():
            return True
        if self._event is None:
            self._event = asyncio.Event()
        event = self._event
        deadline = self.clock() + max_wait_s
        self.waiting += 1
        self._waiting.inc()
        outcome = self._cancelled
        try:
            while True:
                left = deadline - self.clock()
                if left <= 0:
                    outcome = self._timeout
                    return False
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(event.wait(), left)
                task = asyncio.current_task()
                if task is not None and task.cancelling():
                    # Cancelled as the event was set: 3.11's wait_for returns the result and
                    # drops the cancel; a gone client must not be held to the deadline.
                    raise asyncio.CancelledError
                event.clear()  # a set wakes every waiter at once; each looks at the pool itself
                if is_ready():
                    outcome = self._served
                    return True
        finally:
            self.waiting -= 1
            self._waiting.dec()
            outcome.inc()
