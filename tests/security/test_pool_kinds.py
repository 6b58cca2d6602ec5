"""The request path on both pool kinds through the real Envoy: static pools (STATIC cluster,
OverrideHost) and ORIGINAL_DST pools, the kind every Kubernetes deployment runs."""

from __future__ import annotations

import json

from devstack.launch import LocalGateway
from tests.integration.conftest import chat
from tests.security.conftest import LLAMA, LLAMA_POOL, pool_inflight

PATH = "/v1/chat/completions"
CLUSTER_TYPE = {"static": "STATIC", "original_dst": "ORIGINAL_DST"}


def test_the_pool_cluster_is_of_the_requested_kind(kind_gateway: LocalGateway) -> None:
    clusters = {c["name"]: c for c in kind_gateway.envoy_config()["clusters"]}
    pool = clusters[f"pool-{LLAMA_POOL}"]
    assert pool["type"] == CLUSTER_TYPE[kind_gateway.pool_kind]
    if kind_gateway.pool_kind == "original_dst":
        lb = pool["original_dst_lb_config"]
        assert not lb.get("use_http_header")  # Envoy's dump leaves out fields at their default
        assert lb["metadata_key"] == {"key": "envoy.lb", "path": [{"key": "x-gateway-destination-endpoint"}]}


async def test_chat_completion_is_served_by_a_pool_pod(kind_gateway: LocalGateway) -> None:
    served = set()
    async with kind_gateway.client() as client:
        for i in range(8):
            r = await client.post(PATH, json=chat(LLAMA, f"prompt {i}"))
            assert r.status_code == 200, r.text
            assert r.json()["model"] == LLAMA
            assert r.json()["choices"][0]["message"]["content"]
            served.add(r.headers["x-modelsim-pod"])
    assert served <= {"llama-0", "llama-1"} and served
    assert pool_inflight(kind_gateway, LLAMA_POOL) == [0, 0]


async def test_streamed_chat_completion_arrives_chunk_by_chunk(kind_gateway: LocalGateway) -> None:
    body = chat(LLAMA, stream=True, stream_options={"include_usage": True}, max_tokens=12)
    events: list[str] = []
    async with kind_gateway.client() as client, client.stream("POST", PATH, json=body) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        assert r.headers["x-modelsim-pod"].startswith("llama-")
        async for line in r.aiter_lines():
            if line.startswith("data: "):
                events.append(line[6:])
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert len(chunks) >= 12
    assert chunks[-1]["usage"]["completion_tokens"] == 12
    assert pool_inflight(kind_gateway, LLAMA_POOL) == [0, 0]
