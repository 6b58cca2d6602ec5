"""InferencePoolDiscovery against the fake API server, through the real kubernetes client."""

from __future__ import annotations

import asyncio
import itertools
import time

import pytest

from epp.datalayer.discovery.kubernetes import MODEL_KEY, DiscoveryError
from tests.fakes.kube_apiserver import (
    INFERENCE_POOLS,
    PODS,
    FakeKubeApiServer,
    ResourceKind,
    make_pod,
    make_pool,
)
from tests.k8s.conftest import StartDiscovery

APP = {"app": "llama"}


async def _poll(condition, within: float = 15.0) -> None:
    """For state that has no event to await (a resourceVersion moving inside a worker thread)."""
    deadline = time.monotonic() + within
    while not condition():
        assert time.monotonic() < deadline, f"condition not met within {within} s"
        await asyncio.sleep(0.02)


def _set_ready(ready: bool):
    def mutate(pod: dict) -> None:
        pod["status"]["conditions"] = [{"type": "Ready", "status": "True" if ready else "False"}]

    return mutate


async def test_start_delivers_the_first_full_list(
    kube: FakeKubeApiServer, start_discovery: StartDiscovery
) -> None:
    kube.apply(INFERENCE_POOLS, make_pool("llama", selector=APP))
    kube.apply(
        PODS, make_pod("a", labels=APP, ip="10.0.0.1", annotations={MODEL_KEY: "meta-llama/Llama-3.1-8B"})
    )
    kube.apply(PODS, make_pod("b", labels=APP, ip="10.0.0.2"))
    kube.apply(PODS, make_pod("other", labels={"app": "qwen"}, ip="10.0.0.9"))
    discovery, rec = await start_discovery(default_models=["llama-8b"])
    assert rec.history() == [{"10.0.0.1:8000", "10.0.0.2:8000"}]  # one delivery, already complete
    by_addr = {e.address: e for e in rec.calls[0]}
    assert by_addr["10.0.0.1:8000"].models == frozenset({"meta-llama/Llama-3.1-8B"})
    assert by_addr["10.0.0.2:8000"].models == frozenset({"llama-8b"})
    assert by_addr["10.0.0.2:8000"].labels == APP
    assert discovery.endpoints == rec.calls[0]


async def test_pods_enter_and_leave_on_add_unready_and_delete(
    kube: FakeKubeApiServer, start_discovery: StartDiscovery
) -> None:
    kube.apply(INFERENCE_POOLS, make_pool("llama", selector=APP))
    _, rec = await start_discovery()
    assert rec.addresses == set()
    kube.apply(PODS, make_pod("a", labels=APP, ip="10.0.0.1"))
    await rec.until(lambda s: s == {"10.0.0.1:8000"})
    kube.apply(PODS, make_pod("b", labels=APP, ip="10.0.0.2", ready=False))
    kube.modify(PODS, "a", _set_ready(False))
    await rec.until(lambda s: s == set())
    kube.modify(PODS, "b", _set_ready(True))
    await rec.until(lambda s: s == {"10.0.0.2:8000"})
    kube.modify(PODS, "b", lambda p: p["metadata"].update(deletionTimestamp="2026-01-01T00:00:01Z"))
    await rec.until(lambda s: s == set())
    kube.modify(PODS, "a", _set_ready(True))
    await rec.until(lambda s: s == {"10.0.0.1:8000"})
    kube.delete(PODS, "a")
    await rec.until(lambda s: s == set())
    # Every delivery differed from the one before: no duplicate calls.
    history = rec.history()
    assert all(a != b for a, b in itertools.pairwise(history))


async def test_ip_change_and_irrelevant_updates(
    kube: FakeKubeApiServer, start_discovery: StartDiscovery
) -> None:
    kube.apply(INFERENCE_POOLS, make_pool("llama", selector=APP))
    kube.apply(PODS, make_pod("a", labels=APP, ip="10.0.0.1"))
    _, rec = await start_discovery()
    kube.modify(PODS, "a", lambda p: p["status"].update(podIP="10.0.0.7"))
    await rec.until(lambda s: s == {"10.0.0.7:8000"})
    calls = len(rec.calls)
    # A change that does not touch the endpoint (a new container status) is not delivered.
    kube.modify(
        PODS, "a", lambda p: p["status"].update(containerStatuses=[{"name": "server", "restartCount": 1}])
    )
    kube.apply(PODS, make_pod("z", labels={"app": "qwen"}, ip="10.0.0.8"))
    kube.apply(PODS, make_pod("c", labels=APP, ip="10.0.0.3"))  # a marker we can wait for
    await rec.until(lambda s: "10.0.0.3:8000" in s)
    assert len(rec.calls) == calls + 1


