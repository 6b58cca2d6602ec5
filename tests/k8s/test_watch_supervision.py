"""A bug in a watch callback (an object of a shape nobody expected) no longer kills or
silently wedges the discovery thread: it is logged with its traceback, counted under
`gateway_background_task_failures_total{task="kube-watch"}`, and the watch restarts with a
fresh list, so discovery recovers on its own once the object is fixed."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from gateway.supervise import TASK_FAILURES
from tests.fakes.kube_apiserver import INFERENCE_POOLS, PODS, FakeKubeApiServer, make_pod, make_pool
from tests.k8s.conftest import StartDiscovery

APP = {"app": "llama"}


def watch_failures() -> float:
    return TASK_FAILURES.labels(task="kube-watch")._value.get()


async def _poll(condition, within: float = 5.0) -> None:
    deadline = time.monotonic() + within
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.02)


async def test_a_callback_bug_is_logged_counted_and_the_watch_recovers(
    kube: FakeKubeApiServer, start_discovery: StartDiscovery, caplog: pytest.LogCaptureFixture
) -> None:
    kube.apply(INFERENCE_POOLS, make_pool("llama", selector=APP))
    kube.apply(PODS, make_pod("a", labels=APP, ip="10.0.0.1"))
    _, rec = await start_discovery()
    assert rec.addresses == {"10.0.0.1:8000"}
    before = watch_failures()

    weird = make_pod("weird", labels=APP, ip="10.0.0.2")
    weird["status"]["conditions"] = ["Ready"]  # strings, not objects: pod_is_serving raises
    with caplog.at_level(logging.ERROR, logger="gateway.supervise"):
        kube.apply(PODS, weird)
        await _poll(lambda: watch_failures() - before >= 2)  # failed, re-listed, failed again
    records = [r for r in caplog.records if "kube-watch" in r.getMessage()]
    assert records and records[0].exc_info and records[0].exc_info[0] is AttributeError
    assert rec.addresses == {"10.0.0.1:8000"}  # the last good set stays in force meanwhile

    kube.delete(PODS, "weird")
    kube.apply(PODS, make_pod("b", labels=APP, ip="10.0.0.3"))
    await rec.until(lambda a: a == {"10.0.0.1:8000", "10.0.0.3:8000"}, within=10.0)
    failures_after_fix = watch_failures()
    kube.apply(PODS, make_pod("c", labels=APP, ip="10.0.0.4"))
    await rec.until(lambda a: "10.0.0.4:8000" in a, within=10.0)
    assert watch_failures() == failures_after_fix  # healthy again: no more restarts
