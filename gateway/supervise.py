"""Supervision of background work: nothing the gateway runs in the background dies silently.

Every long-lived loop (per-pod scrapes, the config file watcher, Kubernetes list/watch
threads) runs under `supervise` (asyncio) or `run_supervised` (threads). An exception the
loop itself did not handle is logged with its traceback, counted in
`gateway_background_task_failures_total{task}`, handed to an optional `on_failure` hook (the
scraper marks the pod unhealthy there) and the loop is restarted after an exponential backoff
(jittered, capped; reset once a run outlived the cap, so a rare crash restarts quickly).
Cancellation and a normal return are not failures. Callbacks that isolate a failing listener
instead of restarting anything report through `report_failure`, so every such failure is
logged and counted the same way.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from prometheus_client import Counter

log = logging.getLogger(__name__)

TASK_FAILURES = Counter(
    "gateway_background_task_failures",
    "Unexpected exceptions in background tasks (each one restarted or isolated), by task kind",
    ["task"],
)

FailureHook = Callable[[BaseException], None]


def report_failure(task: str, name: str, exc: BaseException) -> None:
    """Log `exc` with its traceback and count it against the task kind `task`."""
    TASK_FAILURES.labels(task=task).inc()
    log.error("background task %s (%s) failed: %s: %s", name, task, type(exc).__name__, exc, exc_info=exc)


@dataclass(frozen=True, slots=True)
class Backoff:
    """Restart delays: initial_s x 2^(n-1), +-20 % jitter, at most max_s."""

    initial_s: float = 0.1
    max_s: float = 10.0

    def delay(self, failures: int) -> float:
        base = self.initial_s * 2.0 ** min(max(failures - 1, 0), 30)
        return min(self.max_s, base * random.uniform(0.8, 1.2))


class _Restarts:
    """The policy both drivers share: count, log, call the hook, choose the next delay."""

    def __init__(self, task: str, name: str, backoff: Backoff, on_failure: FailureHook | None) -> None:
        self.task, self.name, self.backoff, self.on_failure = task, name, backoff, on_failure
        self.failures = 0

    def failed(self, exc: BaseException, ran_s: float) -> float:
        if ran_s > self.backoff.max_s:
            self.failures = 0  # it ran fine for a while: this is a new incident
        self.failures += 1
        report_failure(self.task, self.name, exc)
        if self.on_failure is not None:
            try:
                self.on_failure(exc)
            except Exception:
                log.exception("failure hook of %s raised", self.name)
        return self.backoff.delay(self.failures)


async def supervise(
    task: str,
    name: str,
    run: Callable[[], Awaitable[None]],
    *,
    on_failure: FailureHook | None = None,
    backoff: Backoff = Backoff(),
) -> None:
    """Await `run()` until it returns; restart it after each unexpected exception."""
    restarts = _Restarts(task, name, backoff, on_failure)
    while True:
        started = time.monotonic()
        try:
            await run()
            return
        except Exception as exc:  # CancelledError is a BaseException: cancellation passes through
            delay = restarts.failed(exc, time.monotonic() - started)
        await asyncio.sleep(delay)


def spawn(
    task: str,
    name: str,
    run: Callable[[], Awaitable[None]],
    *,
    on_failure: FailureHook | None = None,
    backoff: Backoff = Backoff(),
) -> asyncio.Task[None]:
    """`supervise` as an asyncio task named `name`; RuntimeError without a running loop."""
    loop = asyncio.get_running_loop()  # before the coroutine exists, so none is left unawaited
    return loop.create_task(supervise(task, name, run, on_failure=on_failure, backoff=backoff), name=name)


def run_supervised(
    task: str,
    name: str,
    run: Callable[[], None],
    *,
    stopped: Callable[[], bool],
    wait: Callable[[float], None],
    on_failure: FailureHook | None = None,
    backoff: Backoff = Backoff(),
) -> None:
    """Thread flavour of `supervise`: call `run()` until it returns or `stopped()` is true.

    `wait(seconds)` sleeps between restarts and must return early when the owner stops. An
    exception raised while stopping is the owner tearing the connection down, not a failure.
    """
    restarts = _Restarts(task, name, backoff, on_failure)
    while not stopped():
        started = time.monotonic()
        try:
            run()
            return
        except Exception as exc:
            if stopped():
                log.debug("%s raised while stopping: %r", name, exc)
                return
            delay = restarts.failed(exc, time.monotonic() - started)
        wait(delay)
