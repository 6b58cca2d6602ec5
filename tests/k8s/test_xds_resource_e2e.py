"""In the cluster as on the laptop: the InferenceGatewayConfig resource is the configuration, and
Envoy follows it over xDS. The real Envoy, the xDS server and the single-hop EPP as processes,
their watches on the fake API server (the real list/watch protocol) through a kubeconfig; every
change is an edit of the resource, as `kubectl edit` makes it.

Shown: a model and then a pool added are served within FOLLOW_DEADLINE_S, a model removed
answers 404 `model_not_found`, a refused edit leaves the last good configuration and says why
in the resource's status, a streamed answer spanning each change ends with `[DONE]`, and the
xDS server killed (SIGKILL) and restarted under load fails no request (Envoy keeps its last
configuration meanwhile) and follows the next change.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import httpx
import pytest

from devstack.launch import LocalGateway, gateway_config_for, grpc_serving, start_fleet, start_local_gateway
from tests.fakes.kube_apiserver import GATEWAY_CONFIGS, FakeKubeApiServer, write_kubeconfig
from tests.integration.conftest import chat
from tests.integration.test_config_follow import (
    FLEET,
    NEW,
    SPANNING_TOKENS,
    Stream,
    _refused,
    _served,
    _unlist_new_adapter,
    _until,
)
from tests.reliability.conftest import record_figures

pytestmark = pytest.mark.integration

LLAMA = "llama-3.1-8b-instruct"
RESOURCE = "default/gateway"
# What issue #44 asks of a resource edit: served within 2 s (0.3-0.6 s typical here; the time
# each took is recorded, RELIABILITY_REPORT).
FOLLOW_DEADLINE_S = 2.0
# A pool's context starts in the running EPP (a 503 `pool_not_served` until it runs): seconds on
# a loaded 2-core machine, so the pool's deadline is the one test_config_follow.py gives it.
POOL_DEADLINE_S = 30.0


@pytest.fixture(scope="module")
def kube() -> Iterator[FakeKubeApiServer]:
    with FakeKubeApiServer() as server:
        yield server


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory, kube: FakeKubeApiServer) -> Iterator[LocalGateway]:
    workdir = tmp_path_factory.mktemp("xds-resource")
    follow = ["--config-resource", RESOURCE]
    gateway = start_local_gateway(
        workdir,
        fleet=FLEET,
        config_patch=_unlist_new_adapter,
        single_hop=True,
        epp_args=follow,
        xds_args=[*follow, "--resource-wait-seconds", "10"],
        service_env={"KUBECONFIG": str(write_kubeconfig(workdir / "kubeconfig", kube.url))},
    )
    try:
        kube.wait_watching(GATEWAY_CONFIGS, 2, timeout=30)  # the EPP and the xDS server
        # The resource takes over from the file the processes started with (the same content).
        namespace, name = RESOURCE.split("/")
        kube.apply(
            GATEWAY_CONFIGS,
            {"metadata": {"name": name, "namespace": namespace}, "spec": gateway.read_config()},
        )
        yield gateway
    finally:
        gateway.stop()


def _status(kube: FakeKubeApiServer) -> dict[str, Any]:
    obj = kube.get(GATEWAY_CONFIGS, "gateway")
    assert obj is not None
    return dict(obj.get("status") or {})


def _edit(kube: FakeKubeApiServer, change: Callable[[dict[str, Any]], None]) -> tuple[float, int]:
    """`kubectl edit` of the resource's spec: (monotonic time of the change, its generation)."""

    def mutate(obj: dict[str, Any]) -> None:
        obj.pop("status", None)  # an edit of the spec keeps the status the xDS server wrote
        change(obj["spec"])

    stored = kube.modify(GATEWAY_CONFIGS, "gateway", mutate)
    return time.monotonic(), int(stored["metadata"]["generation"])


