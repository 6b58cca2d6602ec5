"""`/v1/embeddings` and `/v1/responses` on a pod, in vLLM's shapes."""

from __future__ import annotations

import httpx


async def test_embeddings_one_vector_per_input(client: httpx.AsyncClient) -> None:
    r = await client.post("/v1/embeddings", json={"model": "llama", "input": ["one text", "another text"]})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "list" and body["model"] == "llama" and body["id"].startswith("embd-")
    assert [d["index"] for d in body["data"]] == [0, 1]
    assert all(d["object"] == "embedding" and len(d["embedding"]) == 32 for d in body["data"])
    assert body["usage"]["prompt_tokens"] == body["usage"]["total_tokens"] > 0
    single = (await client.post("/v1/embeddings", json={"model": "llama", "input": [1, 2, 3]})).json()
    assert len(single["data"]) == 1 and single["usage"]["prompt_tokens"] == 3
    bad = await client.post("/v1/embeddings", json={"model": "llama"})
    assert bad.status_code == 400 and "input" in bad.json()["error"]["message"]


async def test_responses_store_and_continue_only_where_they_were_made(client: httpx.AsyncClient) -> None:
    first = await client.post(
        "/v1/responses",
        json={
            "model": "llama",
            "instructions": "Be brief.",
            "input": "Hi",
            "max_output_tokens": 5,
            "request_id": "resp_mine",
        },
    )
    assert first.status_code == 200, first.text
    body = first.json()
    assert body["id"] == "resp_mine" and body["object"] == "response" and body["status"] == "incomplete"
    assert body["output"][0]["type"] == "message" and body["output"][0]["content"][0]["type"] == "output_text"
    assert body["usage"]["output_tokens"] == 5
    follow = await client.post(
        "/v1/responses",
        json={
            "model": "llama",
            "input": [{"role": "user", "content": "More"}],
            "previous_response_id": "resp_mine",
            "max_output_tokens": 3,
        },
    )
    assert follow.status_code == 200, follow.text
    assert follow.json()["usage"]["input_tokens"] > body["usage"]["input_tokens"]  # carries the history
    unknown = await client.post(
        "/v1/responses", json={"model": "llama", "input": "x", "previous_response_id": "resp_elsewhere"}
    )
    assert unknown.status_code == 404 and "resp_elsewhere" in unknown.json()["error"]["message"]
