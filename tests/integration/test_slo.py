"""Latency objectives through the real Envoy: a trusted caller's `x-gateway-slo-ttft-ms` is
honoured (a sheddable request no pod can serve in time gets 429 with Retry-After, a loose one is
served) and a malformed one is a JSON 400. (An untrusted caller's header is ignored:
tests/unit/test_slo.py.)"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from devstack.launch import LocalGateway, dev_trust, start_local_gateway
from extproc.headers import OBJECTIVE_HEADER, SLO_TTFT_HEADER
from tests.integration.busy_pods import pool_state, wait_for
from tests.integration.conftest import chat

MODEL = "llama-3.1-8b-instruct"
POOL = "llama-3-1-8b-instruct"
FLEET = {
    "time_scale": 2.0,
    "pods": [{"name": "llama", "model": MODEL, "profile": "h100-llama3.1-8b", "replicas": 2}],
}


def _patch(config: dict) -> None:
    dev_trust(config)
    config["listener"]["trust"]["internal"] = True  # every caller trusted (the header counts)
    config["profiles"] = {"shed": {"weights": {"predicted-ttft": 1}, "priority": -1}}
    config["pools"][0]["models"][0]["objectives"] = ["shed"]
    config["admission"] = {"retryAfterSeconds": 2}


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalGateway]:
    gw = start_local_gateway(tmp_path_factory.mktemp("slo"), fleet=FLEET, config_patch=_patch)
    try:
        yield gw
    finally:
        gw.stop()


async def test_objectives_through_envoy(gateway: LocalGateway) -> None:
    shed = {OBJECTIVE_HEADER: "shed"}
    async with gateway.client(timeout=60) as client:

        async def scraped() -> bool:  # predictions need a page from each pod
            state = await pool_state(gateway, POOL)
            return bool(state) and all(p.get("metrics") for p in state.values())

        await wait_for(scraped)
        post = client.post
        tight = await post("/v1/chat/completions", json=chat(MODEL), headers={**shed, SLO_TTFT_HEADER: "1"})
        assert tight.status_code == 429, tight.text
        assert tight.headers["retry-after"] == "2"
        assert tight.json()["error"]["code"] == "slo_unattainable"
        loose = await post(
            "/v1/chat/completions", json=chat(MODEL), headers={**shed, SLO_TTFT_HEADER: "60000"}
        )
        assert loose.status_code == 200, loose.text
        bad = await post("/v1/chat/completions", json=chat(MODEL), headers={SLO_TTFT_HEADER: "soon"})
        assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_slo", bad.text

    async def settled() -> bool:
        return not any(p["inflight_requests"] for p in (await pool_state(gateway, POOL)).values())

    await wait_for(settled)
