"""The pod's OpenAI/vLLM HTTP surface: framing, shapes and errors as clients see them."""

from __future__ import annotations

import asyncio
import json

import httpx

from modelsim.fleet import Fleet

CHAT = {"model": "llama", "messages": [{"role": "user", "content": "Say something nice."}], "max_tokens": 7}


def sse_events(raw: bytes) -> list[str]:
    text = raw.decode()
    assert text.endswith("data: [DONE]\n\n")
    frames = text.split("\n\n")
    assert frames[-1] == ""
    assert all(f.startswith("data: ") for f in frames[:-1])
    return [f[len("data: ") :] for f in frames[:-1]]


async def test_chat_non_streaming_shape_and_usage(client: httpx.AsyncClient) -> None:
    r = await client.post("/v1/chat/completions", json=CHAT)
    assert r.status_code == 200
    assert r.headers["x-modelsim-pod"] == "llama-0"
    body = r.json()
    assert body["object"] == "chat.completion" and body["model"] == "llama"
    choice = body["choices"][0]
    assert choice["message"]["role"] == "assistant" and choice["finish_reason"] == "length"
    assert body["usage"]["completion_tokens"] == 7
    tok = (await client.post("/tokenize", json={"model": "llama", "messages": CHAT["messages"]})).json()
    assert body["usage"]["prompt_tokens"] == tok["count"]


async def test_chat_streaming_framing_with_usage(client: httpx.AsyncClient) -> None:
    req = {**CHAT, "stream": True, "stream_options": {"include_usage": True}}
    r = await client.post("/v1/chat/completions", json=req)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = sse_events(r.content)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert all(c["object"] == "chat.completion.chunk" and c["model"] == "llama" for c in chunks)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    content = [c["choices"][0]["delta"].get("content") for c in chunks[1:-2]]
    assert len(content) == 7 and all(content)
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 7


async def test_completion_streaming_without_usage(client: httpx.AsyncClient) -> None:
    req = {"model": "llama-sql", "prompt": "SELECT the rows", "max_tokens": 3, "stream": True}
    r = await client.post("/v1/completions", json=req)
    chunks = [json.loads(e) for e in sse_events(r.content)[:-1]]
    assert all("usage" not in c for c in chunks)
    assert {c["model"] for c in chunks} == {"llama-sql"}
    assert "".join(c["choices"][0]["text"] for c in chunks).split() == ["the", "model", "answers"]


async def test_completion_non_streaming_and_token_id_prompt(client: httpx.AsyncClient) -> None:
    r = await client.post("/v1/completions", json={"model": "llama", "prompt": [1, 2, 3, 4], "max_tokens": 2})
    body = r.json()
    assert r.status_code == 200 and body["object"] == "text_completion"
    assert body["usage"] == {
        "prompt_tokens": 4,
        "completion_tokens": 2,
        "total_tokens": 6,
        "prompt_tokens_details": {"cached_tokens": 0},
    }


async def test_bad_input_is_400_with_openai_error(client: httpx.AsyncClient) -> None:
    cases = [
        ("/v1/chat/completions", b"{not json"),
        ("/v1/chat/completions", json.dumps({"model": "llama"}).encode()),
        ("/v1/chat/completions", json.dumps({**CHAT, "max_tokens": "ten"}).encode()),
        ("/v1/chat/completions", json.dumps({**CHAT, "messages": "hi"}).encode()),
        ("/v1/completions", json.dumps({"model": "llama"}).encode()),
        ("/v1/completions", json.dumps({"model": "llama", "prompt": {"a": 1}}).encode()),
        ("/v1/completions", json.dumps({"model": "llama", "prompt": "x", "stream": "yes"}).encode()),
        ("/v1/completions", json.dumps(["a"]).encode()),
    ]
    for path, raw in cases:
        r = await client.post(path, content=raw, headers={"content-type": "application/json"})
        assert r.status_code == 400, (path, raw)
        err = r.json()["error"]
        assert err["type"] == "BadRequestError" and err["code"] == 400 and err["message"]


