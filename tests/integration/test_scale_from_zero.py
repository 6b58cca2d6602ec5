"""Scale from zero through the real Envoy: a pool whose only pod is down holds new requests
(`pools[].scaleFromZero`), shows the demand on /metrics, serves them once the pod is up, and
answers 503 with Retry-After when none comes within the wait."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from devstack.launch import LocalGateway, Proc, free_port, start_fleet, start_local_gateway
from tests.integration.busy_pods import pool_state, wait_for
from tests.integration.conftest import chat
from tests.reliability.gateway_helpers import metric_value

MODEL = "llama-3.1-8b-instruct"
POOL = "llama-3-1-8b-instruct"
WAIT_MS = 9_000
WAITING = "gateway_pool_requests_waiting_for_endpoints"


class Scaled:
    """The gateway and its one pod, which the tests stop and start on the same port."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.spec = {
            "time_scale": 5.0,
            "pods": [{"name": "llama", "model": MODEL, "profile": "h100-llama3.1-8b", "port": free_port()}],
        }
        self.fleet: Proc | None = None
        self.starts = 0
        pods = self.start_pod()
        self.stop_pod()  # scaled to zero before the gateway ever reads it

        def patch(config: dict) -> None:
            config["pools"][0]["scaleFromZero"] = {"maxWaitMs": WAIT_MS}
            config["admission"] = {"retryAfterSeconds": 3}

        self.gw: LocalGateway = start_local_gateway(workdir / "gw", pods=pods, config_patch=patch)

    def start_pod(self) -> list[dict]:
        self.starts += 1
        workdir = self.workdir / f"fleet-{self.starts}"
        workdir.mkdir()
        self.fleet, pods = start_fleet(workdir, self.spec)
        return pods

    def stop_pod(self) -> None:
        if self.fleet is not None:
            self.fleet.stop()
            self.fleet = None


@pytest.fixture(scope="module")
def scaled(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scaled]:
    s = Scaled(tmp_path_factory.mktemp("zero"))
    try:
        yield s
    finally:
        s.stop_pod()
        s.gw.stop()


async def waiting(gw: LocalGateway) -> float:
    async with httpx.AsyncClient() as c:
        text = (await c.get(f"http://127.0.0.1:{gw.epp_metrics_ports[POOL]}/metrics")).text
    return metric_value(text, WAITING, inference_pool=POOL)


async def nothing_in_flight(gw: LocalGateway) -> bool:
    state = await pool_state(gw, POOL)
    return not any(p["inflight_requests"] for p in state.values()) and await waiting(gw) == 0


async def test_a_request_held_while_the_pool_is_at_zero_is_served_when_the_pod_is_up(scaled: Scaled) -> None:
    gw = scaled.gw
    async with gw.client(timeout=60) as client:
        held = asyncio.create_task(client.post("/v1/chat/completions", json=chat(MODEL, max_tokens=4)))

        async def demand_shown() -> bool:
            return await waiting(gw) == 1

        await wait_for(demand_shown)  # the activation signal an autoscaler reads
        assert not held.done()
        scaled.start_pod()  # the autoscaler's pod: same address, up now
        response = await held
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["message"]["content"]
    await wait_for(lambda: nothing_in_flight(gw))


async def test_no_pod_within_the_wait_is_a_503_with_retry_after(scaled: Scaled) -> None:
    gw = scaled.gw
    scaled.stop_pod()

    async def unready() -> bool:  # the EPP has seen the pod's scrapes fail
        state = await pool_state(gw, POOL)
        return all(not p.get("healthy", True) for p in state.values())

    await wait_for(unready)
    async with gw.client(timeout=60) as client:
        response = await client.post("/v1/chat/completions", json=chat(MODEL, max_tokens=4))
    assert response.status_code == 503, response.text
    assert response.headers["retry-after"] == "3"
    assert response.json()["error"]["code"] == "no_endpoint_available"
    await wait_for(lambda: nothing_in_flight(gw))
