"""InferenceModelRewrite and InferenceObjective end to end: the real Envoy, BBR and the EPPs as
processes (`start_local_gateway`), their watches on the fake API server through a kubeconfig,
and what the model-server pods see.

Fleet: one llama pod allowing 2 running sequences (so `busy` builds a real queue) and one qwen
pod; `thresholds.queue: 1` makes the llama pool saturated while it is busy.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import httpx
import pytest

from devstack.launch import LocalGateway, pool_name_for, start_local_gateway
from modelsim.server import POD_HEADER
from tests.fakes.kube_apiserver import (
    INFERENCE_MODEL_REWRITES,
    INFERENCE_OBJECTIVES,
    FakeKubeApiServer,
    write_kubeconfig,
)
from tests.integration.busy_pods import busy, pool_state
from tests.integration.conftest import chat

pytestmark = pytest.mark.integration

LLAMA, QWEN = "llama-3.1-8b-instruct", "qwen3-32b"
LLAMA_POOL = pool_name_for(LLAMA)
FLEET = {
    "time_scale": 5.0,
    "profiles": {"two-seqs": {"base": "h100-llama3.1-8b", "max_num_seqs": 2}},
    "pods": [
        {"name": "llama", "model": LLAMA, "profile": "two-seqs", "replicas": 1},
        {"name": "qwen", "model": QWEN, "profile": "h100x2-qwen3-32b", "replicas": 1},
    ],
}


@pytest.fixture(scope="module")
def kube() -> Iterator[FakeKubeApiServer]:
    with FakeKubeApiServer() as server:
        yield server


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory, kube: FakeKubeApiServer) -> Iterator[LocalGateway]:
    workdir = tmp_path_factory.mktemp("llmd")
    gw = start_local_gateway(
        workdir,
        fleet=FLEET,
        config_extra={"thresholds": {"queue": 1}},
        bbr_args=["--inference-model-rewrites", "default"],
        epp_args=["--inference-objectives", "default"],
        service_env={"KUBECONFIG": str(write_kubeconfig(workdir / "kubeconfig", kube.url))},
    )
    try:
        kube.wait_watching(INFERENCE_MODEL_REWRITES, 1, timeout=30)  # BBR
        kube.wait_watching(INFERENCE_OBJECTIVES, 2, timeout=30)  # one EPP per pool
        yield gw
    finally:
        gw.stop()


async def post(gw: LocalGateway, model: str, headers: dict[str, str] | None = None) -> httpx.Response:
    async with gw.client() as client:
        return await client.post("/v1/chat/completions", json=chat(model, max_tokens=2), headers=headers)


async def eventually(check, what: str, within: float = 10.0) -> float:  # type: ignore[no-untyped-def]
    """Poll the async `check` until it holds; returns the seconds it took."""
    started = time.monotonic()
    while not await check():
        assert time.monotonic() - started < within, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)
    return time.monotonic() - started


def pod_names(gw: LocalGateway, model: str) -> set[str]:
    return {p["name"] for p in gw.pods if p["model"] == model}


async def test_a_rewrite_renames_reroutes_and_survives_an_invalid_version(
    gateway: LocalGateway, kube: FakeKubeApiServer
) -> None:
    def alias(target: str) -> dict:
        rule = {"matches": [{"model": {"value": "assistant"}}], "targets": [{"modelRewrite": target}]}
        return {"metadata": {"name": "alias"}, "spec": {"poolRef": {"name": LLAMA_POOL}, "rules": [rule]}}

    async def served_by(model: str) -> bool:
        r = await post(gateway, "assistant")
        return r.status_code == 200 and r.headers.get(POD_HEADER) in pod_names(gateway, model)

    assert (await post(gateway, "assistant")).status_code == 404
    kube.apply(INFERENCE_MODEL_REWRITES, alias(LLAMA))
    took = await eventually(lambda: served_by(LLAMA), "the rename")
    print(f"rename effective through Envoy {took * 1000:.0f} ms after the change")
    r = await post(gateway, "assistant")
    assert r.json()["model"] == LLAMA  # the pod was asked for the rewritten model

    kube.apply(INFERENCE_MODEL_REWRITES, alias(QWEN))  # now to the other pool's model
    await eventually(lambda: served_by(QWEN), "the rewrite to the qwen pool")
    assert (await post(gateway, "assistant")).json()["model"] == QWEN

    kube.apply(INFERENCE_MODEL_REWRITES, alias("no-such-model"))
    log = gateway.workdir / "logs" / "bbr.log"

    async def rejected() -> bool:
        return "InferenceModelRewrite alias rejected" in log.read_text()

    await eventually(rejected, "the invalid version logged as rejected")
    assert await served_by(QWEN)  # the last good version stays

    kube.delete(INFERENCE_MODEL_REWRITES, "alias")

    async def gone() -> bool:
        return (await post(gateway, "assistant")).status_code == 404

    await eventually(gone, "the deleted rewrite to stop applying")


async def admission(gw: LocalGateway, headers: dict[str, str] | None = None) -> int | None:
    """429 when shed; None when admitted (still queued at the busy pod after 2 s: a request the
    EPP lets through waits behind the long ones, so its answer would take as long as they do)."""
    try:
        async with gw.client(timeout=2) as client:
            r = await client.post("/v1/chat/completions", json=chat(LLAMA, max_tokens=2), headers=headers)
    except httpx.TimeoutException:
        return None
    return r.status_code


async def test_an_objective_makes_its_requests_sheddable_while_the_pool_is_saturated(
    gateway: LocalGateway, kube: FakeKubeApiServer
) -> None:
    header = {"x-gateway-inference-objective": "batch-jobs"}
    objective = {
        "metadata": {"name": "batch-jobs"},
        "spec": {"priority": -1, "poolRef": {"name": LLAMA_POOL}},
    }

    async with busy(gateway, "llama", 8):  # 2 running, 6 waiting: saturated for 3 generations
        assert await admission(gateway, header) is None  # no such InferenceObjective: priority 0
        kube.apply(INFERENCE_OBJECTIVES, objective)

        async def shed() -> bool:
            return await admission(gateway, header) == 429

        took = await eventually(shed, "requests naming the objective shed")
        print(f"objective effective through Envoy {took * 1000:.0f} ms after the change")
        async with gateway.client() as client:
            r = await client.post("/v1/chat/completions", json=chat(LLAMA, max_tokens=2), headers=header)
        assert r.status_code == 429 and r.json()["error"]["type"] == "rate_limit_error"
        assert await admission(gateway) is None  # the same model without the header: admitted

        kube.delete(INFERENCE_OBJECTIVES, "batch-jobs")

        async def admitted() -> bool:
            return await admission(gateway, header) != 429

        await eventually(admitted, "the deleted objective to stop applying")
        state = await pool_state(gateway, LLAMA_POOL)
        assert all(e["metrics"]["waiting"] >= 1 for e in state.values()), state  # still saturated
