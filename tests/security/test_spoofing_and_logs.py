"""Clients cannot steer traffic on either pool kind (static, ORIGINAL_DST), not even to a trap
listener outside every pool, and logs carry neither prompts nor credentials."""

from __future__ import annotations

import uuid

import pytest

from devstack.launch import LocalGateway
from tests.integration.conftest import chat
from tests.security.conftest import LLAMA, QWEN, Trap

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
        # A listener outside every pool: what an ORIGINAL_DST cluster would dial if it trusted a header.
        pytest.param({"x-gateway-destination-endpoint": "TRAP"}, id="destination-to-trap"),
        pytest.param({"X-Gateway-Destination-Endpoint": "TRAP,TRAP"}, id="destination-list-to-trap"),
        pytest.param({"x-envoy-original-dst-host": "TRAP"}, id="envoy-original-dst-to-trap"),
        pytest.param(
            {"x-envoy-original-dst-host": "TRAP", "x-gateway-destination-endpoint": "TRAP"}, id="both-to-trap"
        ),
        pytest.param(
            {"connection": "x-gateway-destination-endpoint", "x-gateway-destination-endpoint": "TRAP"},
            id="hop-by-hop-to-trap",
        ),
        pytest.param({"host": "TRAP"}, id="authority-to-trap"),
    ],
)
async def test_spoofed_routing_headers_never_steer(
    kind_gateway: LocalGateway, trap: Trap, spoof: dict[str, str]
) -> None:
    qwen_pod = kind_gateway.pods_of(QWEN)[0]
    headers = {k: v.replace("QWEN_POD", qwen_pod).replace("TRAP", trap.address) for k, v in spoof.items()}
    async with kind_gateway.client() as client:
        for _ in range(3):
            r = await client.post(PATH, json=chat(LLAMA), headers=headers)
            assert r.status_code == 200, r.text
            assert r.headers["x-modelsim-pod"].startswith("llama-")
    assert trap.hits == []


async def test_forged_model_header_without_body_routes_nowhere(
    kind_gateway: LocalGateway, trap: Trap
) -> None:
    headers = {"x-gateway-model-name": QWEN, "x-gateway-destination-endpoint": trap.address}
    async with kind_gateway.client() as client:
        got = await client.get(PATH, headers=headers)  # Envoy's 405 before any service runs
        posted = await client.post(PATH, headers=headers)  # no body: nothing to route on
    assert (got.status_code, got.json()["error"]["code"]) == (405, "method_not_allowed")
    assert (posted.status_code, posted.json()["error"]["code"]) == (400, "model_required")
    assert trap.hits == []


@pytest.mark.parametrize(
    ("method", "content", "status", "code"),
    [
        pytest.param("POST", b"", 400, "model_required", id="forged-model-header-empty-body"),
        pytest.param("POST", b"{not json", 400, "invalid_json", id="bad-json"),
        pytest.param(
            "POST", b'{"model": "no-such", "prompt": "x"}', 404, "model_not_found", id="unknown-model"
        ),
    ],
)
async def test_requests_the_epp_never_routed_reach_no_listener(
    kind_gateway: LocalGateway, trap: Trap, method: str, content: bytes | None, status: int, code: str
) -> None:
    """No EPP choice means a JSON error, never a dial to a client-named address."""
    headers = {
        "x-gateway-model-name": LLAMA,
        "x-gateway-destination-endpoint": trap.address,
        "x-envoy-original-dst-host": trap.address,
        "content-type": "application/json",
    }
    async with kind_gateway.client() as client:
        r = await client.request(method, PATH, content=content, headers=headers)
    assert (r.status_code, r.json()["error"]["code"]) == (status, code), r.text
    assert r.headers["content-type"] == "application/json"
    assert trap.hits == []


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
