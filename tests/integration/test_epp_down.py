"""With the EPP gone, fail-closed gives a JSON 5xx quickly instead of a hang."""

from __future__ import annotations

import time

from devstack.launch import LocalGateway
from tests.integration.conftest import chat


async def test_epp_down_is_a_json_5xx_not_a_hang(gateway: LocalGateway) -> None:
    gateway.procs["epp-qwen3-32b"].stop()
    started = time.monotonic()
    async with gateway.client() as client:
        r = await client.post("/v1/chat/completions", json=chat("qwen3-32b"))
        healthy = await client.post("/v1/chat/completions", json=chat("llama-3.1-8b-instruct"))
    assert time.monotonic() - started < 10
    assert 500 <= r.status_code < 600
    assert r.headers["content-type"] == "application/json"
    assert r.json()["error"]["message"]
    assert healthy.status_code == 200  # the other pool keeps working
