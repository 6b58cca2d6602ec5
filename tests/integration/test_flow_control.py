"""Flow control through the real Envoy: requests wait in the EPP while every pod is saturated.

Pods allow 2 running sequences and the pool saturates at 1 waiting request, so `busy(gw, pod, 4)`
(requests sent straight to the pod, seen only through the scrape) saturates a pod. Each test
ends with nothing queued and nothing in flight.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import httpx
import pytest

from devstack.launch import LocalGateway, dev_trust, start_local_gateway
from tests.integration.busy_pods import busy, pool_state, wait_for
from tests.integration.conftest import chat
from tests.reliability.gateway_helpers import metric_value

MODEL = "llama-3.1-8b-instruct"
POOL = "llama-3-1-8b-instruct"
FLEET = {
    "time_scale": 5.0,
    "profiles": {"two-seqs": {"base": "h100-llama3.1-8b", "max_num_seqs": 2}},
    "pods": [{"name": "llama", "model": MODEL, "profile": "two-seqs", "replicas": 2}],
}
SHEDDABLE = {"x-gateway-inference-objective": "sheddable"}
FLOW = {
    "enabled": True,
    "standard": {"maxQueue": 1, "maxWaitMs": 9_000},
    "sheddable": {"maxQueue": 8, "maxWaitMs": 300},
}


def _patch(config: dict) -> None:
    config["profiles"] = {"sheddable": {"weights": {"queue": 1}, "priority": -1}}
    config["thresholds"] = {"queue": 1}
    config["flowControl"] = FLOW
    dev_trust(config)
    config["pools"][0]["models"][0]["objectives"] = ["sheddable"]


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalGateway]:
    gw = start_local_gateway(tmp_path_factory.mktemp("flow"), fleet=FLEET, config_patch=_patch)
    try:
        yield gw
    finally:
        gw.stop()


async def metrics(gw: LocalGateway) -> str:
    async with httpx.AsyncClient() as c:
        return (await c.get(f"http://127.0.0.1:{gw.epp_metrics_ports[POOL]}/metrics")).text


async def queued(gw: LocalGateway, band: str) -> float:
    return metric_value(await metrics(gw), "inference_flow_control_queue_size", band=band)


async def outcomes(gw: LocalGateway, band: str, outcome: str) -> float:
    text = await metrics(gw)
    return metric_value(text, "inference_flow_control_outcomes_total", band=band, outcome=outcome)


async def settled(gw: LocalGateway) -> None:
    """Nothing queued in any band, nothing in flight."""

    async def empty() -> bool:
        state = await pool_state(gw, POOL)
        if any(p["inflight_requests"] for p in state.values()):
            return False
        text = await metrics(gw)
        return all(
            metric_value(text, "inference_flow_control_queue_size", band=b) == 0
            for b in ("critical", "standard", "sheddable")
        )

    await wait_for(empty)
    text = await metrics(gw)
    assert metric_value(text, "inference_objective_running_requests", model_name=MODEL) == 0


class saturated:  # a context manager, like `busy`
    """Both pods over the threshold, for as long as the block runs."""

    def __init__(self, gw: LocalGateway) -> None:
        self._a, self._b = busy(gw, "llama-0", 4), busy(gw, "llama-1", 4)

    async def __aenter__(self) -> None:
        await asyncio.gather(self._a.__aenter__(), self._b.__aenter__())

    async def __aexit__(self, *exc: object) -> None:
        await asyncio.gather(self._a.__aexit__(*exc), self._b.__aexit__(*exc))


async def test_a_queued_request_goes_when_capacity_frees_and_others_overflow(gateway: LocalGateway) -> None:
    dispatched_before = await outcomes(gateway, "standard", "dispatched")
    async with gateway.client() as client:
        async with saturated(gateway):
            waiting = asyncio.create_task(client.post("/v1/chat/completions", json=chat(MODEL, max_tokens=2)))

            async def one_queued() -> bool:
                return await queued(gateway, "standard") == 1

            await wait_for(one_queued)
            overflow = await client.post("/v1/chat/completions", json=chat(MODEL, "second", max_tokens=2))
            assert overflow.status_code == 429
            assert int(overflow.headers["retry-after"]) >= 1
            error = overflow.json()["error"]
            assert error["type"] == "rate_limit_error" and error["code"] == "flow_control_queue_full"
            assert not waiting.done()  # still held in the EPP, not sent to a full pod
        # The busy requests end (the block closes): the next scrape shows headroom.
        r = await waiting
    assert r.status_code == 200, r.text
    assert await outcomes(gateway, "standard", "dispatched") == dispatched_before + 1
    assert await outcomes(gateway, "standard", "overflow") >= 1
    await settled(gateway)


async def test_sheddable_requests_time_out_in_their_band(gateway: LocalGateway) -> None:
    async with saturated(gateway), gateway.client() as client:
        r = await client.post("/v1/chat/completions", json=chat(MODEL), headers=SHEDDABLE)
    assert r.status_code == 429
    assert int(r.headers["retry-after"]) >= 1
    error = r.json()["error"]
    assert error["type"] == "rate_limit_error" and error["code"] == "flow_control_timeout"
    assert "sheddable queue" in error["message"]
    assert await outcomes(gateway, "sheddable", "timeout") >= 1
    await settled(gateway)


async def test_a_client_leaving_while_queued_leaves_nothing_behind(gateway: LocalGateway) -> None:
    cancelled_before = await outcomes(gateway, "standard", "cancelled")
    async with saturated(gateway):
        async with gateway.client() as client:
            leaving = asyncio.create_task(client.post("/v1/chat/completions", json=chat(MODEL, max_tokens=2)))

            async def one_queued() -> bool:
                return await queued(gateway, "standard") == 1

            await wait_for(one_queued)
            leaving.cancel()  # the connection closes: Envoy resets the stream, the EPP's is cancelled
            with pytest.raises(asyncio.CancelledError):
                await leaving

        async def left() -> bool:
            return await queued(gateway, "standard") == 0

        await wait_for(left)  # while the pool is still saturated: the client's departure did it
        assert await outcomes(gateway, "standard", "cancelled") == cancelled_before + 1
    await settled(gateway)