async def _applied(kube: FakeKubeApiServer, generation: int) -> None:
    async def written() -> bool:
        return _status(kube).get("appliedGeneration") == generation

    await _until(written, f"generation {generation} reported applied", 10)
    [ready] = _status(kube)["conditions"]
    assert ready["status"] == "True" and ready["reason"] == "Applied", ready


def _llama_adapter_lists(spec: dict[str, Any]) -> list[list[str]]:
    pool = next(p for p in spec["pools"] if p["models"][0]["name"] == LLAMA)
    return [pool["models"][0]["adapters"], *(e["adapters"] for e in pool["endpoints"])]


async def _served_or_starting(client: httpx.AsyncClient, model: str) -> bool:
    """Served; until then refused (404: not in Envoy's routes yet) or 503 `pool_not_served`
    while the EPP starts the pool's context."""
    r = await client.post("/v1/chat/completions", json=chat(model))
    assert r.status_code in (200, 404, 503), r.text
    if r.status_code == 503:
        assert r.json()["error"]["code"] == "pool_not_served", r.text
    return r.status_code == 200


async def test_a_model_and_then_a_pool_added_to_the_resource_are_served(
    gw: LocalGateway, kube: FakeKubeApiServer
) -> None:
    spec = {
        "time_scale": 2.0,
        "pods": [{"name": "mistral", "model": "mistral-7b", "profile": "h100-llama3.1-8b"}],
    }
    (gw.workdir / "mistral").mkdir()
    gw.procs["fleet-mistral"], pods = start_fleet(gw.workdir / "mistral", spec)
    async with gw.client() as client:
        assert await _refused(client, NEW)
        async with Stream(client, LLAMA, 4 * SPANNING_TOKENS) as stream:
            changed, generation = _edit(kube, lambda s: [a.append(NEW) for a in _llama_adapter_lists(s)])
            await _until(lambda: _served(client, NEW), f"{NEW} served", FOLLOW_DEADLINE_S)
            model_took = time.monotonic() - changed
            await _applied(kube, generation)

            def add_pool(s: dict[str, Any]) -> None:
                (pool,) = gateway_config_for(pods, {"mistral": 0})["pools"]
                pool["epp"] = s["pools"][0]["epp"]  # single-hop: the one EPP serves it
                s["pools"].append(pool)

            assert await _refused(client, "mistral-7b")
            changed, generation = _edit(kube, add_pool)
            await _until(
                lambda: _served_or_starting(client, "mistral-7b"), "the new pool served", POOL_DEADLINE_S
            )
            pool_took = time.monotonic() - changed
            await _applied(kube, generation)
            assert not stream.done, "the streamed answer should span both changes"
        assert _status(kube)["pools"] == 3
    record_figures("resource_follow_added", {"model_s": round(model_took, 3), "pool_s": round(pool_took, 3)})
    print(f"resource edit to served: a model {model_took * 1000:.0f} ms, a pool {pool_took * 1000:.0f} ms")


async def test_a_model_removed_from_the_resource_answers_404_model_not_found(
    gw: LocalGateway, kube: FakeKubeApiServer
) -> None:
    async with gw.client() as client:
        assert await _served(client, "sql-lora")
        async with Stream(client, "sql-lora", SPANNING_TOKENS) as stream:  # the very model removed
            changed, generation = _edit(
                kube, lambda s: [a.remove("sql-lora") for a in _llama_adapter_lists(s)]
            )
            await _until(lambda: _refused(client, "sql-lora"), "sql-lora refused", FOLLOW_DEADLINE_S)
            took = time.monotonic() - changed
            assert not stream.done, "the streamed answer should span the change"
        await _applied(kube, generation)
    record_figures("resource_follow_removed", {"seconds": round(took, 3)})
    print(f"resource edit to 404 model_not_found: {took * 1000:.0f} ms")


