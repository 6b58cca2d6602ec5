"""Precise prefix scoring through the real stack: Envoy, BBR, the EPP (tokenizer files, KV-event
subscribers) and a modelsim fleet tokenizing with the same files and publishing KV events."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from devstack.launch import LocalGateway
from epp.datalayer.tokenizer import load_tokenizer
from modelsim.build_tokenizer import OUT as SHIPPED
from tests.integration.busy_pods import debug_pool, wait_for
from tests.integration.conftest import local_gateway, use_profile

MODEL = "llama-3.1-8b-instruct"
POOL = "llama-3-1-8b-instruct"
KV = {
    "enable_kv_cache_events": True,
    "endpoint": "tcp://127.0.0.1:0",
    "replay_endpoint": "tcp://127.0.0.1:0",
}
FLEET = {
    "time_scale": 20.0,
    "pods": [
        {"name": "llama", "model": MODEL, "replicas": 2, "tokenizer": "sim-llama3-12k", "kv_events": KV}
    ],
}
DOC = (Path(__file__).resolve().parents[2] / "docs" / "scheduling.md").read_text()


def _patch(config: dict) -> None:
    config["pools"][0]["models"][0]["tokenizer"] = str(SHIPPED)
    use_profile(config, "precise", {"precise-prefix-cache": 10, "queue": 1})


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalGateway]:
    yield from local_gateway(tmp_path_factory, "precise", fleet=FLEET, config_patch=_patch)


async def _debug(gw: LocalGateway) -> dict:
    return await debug_pool(gw, POOL)


def _scores(decision: str) -> dict[str, float]:
    """address -> precise-prefix-cache score, from the x-gateway-decision header."""
    ranking = decision.split("; ", 2)[2]  # after "chosen=...; profile=...; "
    return {
        m.group(1): float(m.group(2))
        for m in re.finditer(r"(\S+:\d+) [^,]*?precise-prefix-cache=([0-9.]+)", ranking)
    }


async def test_a_growing_conversation_follows_its_kv_blocks(gateway: LocalGateway) -> None:
    turn1 = [
        {"role": "system", "content": DOC[:2000]},
        {"role": "user", "content": "Which pod holds this prefix?"},
    ]
    headers = {"x-gateway-decision": "1"}
    async with gateway.client(timeout=30) as client:
        r = await client.post(
            "/v1/chat/completions", json={"model": MODEL, "messages": turn1, "max_tokens": 8}, headers=headers
        )
        assert r.status_code == 200, r.text
        pod = r.headers["x-modelsim-pod"]
        address = next(p["address"] for p in gateway.pods if p["name"] == pod)
        answer = r.json()["choices"][0]["message"]["content"]

        async def indexed() -> bool:
            debug = await _debug(gateway)
            return (
                debug["prefix_scoring"].get(address) == {MODEL: "precise"}
                and debug["kv_events"]["pods"][address]["blocks"] > 0
            )

        await wait_for(indexed)
        turn2 = [*turn1, {"role": "assistant", "content": answer}, {"role": "user", "content": "Again?"}]
        r = await client.post(
            "/v1/chat/completions", json={"model": MODEL, "messages": turn2, "max_tokens": 8}, headers=headers
        )
        assert r.status_code == 200, r.text
        assert r.headers["x-modelsim-pod"] == pod
    tok = load_tokenizer(SHIPPED)
    expected = (len(tok.encode_chat(turn1)) // 16) / (len(tok.encode_chat(turn2)) // 16)
    scores = _scores(r.headers["x-gateway-decision"])
    assert scores[address] == pytest.approx(expected, abs=1e-3)  # the engine's own blocks
    assert [v for a, v in scores.items() if a != address] == [0.0]
    debug = await _debug(gateway)
    assert debug["tokenizers"]["models"][MODEL]["cache_hits"] > 0
