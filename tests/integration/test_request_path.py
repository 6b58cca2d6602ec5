"""Real HTTPS requests through the real Envoy, BBR, EPP and simulated pods, in both modes of the
request path (two-hop BBR + EPP per pool, and single-hop: one EPP for every pool), each with
request bodies streamed through the services and buffered by Envoy (`listener.requestBodyMode`)."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest

from devstack.launch import LocalGateway
from gateway.config import load_config
from tests.integration.conftest import BUFFER_LIMIT_BYTES, chat

LLAMA, QWEN = "llama-3.1-8b-instruct", "qwen3-32b"


@pytest.fixture(scope="module")
def gateway(gateway_each_path: LocalGateway) -> LocalGateway:
    return gateway_each_path


def buffered(gateway: LocalGateway) -> bool:
    return load_config(gateway.config_path).listener.request_body_mode == "buffered"


def test_each_mode_runs_its_own_processes(gateway: LocalGateway) -> None:
    running = gateway.envoy_config()
    bootstrap = json.dumps(running)
    if gateway.single_hop:
        assert set(gateway.procs) == {"fleet", "epp", "xds", "envoy"}
        assert '"gateway.bbr"' not in bootstrap
    else:
        assert {"bbr", "epp-llama-3-1-8b-instruct", "epp-qwen3-32b"} <= set(gateway.procs)
        assert '"gateway.bbr"' in bootstrap
    # Every ext_proc filter and route override runs the configured body mode, and only that one.
    modes = {m["request_body_mode"] for m in _processing_modes(running)}
    assert modes == ({"BUFFERED"} if buffered(gateway) else {"FULL_DUPLEX_STREAMED"})


def _processing_modes(node: object) -> list[dict]:
    if isinstance(node, dict):
        found = [node["processing_mode"]] if "processing_mode" in node else []
        return found + [m for v in node.values() for m in _processing_modes(v)]
    if isinstance(node, list):
        return [m for v in node for m in _processing_modes(v)]
    return []


async def test_each_model_reaches_only_its_own_pods(gateway: LocalGateway) -> None:
    served: dict[str, set[str]] = {LLAMA: set(), QWEN: set()}
    async with gateway.client() as client:
        for i in range(16):
            for model in (LLAMA, QWEN):
                r = await client.post("/v1/chat/completions", json=chat(model, f"distinct prompt {i}"))
                assert r.status_code == 200, r.text
                assert r.json()["model"] == model
                served[model].add(r.headers["x-modelsim-pod"])
    # Idle identical pods tie and the picker breaks ties at random: both get traffic.
    assert served[LLAMA] == {"llama-0", "llama-1"}
    assert served[QWEN] == {"qwen-0", "qwen-1"}


async def test_lora_adapter_goes_to_its_base_model_pool(gateway: LocalGateway) -> None:
    async with gateway.client() as client:
        r = await client.post("/v1/chat/completions", json=chat("sql-lora"))
    assert r.status_code == 200, r.text
    assert r.headers["x-modelsim-pod"].startswith("llama-")
    assert r.json()["model"] == "sql-lora"


async def test_canary_split_rewrites_the_model_by_weight(gateway: LocalGateway) -> None:
    served: list[str] = []
    async with gateway.client() as client:
        for i in range(40):
            r = await client.post(
                "/v1/chat/completions", json=chat("llama-canary", f"canary {i}", max_tokens=1)
            )
            assert r.status_code == 200, r.text
            assert r.headers["x-modelsim-pod"].startswith("llama-")
            served.append(r.json()["model"])  # the pod answers with the name it was sent
    assert set(served) == {LLAMA, "sql-lora"}
    assert 20 <= served.count(LLAMA) <= 38  # 3:1 split, binomial bounds far outside noise


async def test_http2_is_negotiated_by_alpn(gateway: LocalGateway) -> None:
    async with gateway.client(http2=True) as client:
        r = await client.post("/v1/completions", json={"model": QWEN, "prompt": "Say hi", "max_tokens": 4})
    assert r.status_code == 200, r.text
    assert r.http_version == "HTTP/2"


async def test_256kb_prompt_passes_intact(gateway: LocalGateway) -> None:
    size = 256 * 1024
    prompt = ("lorem ipsum dolor sit amet " * (size // 27 + 1))[:size]
    async with gateway.client() as client:
        r = await client.post("/v1/completions", json={"model": LLAMA, "prompt": prompt, "max_tokens": 2})
    assert r.status_code == 200, r.text[:300]
    # The simulator counts prompt tokens from the text it received: all of it arrived.
    assert r.json()["usage"]["prompt_tokens"] > size // 8


async def test_2mb_prompt_reaches_the_model_server_whole(gateway: LocalGateway) -> None:
    """2 MB is beyond the model's context: the pod itself must be the one to say so."""
    size = 2 * 1024 * 1024
    prompt = ("lorem ipsum dolor sit amet " * (size // 27 + 1))[:size]
    async with gateway.client() as client:
        r = await client.post("/v1/completions", json={"model": LLAMA, "prompt": prompt, "max_tokens": 2})
    assert r.status_code == 400, r.text[:300]
    assert r.headers["x-modelsim-pod"].startswith("llama-")
    tokens = int(r.json()["error"]["message"].split()[2])
    assert tokens > size // 8


async def test_body_over_the_buffer_limit_is_a_json_413_when_buffered(gateway: LocalGateway) -> None:
    """Buffered: Envoy refuses a body past maxBufferedBodyBytes itself (no pod sees it), as
    OpenAI JSON. Streamed bodies have no such bound: the same body reaches the pod whole."""
    size = BUFFER_LIMIT_BYTES + 512 * 1024
    prompt = ("lorem ipsum dolor sit amet " * (size // 27 + 1))[:size]
    async with gateway.client() as client:
        r = await client.post("/v1/completions", json={"model": LLAMA, "prompt": prompt, "max_tokens": 2})
        after = await client.post("/v1/completions", json={"model": LLAMA, "prompt": "hi", "max_tokens": 2})
    if buffered(gateway):
        assert r.status_code == 413, r.text[:300]
        assert r.headers["content-type"] == "application/json"
        assert "x-modelsim-pod" not in r.headers
        error = r.json()["error"]
        assert error["code"] == "request_too_large" and error["type"] == "invalid_request_error"
    else:
        assert r.status_code == 400, r.text[:300]  # the pod's context-length refusal
        assert r.headers["x-modelsim-pod"].startswith("llama-")
    assert after.status_code == 200, after.text[:300]  # the gateway carries on


async def test_an_oversized_message_is_refused_in_anthropics_shape(gateway: LocalGateway) -> None:
    """On Anthropic's Messages API path a refusal is in its error shape whoever makes it: buffered,
    Envoy's own 413 past maxBufferedBodyBytes (a local reply, shaped like an EPP down or a failed
    upstream); streamed, the pod's context-length 400, as vLLM answers on that path."""
    size = BUFFER_LIMIT_BYTES + 512 * 1024
    text = ("lorem ipsum dolor sit amet " * (size // 27 + 1))[:size]
    body = {"model": LLAMA, "max_tokens": 2, "messages": [{"role": "user", "content": text}]}
    async with gateway.client() as client:
        r = await client.post("/v1/messages", json=body)
    assert r.headers["content-type"].startswith("application/json")
    answer = r.json()
    assert answer["type"] == "error", answer
    if buffered(gateway):
        assert r.status_code == 413, r.text[:300]
        assert "x-modelsim-pod" not in r.headers
        assert answer["error"]["type"] == "request_too_large"
        assert answer["error"]["message"].startswith("request too large")
    else:
        assert r.status_code == 400, r.text[:300]
        assert r.headers["x-modelsim-pod"].startswith("llama-")
        assert (
            answer["error"]["type"] == "invalid_request_error"
            and "context length" in answer["error"]["message"]
        )


async def test_streaming_passes_through_chunk_by_chunk(gateway: LocalGateway) -> None:
    body = chat(LLAMA, stream=True, stream_options={"include_usage": True}, max_tokens=12)
    events: list[str] = []
    async with gateway.client() as client, client.stream("POST", "/v1/chat/completions", json=body) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        async for line in r.aiter_lines():
            if line.startswith("data: "):
                events.append(line[6:])
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert len(chunks) >= 12  # one chunk per token, not one buffered blob
    assert chunks[-1]["usage"]["completion_tokens"] == 12


@pytest.mark.parametrize(
    ("content", "status", "code"),
    [
        (b"this is not json", 400, "invalid_json"),
        (b"\xff\xfe\x00garbage", 400, "invalid_encoding"),
        (b"[1, 2, 3]", 400, "invalid_json"),
        (b'{"messages": []}', 400, "model_required"),
        (b'{"model": 42}', 400, "invalid_model"),
        (b'{"model": "no-such-model", "prompt": "x"}', 404, "model_not_found"),
    ],
)
async def test_bad_requests_get_openai_json_errors(
    gateway: LocalGateway, content: bytes, status: int, code: str
) -> None:
    async with gateway.client() as client:
        r = await client.post(
            "/v1/chat/completions", content=content, headers={"content-type": "application/json"}
        )
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/json"
    error = r.json()["error"]
    assert error["code"] == code and error["message"] and error["type"]


async def test_unknown_path_is_a_json_404_and_a_served_one_without_model_too(gateway: LocalGateway) -> None:
    async with gateway.client() as client:
        unknown = await client.get("/nothing/here")
        no_model = await client.post("/v1/completions")  # no body, so no model to route by
        wrong_method = await client.get("/v1/completions")
    assert unknown.status_code == 404
    assert unknown.json()["error"]["code"] == "not_found"  # outside the allow-list
    # An empty body names no model: a 400, as a body of `{}` or whitespace gets.
    assert no_model.status_code == 400
    assert no_model.json()["error"]["code"] == "model_required"
    assert wrong_method.status_code == 405
    assert wrong_method.json()["error"]["code"] == "method_not_allowed"


async def test_models_list_names_every_model_and_adapter(gateway: LocalGateway) -> None:
    async with gateway.client() as client:
        r = await client.get("/v1/models")
    assert r.status_code == 200
    assert {m["id"] for m in r.json()["data"]} == {LLAMA, "sql-lora", "llama-canary", QWEN}


async def test_client_sent_destination_header_cannot_steer(gateway: LocalGateway) -> None:
    """Point the header at a qwen pod (another local port) on llama requests: ignored."""
    qwen_pod = gateway.pods_of(QWEN)[0]
    headers = {"x-gateway-destination-endpoint": qwen_pod, "x-gateway-model-name": QWEN}
    async with gateway.client() as client:
        for _ in range(4):
            r = await client.post("/v1/chat/completions", json=chat(LLAMA), headers=headers)
            assert r.status_code == 200
            assert r.headers["x-modelsim-pod"].startswith("llama-")
            assert r.json()["model"] == LLAMA


async def test_inflight_accounting_returns_to_zero(gateway: LocalGateway) -> None:
    async with gateway.client() as client:
        await asyncio.gather(*(client.post("/v1/chat/completions", json=chat(LLAMA)) for _ in range(8)))
        # A client that gives up mid-stream must not leak an in-flight slot either.
        async with client.stream(
            "POST", "/v1/chat/completions", json=chat(LLAMA, stream=True, max_tokens=200)
        ) as r:
            async for _ in r.aiter_lines():
                break
    port = gateway.epp_metrics_ports["llama-3-1-8b-instruct"]
    async with httpx.AsyncClient() as plain:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            pool = (await plain.get(f"http://127.0.0.1:{port}/debug/pool")).json()
            if all(e["inflight_requests"] == 0 for e in pool["endpoints"]):
                break
            await asyncio.sleep(0.05)
    assert [e["inflight_requests"] for e in pool["endpoints"]] == [0, 0]