async def test_a_refused_edit_keeps_the_last_good_configuration_and_says_why_in_the_status(
    gw: LocalGateway, kube: FakeKubeApiServer
) -> None:
    before = _status(kube)
    good = before["appliedGeneration"]

    def bad_weight(s: dict[str, Any]) -> None:
        s.setdefault("profiles", {})["typo"] = {"weights": {"queue-depht": 1}}  # no such scorer

    async with gw.client() as client:
        async with Stream(client, LLAMA, SPANNING_TOKENS):
            _, generation = _edit(kube, bad_weight)

            async def said_why() -> bool:
                return _status(kube).get("observedGeneration") == generation

            await _until(said_why, "the refusal written into the status", 10)
            [ready] = _status(kube)["conditions"]
            assert ready["status"] == "False" and ready["reason"] == "Refused", ready
            assert f"generation {generation} refused, generation {good} stays in force" in ready["message"]
            assert _status(kube)["appliedGeneration"] == good
            assert await _served(client, LLAMA)  # the last good configuration serves on
        _, generation = _edit(kube, lambda s: s["profiles"].pop("typo"))  # put right: applied again
        await _applied(kube, generation)


async def test_the_xds_server_killed_and_restarted_under_load_fails_no_request(
    gw: LocalGateway, kube: FakeKubeApiServer
) -> None:
    """Envoy keeps the last configuration it received while its xDS server is gone; the
    restarted server lists the resource before it serves (never the file's older content)."""
    results: list[int] = []
    stop = asyncio.Event()

    async def load(client: httpx.AsyncClient) -> None:
        while not stop.is_set():
            try:
                r = await client.post("/v1/chat/completions", json=chat(LLAMA, max_tokens=4))
                results.append(r.status_code)
            except httpx.HTTPError:  # a failed request, counted as such
                results.append(0)

    async with gw.client() as client:
        assert await _served(client, NEW)  # the resource's model, which the file never had
        workers = [asyncio.create_task(load(client)) for _ in range(4)]
        try:
            async with Stream(client, NEW, SPANNING_TOKENS):
                await _until(_count_reached(results, 20), "load running", 30)
                proc = gw.restart("xds", kill=True)
                port = int(proc.popen.args[proc.popen.args.index("--port") + 1])  # type: ignore[index, union-attr]
                during = len(results)
                await _until(_xds_serving(port), "the xDS server back", 30)
                # Envoy retries its ADS stream with a backoff: the next change is timed from
                # the moment it is connected again.
                await _until(_envoy_connected(gw), "Envoy connected to the new xDS server", 60)
                await _until(_count_reached(results, len(results) + 20), "load after the restart", 30)
                assert await _served(client, NEW)
        finally:
            stop.set()
            await asyncio.gather(*workers)
        assert len(results) > during and set(results) == {200}, sorted(set(results))

        changed, generation = _edit(kube, lambda s: [a.remove(NEW) for a in _llama_adapter_lists(s)])
        await _until(lambda: _refused(client, NEW), f"{NEW} refused after the restart", FOLLOW_DEADLINE_S)
        took = time.monotonic() - changed
        record_figures("resource_follow_after_xds_restart", {"seconds": round(took, 3)})
        print(f"after the restart, resource edit to 404: {took * 1000:.0f} ms")
        await _applied(kube, generation)
    print(f"{len(results)} requests across the xDS server's kill and restart, all 200")


def _count_reached(results: list[int], count: int) -> Callable[[], Any]:
    async def reached() -> bool:
        return len(results) >= count

    return reached


def _xds_serving(port: int) -> Callable[[], Any]:
    async def serving() -> bool:
        try:
            return await asyncio.to_thread(grpc_serving, port)
        except grpc.RpcError:  # not listening yet: it lists the resource first
            return False

    return serving


def _envoy_connected(gw: LocalGateway) -> Callable[[], Any]:
    async def connected() -> bool:
        async with httpx.AsyncClient() as admin:
            r = await admin.get(
                f"http://127.0.0.1:{gw.admin_port}/stats?filter=control_plane.connected_state"
            )
        return "control_plane.connected_state: 1" in r.text

    return connected
