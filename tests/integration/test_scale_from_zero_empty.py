"""Scale from zero with no pod discovered at all, through the real Envoy: the pool's endpoint
list is empty (an autoscaler took it to zero before the gateway ever saw a pod). A request is
held, shows as demand on /metrics, and is served once the operator's (or discovery's) edit of
the live configuration names the new pod and the EPP has scraped it. (A pod known but down:
tests/integration/test_scale_from_zero.py.)"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from devstack.launch import LocalGateway, Proc, start_fleet, start_local_gateway
from tests.integration.busy_pods import pool_state, wait_for
from tests.integration.conftest import chat
from tests.reliability.gateway_helpers import metric_value

MODEL = "llama-3.1-8b-instruct"
POOL = "llama-3-1-8b-instruct"
FLEET = {"time_scale": 5.0, "pods": [{"name": "llama", "model": MODEL, "profile": "h100-llama3.1-8b"}]}


class EmptyPool:
    """The gateway with its pool's endpoint list empty, and the pod it will be told about."""

    def __init__(self, workdir: Path) -> None:
        self.fleet: Proc
        self.fleet, self.pods = start_fleet(workdir / "fleet", FLEET)

        def patch(config: dict) -> None:
            pool = config["pools"][0]
            self.endpoints = pool["endpoints"]
            pool["endpoints"] = []
            pool["scaleFromZero"] = {"maxWaitMs": 9_000}
            config["admission"] = {"retryAfterSeconds": 3}

        self.gw: LocalGateway = start_local_gateway(workdir / "gw", pods=self.pods, config_patch=patch)

    def discover(self) -> None:
        config = self.gw.read_config()
        config["pools"][0]["endpoints"] = self.endpoints
        self.gw.write_config(config)


@pytest.fixture(scope="module")
def empty(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmptyPool]:
    workdir = tmp_path_factory.mktemp("empty-pool")
    (workdir / "fleet").mkdir()
    e = EmptyPool(workdir)
    try:
        yield e
    finally:
        e.gw.stop()
        e.fleet.stop()


async def waiting(gw: LocalGateway) -> float:
    async with httpx.AsyncClient() as c:
        text = (await c.get(f"http://127.0.0.1:{gw.epp_metrics_ports[POOL]}/metrics")).text
    return metric_value(text, "gateway_pool_requests_waiting_for_endpoints", inference_pool=POOL)


async def test_no_pod_discovered_within_the_wait_is_a_503_with_retry_after(empty: EmptyPool) -> None:
    assert await pool_state(empty.gw, POOL) == {}
    async with empty.gw.client(timeout=60) as client:
        response = await client.post("/v1/chat/completions", json=chat(MODEL, max_tokens=4))
    assert response.status_code == 503, response.text
    assert response.headers["retry-after"] == "3"
    assert response.json()["error"]["code"] == "no_endpoint_available"
    assert await waiting(empty.gw) == 0


async def test_a_request_held_with_no_pod_discovered_is_served_once_one_is(empty: EmptyPool) -> None:
    gw = empty.gw
    async with gw.client(timeout=60) as client:
        held = asyncio.create_task(client.post("/v1/chat/completions", json=chat(MODEL, max_tokens=4)))

        async def demand_shown() -> bool:
            return await waiting(gw) == 1

        await wait_for(demand_shown)  # the activation signal, with nothing discovered
        assert not held.done()
        empty.discover()  # the pod appears in the live configuration
        response = await held
    assert response.status_code == 200, response.text
    assert response.headers["x-modelsim-pod"] == "llama"

    async def settled() -> bool:
        state = await pool_state(gw, POOL)
        return bool(state) and not any(p["inflight_requests"] for p in state.values())

    await wait_for(settled)
    assert await waiting(gw) == 0
