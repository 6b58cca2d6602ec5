"""With the EPP gone, fail-closed gives a JSON 5xx quickly instead of a hang (both modes)."""

from __future__ import annotations

import time

from devstack.launch import LocalGateway
from tests.integration.conftest import chat


async def test_epp_down_is_a_json_5xx_not_a_hang(gateway_each_mode: LocalGateway) -> None:
    gateway = gateway_each_mode
    # Single-hop: one EPP serves every pool, so every pool is down with it.
    gateway.procs["epp" if gateway.single_hop else "epp-qwen3-32b"].stop()
    started = time.monotonic()
    async with gateway.client() as client:
        r = await client.post("/v1/chat/completions", json=chat("qwen3-32b"))
        other = await client.post("/v1/chat/completions", json=chat("llama-3.1-8b-instruct"))
    assert time.monotonic() - started < 10
    assert r.status_code == 503, r.text
    assert r.headers["content-type"] == "application/json"
    assert r.json()["error"]["message"]
    if gateway.single_hop:
        assert other.status_code == 503 and other.json()["error"]["message"]
    else:
        assert other.status_code == 200  # the other pool keeps working
