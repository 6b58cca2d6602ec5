"""gateway.supervise: crashes are logged with a traceback, counted, hooked and restarted."""

from __future__ import annotations

import asyncio
import logging
import threading

import pytest

from gateway.supervise import TASK_FAILURES, Backoff, run_supervised, spawn, supervise

FAST = Backoff(initial_s=0.001, max_s=0.01)


def failures(task: str) -> float:
    return TASK_FAILURES.labels(task=task)._value.get()


def test_backoff_doubles_with_jitter_and_is_capped() -> None:
    b = Backoff(initial_s=0.1, max_s=1.0)
    assert 0.08 <= b.delay(1) <= 0.12 and 0.16 <= b.delay(2) <= 0.24
    assert b.delay(5) == 1.0 and b.delay(10_000) == 1.0


async def test_a_crashing_task_is_logged_counted_hooked_and_restarted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    runs, hooked = [], []
    before = failures("unit-crash")

    async def body() -> None:
        runs.append(1)
        if len(runs) <= 3:
            raise OverflowError(f"boom {len(runs)}")

    with caplog.at_level(logging.ERROR, logger="gateway.supervise"):
        await asyncio.wait_for(
            supervise("unit-crash", "unit body", body, on_failure=hooked.append, backoff=FAST), 5
        )
    assert len(runs) == 4  # three crashes, then a normal return ends supervision
    assert failures("unit-crash") - before == 3
    assert [str(e) for e in hooked] == ["boom 1", "boom 2", "boom 3"]
    records = [r for r in caplog.records if "unit body" in r.getMessage()]
    assert len(records) == 3 and all(r.exc_info and r.exc_info[0] is OverflowError for r in records)


async def test_cancellation_is_not_a_failure_and_a_failing_hook_does_not_stop_restarts() -> None:
    started = asyncio.Event()
    runs = []
    before = failures("unit-cancel")

    async def body() -> None:
        runs.append(1)
        if len(runs) == 1:
            raise RuntimeError("first run fails")
        started.set()
        await asyncio.sleep(3600)

    def bad_hook(exc: BaseException) -> None:
        raise ValueError("hook bug")

    task = spawn("unit-cancel", "unit sleeper", body, on_failure=bad_hook, backoff=FAST)
    await asyncio.wait_for(started.wait(), 5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert failures("unit-cancel") - before == 1 and len(runs) == 2


def test_thread_flavour_restarts_until_stopped() -> None:
    stop = threading.Event()
    runs = []
    before = failures("unit-thread")

    def body() -> None:
        runs.append(1)
        if len(runs) == 5:
            stop.set()
        raise KeyError("bug")

    thread = threading.Thread(
        target=run_supervised,
        args=("unit-thread", "unit thread", body),
        kwargs={"stopped": stop.is_set, "wait": stop.wait, "backoff": FAST},
    )
    thread.start()
    thread.join(5)
    assert not thread.is_alive()
    assert len(runs) == 5
    assert failures("unit-thread") - before == 4  # the fifth raised while stopping: not a failure