async def test_pool_port_and_selector_changes(
    kube: FakeKubeApiServer, start_discovery: StartDiscovery
) -> None:
    kube.apply(INFERENCE_POOLS, make_pool("llama", selector=APP))
    kube.apply(PODS, make_pod("a", labels=APP, ip="10.0.0.1"))
    kube.apply(PODS, make_pod("q", labels={"app": "qwen"}, ip="10.0.0.2"))
    discovery, rec = await start_discovery()
    kube.modify(
        INFERENCE_POOLS, "llama", lambda p: p["spec"].update(targetPorts=[{"number": 8001}, {"number": 8002}])
    )
    await rec.until(lambda s: s == {"10.0.0.1:8001", "10.0.0.1:8002"})
    lists = discovery.pod_lists
    t0 = time.monotonic()
    kube.modify(
        INFERENCE_POOLS, "llama", lambda p: p["spec"].update(selector={"matchLabels": {"app": "qwen"}})
    )
    await rec.until(lambda s: s == {"10.0.0.2:8001", "10.0.0.2:8002"})
    # The open watch was cut, not waited out (its timeout is 300 s; a busy machine takes ~0.1 s).
    assert time.monotonic() - t0 < 30
    assert discovery.pod_lists == lists + 1
    # The old selector's watch is gone: changing its pods changes nothing; the new one's does.
    kube.delete(PODS, "a")
    kube.apply(PODS, make_pod("q2", labels={"app": "qwen"}, ip="10.0.0.3"))
    await rec.until(lambda s: "10.0.0.3:8001" in s)
    assert {"10.0.0.1:8001"} not in [s & {"10.0.0.1:8001"} for s in rec.history()[-2:]]


async def test_pool_deleted_and_recreated(kube: FakeKubeApiServer, start_discovery: StartDiscovery) -> None:
    kube.apply(PODS, make_pod("a", labels=APP, ip="10.0.0.1"))
    _, rec = await start_discovery()  # no pool yet: start still returns, with an empty set
    assert rec.history() == [set()]
    kube.apply(INFERENCE_POOLS, make_pool("llama", selector=APP))
    await rec.until(lambda s: s == {"10.0.0.1:8000"})
    kube.delete(INFERENCE_POOLS, "llama")
    await rec.until(lambda s: s == set())
    kube.apply(INFERENCE_POOLS, make_pool("llama", selector=APP))
    await rec.until(lambda s: s == {"10.0.0.1:8000"})


async def test_invalid_pool_spec_yields_no_endpoints(
    kube: FakeKubeApiServer, start_discovery: StartDiscovery
) -> None:
    kube.apply(PODS, make_pod("a", labels=APP, ip="10.0.0.1"))
    kube.apply(INFERENCE_POOLS, make_pool("llama", selector={}))
    _, rec = await start_discovery()
    assert rec.history() == [set()]
    kube.modify(INFERENCE_POOLS, "llama", lambda p: p["spec"].update(selector={"matchLabels": APP}))
    await rec.until(lambda s: s == {"10.0.0.1:8000"})


async def test_410_gone_relists_without_dropping_pods(
    kube: FakeKubeApiServer, start_discovery: StartDiscovery
) -> None:
    kube.apply(INFERENCE_POOLS, make_pool("llama", selector=APP))
    for i in range(1, 4):
        kube.apply(PODS, make_pod(f"p{i}", labels=APP, ip=f"10.0.0.{i}"))
    discovery, rec = await start_discovery()
    before, calls = rec.addresses, len(rec.calls)
    lists = discovery.pod_lists
    # Cut the watch, then let history be compacted while it is away: the resume gets 410.
    await asyncio.to_thread(kube.wait_watching, PODS)
    kube.set_unavailable(True)
    await asyncio.sleep(0.1)
    kube.apply(PODS, make_pod("p4", labels=APP, ip="10.0.0.4"))
    kube.delete(PODS, "p1")
    kube.compact()
    kube.set_unavailable(False)
    await rec.until(lambda s: s == {"10.0.0.2:8000", "10.0.0.3:8000", "10.0.0.4:8000"})
    assert kube.expired_watches[PODS] == 1
    assert discovery.pod_lists == lists + 1
    # Exactly one delivery since: the full new list, never an empty or partial set in between.
    assert rec.history()[calls - 1 :] == [before, {"10.0.0.2:8000", "10.0.0.3:8000", "10.0.0.4:8000"}]


async def test_dropped_connection_resumes_from_last_resource_version(
    kube: FakeKubeApiServer, start_discovery: StartDiscovery
) -> None:
    kube.apply(INFERENCE_POOLS, make_pool("llama", selector=APP))
    kube.apply(PODS, make_pod("a", labels=APP, ip="10.0.0.1"))
    discovery, rec = await start_discovery()
    lists = discovery.pod_lists
    await asyncio.to_thread(kube.wait_watching, PODS)
    kube.drop_watches(abort=True)
    kube.apply(PODS, make_pod("b", labels=APP, ip="10.0.0.2"))
    await rec.until(lambda s: s == {"10.0.0.1:8000", "10.0.0.2:8000"})
    await asyncio.to_thread(kube.wait_watching, PODS)
    kube.drop_watches(abort=False)  # clean end of stream, as after timeoutSeconds
    kube.delete(PODS, "a")
    await rec.until(lambda s: s == {"10.0.0.2:8000"})
    assert discovery.pod_lists == lists  # resumed by watching, no re-list