async def test_unknown_model_or_adapter_is_404(client: httpx.AsyncClient) -> None:
    for model in ("nope", "llama-other"):
        r = await client.post("/v1/chat/completions", json={**CHAT, "model": model})
        assert r.status_code == 404
        assert r.json()["error"]["type"] == "NotFoundError" and model in r.json()["error"]["message"]


async def test_prompt_longer_than_context_is_400(fleet: Fleet) -> None:
    spec_pod = fleet.pod("llama-0")
    limit = spec_pod.engine.max_model_len
    async with httpx.AsyncClient(base_url=spec_pod.url) as c:
        r = await c.post("/v1/completions", json={"model": "llama", "prompt": [5] * limit, "max_tokens": 1})
    assert r.status_code == 400 and "maximum context length" in r.json()["error"]["message"]


async def test_models_lists_base_and_adapters(client: httpx.AsyncClient) -> None:
    data = (await client.get("/v1/models")).json()["data"]
    by_id = {m["id"]: m for m in data}
    assert set(by_id) == {"llama", "llama-sql"}
    assert by_id["llama-sql"]["parent"] == "llama" and by_id["llama"]["parent"] is None
    assert all(m["object"] == "model" and m["max_model_len"] > 0 for m in data)


async def test_tokenize_is_deterministic_and_prefix_preserving(client: httpx.AsyncClient) -> None:
    a = (await client.post("/tokenize", json={"model": "llama", "prompt": "The quick brown fox"})).json()
    b = (
        await client.post("/tokenize", json={"model": "llama", "prompt": "The quick brown fox jumps"})
    ).json()
    assert a["count"] == len(a["tokens"]) and a["max_model_len"] > 0
    assert b["tokens"][: a["count"]] == a["tokens"] and b["count"] > a["count"]
    again = (await client.post("/tokenize", json={"model": "llama", "prompt": "The quick brown fox"})).json()
    assert again["tokens"] == a["tokens"]


async def test_health_and_peer_probe_paths(client: httpx.AsyncClient) -> None:
    r = await client.get("/health")
    assert r.status_code == 200 and r.content == b""
    assert (await client.get("/server_info")).status_code == 404
    assert (await client.get("/model_info")).status_code == 404


async def test_generation_traceparents_show_in_state(client: httpx.AsyncClient) -> None:
    """The pod keeps the W3C traceparent of OpenAI and Anthropic generations (a test of the
    gateway reads them to see the trace reached the model server); other paths leave none."""
    openai_trace = "00-" + "1" * 32 + "-" + "2" * 16 + "-01"
    anthropic_trace = "00-" + "3" * 32 + "-" + "4" * 16 + "-01"
    r = await client.post("/v1/chat/completions", json=CHAT, headers={"traceparent": openai_trace})
    assert r.status_code == 200
    messages = {"model": "llama", "max_tokens": 2, "messages": CHAT["messages"]}
    r = await client.post("/v1/messages", json=messages, headers={"traceparent": anthropic_trace})
    assert r.status_code == 200
    await client.post("/tokenize", json={"model": "llama", "prompt": "x"}, headers={"traceparent": "t"})
    state = (await client.get("/sim/state")).json()
    assert state["recent_traceparents"] == [openai_trace, anthropic_trace]


async def test_client_disconnect_aborts_request(fleet: Fleet) -> None:
    pod = fleet.pod("llama-0")
    req = {"model": "llama", "prompt": "tell me everything", "max_tokens": 100_000, "stream": True}
    async with httpx.AsyncClient(base_url=pod.url) as c, c.stream("POST", "/v1/completions", json=req) as r:
        async for _ in r.aiter_raw():
            break
        assert len(pod.engine.running) == 1
    for _ in range(200):
        if not pod.engine.running:
            break
        await asyncio.sleep(0.01)
    assert not pod.engine.running and pod.engine.kv.num_free == pod.engine.kv.num_blocks
