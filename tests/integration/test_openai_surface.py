"""Every OpenAI endpoint through the real Envoy, routed by `model`; session affinity across a
pod leaving the pool; `/v1/responses` follow-ups reaching the pod that holds the conversation."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import yaml

from devstack.launch import LocalGateway, start_local_gateway
from tests.integration.busy_pods import pool_state, wait_for
from tests.integration.conftest import chat

MODEL = "llama-3.1-8b-instruct"
POOL = "llama-3-1-8b-instruct"
FLEET = {
    "time_scale": 20.0,
    "pods": [
        {
            "name": "llama",
            "model": MODEL,
            "adapters": ["sql-lora"],
            "profile": "h100-llama3.1-8b",
            "replicas": 3,
        }
    ],
}
SESSION = "x-session-id"


def _patch(config: dict) -> None:
    config["profiles"] = {"sticky": {"weights": {"session-affinity": 10, "queue": 1, "kv-cache": 1}}}
    config["sessionAffinity"] = {"header": SESSION}
    config["pools"][0]["models"][0]["profile"] = "sticky"


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalGateway]:
    gw = start_local_gateway(tmp_path_factory.mktemp("surface"), fleet=FLEET, config_patch=_patch)
    try:
        yield gw
    finally:
        gw.stop()


async def test_each_endpoint_shape_is_routed_by_model(gateway: LocalGateway) -> None:
    async with gateway.client() as client:
        listed = await client.get("/v1/models")
        assert listed.status_code == 200
        assert {m["id"] for m in listed.json()["data"]} == {MODEL, "sql-lora"}
        calls = {
            "/v1/chat/completions": chat(MODEL, max_tokens=3),
            "/v1/completions": {"model": MODEL, "prompt": "Once upon", "max_tokens": 3},
            "/v1/embeddings": {"model": MODEL, "input": ["embed this", "and this"]},
            "/v1/responses": {
                "model": MODEL,
                "instructions": "Be brief.",
                "input": "Hi",
                "max_output_tokens": 3,
            },
        }
        objects = {}
        for path, body in calls.items():
            r = await client.post(path, json=body)
            assert r.status_code == 200, (path, r.text)
            assert r.headers["x-modelsim-pod"].startswith("llama-")
            objects[path] = r.json()["object"]
        lora = await client.post("/v1/embeddings", json={"model": "sql-lora", "input": "x"})
        assert lora.status_code == 200 and lora.json()["model"] == "sql-lora"
        unknown = await client.post("/v1/embeddings", json={"model": "nope", "input": "x"})
        assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "model_not_found"
    assert objects == {
        "/v1/chat/completions": "chat.completion",
        "/v1/completions": "text_completion",
        "/v1/embeddings": "list",
        "/v1/responses": "response",
    }


async def test_responses_follow_ups_reach_the_pod_that_holds_the_conversation(gateway: LocalGateway) -> None:
    # Three pods and no session header: a follow-up sent anywhere else gets the pod's 404.
    async with gateway.client() as client:
        for conversation in range(4):
            first = await client.post(
                "/v1/responses",
                json={"model": MODEL, "input": f"topic {conversation}", "max_output_tokens": 2},
            )
            assert first.status_code == 200, first.text
            pod, previous = first.headers["x-modelsim-pod"], first.json()["id"]
            for turn in range(2):
                body = {
                    "model": MODEL,
                    "input": f"more {turn}",
                    "previous_response_id": previous,
                    "max_output_tokens": 2,
                }
                r = await client.post("/v1/responses", json=body)
                assert r.status_code == 200, r.text
                assert r.headers["x-modelsim-pod"] == pod
                previous = r.json()["id"]


async def owners(gateway: LocalGateway, sessions: list[str]) -> dict[str, str]:
    out = {}
    async with gateway.client() as client:
        for s in sessions:
            r = await client.post(
                "/v1/chat/completions", json=chat(MODEL, max_tokens=1), headers={SESSION: s}
            )
            assert r.status_code == 200
            out[s] = r.headers["x-modelsim-pod"]
    return out


async def test_sessions_stay_put_and_a_leaving_pod_moves_only_its_own(gateway: LocalGateway) -> None:
    sessions = [f"user-{i}" for i in range(24)]
    before = await owners(gateway, sessions)
    assert await owners(gateway, sessions) == before  # sticky
    assert len(set(before.values())) == 3  # and spread over the pool
    leaving = "llama-2"
    address = next(p["address"] for p in gateway.pods if p["name"] == leaving)
    config = yaml.safe_load(gateway.config_path.read_text())
    endpoints = config["pools"][0]["endpoints"]
    config["pools"][0]["endpoints"] = [e for e in endpoints if e["address"] != address]
    gateway.config_path.write_text(yaml.safe_dump(config, sort_keys=False))

    async def two_pods() -> bool:
        return set(await pool_state(gateway, POOL)) == {e["address"] for e in config["pools"][0]["endpoints"]}

    await wait_for(two_pods)
    after = await owners(gateway, sessions)
    for s in sessions:
        if before[s] == leaving:
            assert after[s] != leaving
        else:
            assert after[s] == before[s], s
