"""The EPP's flow-control queue on the virtual clock: `epp.requestcontrol.flow_control.FlowController` itself,
with only its asyncio plumbing replaced.

Live, a decision that finds the pool saturated awaits `FlowController.wait`: its request is
pushed on the production `FlowQueue`, and the dispatcher task runs `dispatch()` (the head's
`attempt`: a fresh pick, routed once the pool has headroom) whenever the pool signals that
capacity may have freed (every finished request and every scrape, `Pool.capacity_hook`), until
the request is routed or its band's `maxWaitMs` passes (429). Here the same `wait` coroutine
runs; what differs is only how it is resumed:

- a wake-up of the dispatcher is a loop event at the current instant (one pending at a time,
  as the live `asyncio.Event`), which runs the production `dispatch()` and then resumes, in
  dispatch order, every decision it routed;
- the wait itself yields to the driver (`VirtualEpp.route`), which parks the coroutine and
  resumes it at its deadline if no dispatch resumed it first.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Generator
from typing import Any

from prometheus_client import CollectorRegistry

from bench.vtime.loop import TIMER, Events
from epp.requestcontrol.flow_control import FlowController
from gateway.config import FlowControlConfig

_RESULTS_LOOP: asyncio.AbstractEventLoop | None = None


def _results_loop() -> asyncio.AbstractEventLoop:
    """A loop that never runs: its futures only hold a dispatched request's result (one per process)."""
    global _RESULTS_LOOP
    if _RESULTS_LOOP is None:
        _RESULTS_LOOP = asyncio.new_event_loop()
    return _RESULTS_LOOP


class _Told(asyncio.Future[object]):
    """A waiter's future that notes when the dispatcher settles it (the live loop's callback)."""

    def __init__(self, ready: list[_Told]) -> None:
        super().__init__(loop=_results_loop())
        self._ready = ready

    def set_result(self, result: object) -> None:
        super().set_result(result)
        self._ready.append(self)

    def set_exception(self, exception: type | BaseException) -> None:
        super().set_exception(exception)
        self._ready.append(self)


class Park:
    """What a waiting decision yields to its driver: the future it waits on, for how long."""

    __slots__ = ("future", "timeout_s")

    def __init__(self, future: asyncio.Future[object], timeout_s: float) -> None:
        self.future = future
        self.timeout_s = timeout_s

    def __await__(self) -> Generator[Park, None, None]:
        yield self


class VirtualFlow(FlowController):
    """One pool's flow controller on the loop's clock; `park` holds a suspended decision."""

    def __init__(self, config: FlowControlConfig, events: Events, time_scale: float) -> None:
        # Its own registry: the app's already holds the live controller's metrics.
        super().__init__(CollectorRegistry(), config, clock=lambda: events.now / time_scale)
        self._events = events
        self._ts = time_scale
        self._dispatch_pending = False
        self._ready: list[_Told] = []
        self._parked: dict[asyncio.Future[object], Callable[[], None]] = {}

    def _new_future(self) -> asyncio.Future[object]:
        return _Told(self._ready)

    def _wake_dispatcher(self) -> None:
        if not self._dispatch_pending:
            self._dispatch_pending = True
            self._events.at(self._events.now, TIMER, self._dispatch)

    async def _until_done(self, future: asyncio.Future[object], timeout_s: float) -> None:
        await Park(future, timeout_s)

    def _dispatch(self) -> None:
        self._dispatch_pending = False
        self.dispatch()
        ready = list(self._ready)  # the futures hold this list: empty it in place
        self._ready.clear()
        for future in ready:
            resume = self._parked.pop(future, None)
            if resume is not None:
                resume()

    def park(self, coro: Coroutine[Any, Any, Any], park: Park, done: Callable[[Any], None]) -> None:
        """Hold `coro` (suspended at `park`) until the dispatcher settles its future or its
        deadline passes; then run it to its end and hand `done` what it returns."""
        future = park.future

        def resume() -> None:
            try:
                yielded = coro.send(None)
            except StopIteration as stop:
                done(stop.value)
                return
            coro.close()
            raise RuntimeError(f"a resumed flow-control wait suspended again on {yielded!r}")

        def deadline() -> None:
            if self._parked.pop(future, None) is not None:
                resume()

        self._parked[future] = resume
        self._events.at(self._events.now + park.timeout_s * self._ts, TIMER, deadline)
