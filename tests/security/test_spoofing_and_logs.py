"""Clients cannot steer traffic, and logs carry neither prompts nor credentials."""

from __future__ import annotations

import uuid

import pytest

from gateway.launch import LocalGateway
from tests.integration.conftest import chat
from tests.security.conftest import LLAMA, QWEN

PATH = "/v1/chat/completions"


@pytest.mark.parametrize(
    "spoof",
    [
        pytest.param({"x-gateway-model-name": QWEN}, id="forged-model-header"),
        pytest.param(
            {"X-Gateway-Model-Name": QWEN, "X-Gateway-Destination-Endpoint": "QWEN_POD"}, id="upper-case"
        ),
        pytest.param({"x-envoy-original-dst-host": "QWEN_POD"}, id="envoy-original-dst-header"),
        pytest.param(
            {"connection": "keep-alive, x-gateway-model-name", "x-gateway-model-name": QWEN}, id="hop-by-hop"
        ),
        pytest.param({"x-gateway-destination-endpoint": "QWEN_POD,QWEN_POD"}, id="destination-list"),
        pytest.param({"x-gateway-base-model-name": QWEN}, id="forged-base-model"),
    ],
)
async def test_spoofed_routing_headers_never_steer(gateway: LocalGateway, spoof: dict[str, str]) -> None:
    qwen_pod = gateway.pods_of(QWEN)[0]
    headers = {k: v.replace("QWEN_POD", qwen_pod) for k, v in spoof.items()}
    async with gateway.client() as client:
        for _ in range(3):
            r = await client.post(PATH, json=chat(LLAMA), headers=headers)
            assert r.status_code == 200, r.text
            assert r.headers["x-modelsim-pod"].startswith("llama-")


async def test_forged_model_header_without_body_routes_nowhere(gateway: LocalGateway) -> None:
    async with gateway.client() as client:
        r = await client.get(PATH, headers={"x-gateway-model-name": QWEN})
    assert r.status_code == 404
    assert r.json()["error"]["code"] == "route_not_found"


async def test_logs_hold_no_prompt_and_no_bearer_token(gateway: LocalGateway) -> None:
    prompt = f"PROMPT-CANARY-{uuid.uuid4().hex}"
    token = f"sk-TOKEN-CANARY-{uuid.uuid4().hex}"
    auth = {"authorization": f"Bearer {token}"}
    async with gateway.client() as client:
        ok = await client.post(PATH, json=chat(LLAMA, prompt), headers=auth)
        bad = await client.post(PATH, json={"model": 42, "prompt": prompt}, headers=auth)
        missing = await client.post(PATH, json={"model": "no-such", "prompt": prompt}, headers=auth)
    assert (ok.status_code, bad.status_code, missing.status_code) == (200, 400, 404)
    logs = {p.name: p.read_text(errors="replace") for p in (gateway.workdir / "logs").glob("*.log")}
    assert {"bbr.log", "envoy.log", "fleet.log"} <= set(logs)
    for name, text in logs.items():
        assert prompt not in text, f"prompt leaked into {name}"
        assert token not in text, f"bearer token leaked into {name}"