async def test_api_outage_retries_with_backoff(
    kube: FakeKubeApiServer, start_discovery: StartDiscovery
) -> None:
    kube.apply(INFERENCE_POOLS, make_pool("llama", selector=APP))
    kube.apply(PODS, make_pod("a", labels=APP, ip="10.0.0.1"))
    base = 0.05
    _, rec = await start_discovery(resync_backoff_s=base)
    await asyncio.to_thread(kube.wait_watching, PODS)
    before = len(kube.calls(PODS, watch=True))
    kube.set_unavailable(True)
    await _poll(lambda: len(kube.calls(PODS, watch=True)) >= before + 5)
    # Retried, but backing off rather than spinning: the k-th gap between refused watch calls
    # is at least the k-th backoff step (base * 2^(k-1), jitter -20 %). A busy machine only
    # makes gaps longer, so this lower bound holds under any load.
    refused = [t for t, _ in kube.timed_calls(PODS, watch=True)[before:]]
    gaps = [b - a for a, b in itertools.pairwise(refused)][:4]
    assert all(gap >= 0.8 * base * 2**k for k, gap in enumerate(gaps)), gaps
    assert rec.addresses == {"10.0.0.1:8000"}  # an outage keeps the last known set
    kube.apply(PODS, make_pod("b", labels=APP, ip="10.0.0.2"))
    kube.set_unavailable(False)
    await rec.until(lambda s: s == {"10.0.0.1:8000", "10.0.0.2:8000"}, within=15)


async def test_bookmarks_advance_the_resource_version(
    kube: FakeKubeApiServer, start_discovery: StartDiscovery
) -> None:
    kube.apply(INFERENCE_POOLS, make_pool("llama", selector=APP))
    kube.apply(PODS, make_pod("a", labels=APP, ip="10.0.0.1"))
    discovery, rec = await start_discovery()
    rv_before = int(discovery.pod_resource_version or 0)
    for i in range(5):  # activity the pod watch does not see
        kube.apply(PODS, make_pod(f"other{i}", labels={"app": "qwen"}, ip=f"10.0.1.{i}"))
    await asyncio.to_thread(kube.wait_watching, PODS)
    target = kube.send_bookmark()
    await _poll(lambda: int(discovery.pod_resource_version or 0) >= target)
    assert rv_before < int(discovery.pod_resource_version or 0) == target
    assert all(q.get("allowWatchBookmarks") == "true" for q in kube.calls(PODS, watch=True))
    # Compacting below the bookmark does not force a re-list: the resume point is recent.
    lists = discovery.pod_lists
    kube.compact()
    await asyncio.to_thread(kube.wait_watching, PODS)
    kube.drop_watches()
    kube.apply(PODS, make_pod("b", labels=APP, ip="10.0.0.2"))
    await rec.until(lambda s: s == {"10.0.0.1:8000", "10.0.0.2:8000"})
    assert discovery.pod_lists == lists


@pytest.mark.parametrize(("kind", "code"), [(PODS, "403"), (INFERENCE_POOLS, "403")])
async def test_start_fails_clearly_without_permission(
    kube: FakeKubeApiServer, start_discovery: StartDiscovery, kind: ResourceKind, code: str
) -> None:
    kube.apply(INFERENCE_POOLS, make_pool("llama", selector=APP))
    kube.forbid(kind)
    with pytest.raises(DiscoveryError, match=f"{code} Forbidden: check the RBAC Role"):
        await start_discovery()


async def test_start_fails_clearly_without_the_crd(
    kube: FakeKubeApiServer, start_discovery: StartDiscovery
) -> None:
    with pytest.raises(DiscoveryError, match="CRD installed"):
        await start_discovery(pool_group="missing.example.com")


async def test_start_times_out_when_api_unreachable(
    kube: FakeKubeApiServer, start_discovery: StartDiscovery
) -> None:
    kube.set_unavailable(True)
    t0 = time.monotonic()
    with pytest.raises(DiscoveryError, match=r"within 0\.3s"):
        await start_discovery(start_timeout_s=0.3)
    # It gives up instead of hanging: the timeout fired (the message) and stopping joins each of
    # the two watch threads for at most 5 s. Not a speed check (a loaded 2-core machine took 5 s
    # to finish a reflector's in-flight list call here).
    assert time.monotonic() - t0 < 20
