"""Anthropic's Messages API on a pod, as vLLM serves it, read by the official `anthropic` client."""

from __future__ import annotations

import anthropic
import httpx

from modelsim.fleet import Fleet

CONVERSATION: list[anthropic.types.MessageParam] = [
    {"role": "user", "content": "What is the capital of France?"},
    {"role": "assistant", "content": [{"type": "text", "text": "Paris."}]},
    {"role": "user", "content": [{"type": "text", "text": "And of Italy?"}]},
]


def _client(fleet: Fleet) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(base_url=fleet.pod("llama-0").url, api_key="unused", max_retries=0)


async def test_a_message_and_its_usage(fleet: Fleet) -> None:
    async with _client(fleet) as client:
        answer = await client.messages.create(
            model="llama", system="Be brief.", messages=CONVERSATION, max_tokens=5
        )
    assert answer.type == "message" and answer.role == "assistant" and answer.model == "llama"
    assert answer.id.startswith("msg_")
    assert [block.type for block in answer.content] == ["text"]
    assert answer.stop_reason == "max_tokens" and answer.usage.output_tokens == 5
    assert answer.usage.input_tokens > 0


async def test_a_streamed_message_in_anthropics_events(fleet: Fleet) -> None:
    async with _client(fleet) as client:
        async with client.messages.stream(model="llama-sql", messages=CONVERSATION, max_tokens=4) as stream:
            events = [event.type async for event in stream]
            final = await stream.get_final_message()
    assert events[:2] == ["message_start", "content_block_start"]
    assert events[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert events.count("text") == 4  # one text delta per token (the client's own event per delta)
    assert final.model == "llama-sql" and final.usage.output_tokens == 4 and final.stop_reason == "max_tokens"
    assert final.content[0].type == "text" and final.content[0].text


async def test_count_tokens_counts_what_the_message_would_prefill(fleet: Fleet) -> None:
    tools: list[anthropic.types.ToolParam] = [
        {"name": "lookup", "description": "Look a city up.", "input_schema": {"type": "object"}}
    ]
    async with _client(fleet) as client:
        plain = await client.messages.count_tokens(model="llama", messages=CONVERSATION)
        more = await client.messages.count_tokens(
            model="llama", system="Be brief.", tools=tools, messages=CONVERSATION
        )
        answer = await client.messages.create(model="llama", messages=CONVERSATION, max_tokens=1)
    assert plain.input_tokens == answer.usage.input_tokens > 0
    assert more.input_tokens > plain.input_tokens  # system and tools are prompt tokens too
    assert fleet.pod("llama-0").engine.stats.prompt_tokens == answer.usage.input_tokens  # nothing else ran


async def test_bad_requests_get_anthropics_error_shape(client: httpx.AsyncClient) -> None:
    cases = {
        "no max_tokens": ({"model": "llama", "messages": CONVERSATION}, 400),
        "no messages": ({"model": "llama", "max_tokens": 3}, 400),
        "bad role": (
            {"model": "llama", "max_tokens": 3, "messages": [{"role": "tool", "content": "x"}]},
            400,
        ),
        "unknown model": ({"model": "nope", "max_tokens": 3, "messages": CONVERSATION}, 404),
    }
    for name, (body, status) in cases.items():
        r = await client.post("/v1/messages", json=body)
        assert r.status_code == status, (name, r.text)
        error = r.json()
        assert error["type"] == "error" and error["error"]["message"], name
        assert error["error"]["type"] == ("not_found_error" if status == 404 else "invalid_request_error")
    r = await client.post("/v1/messages/count_tokens", content=b"{not json")
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"


async def test_an_injected_fault_is_an_anthropic_api_error(client: httpx.AsyncClient) -> None:
    assert (await client.post("/sim/fault", json={"error_rate": 1.0})).status_code == 200
    body = {"model": "llama", "max_tokens": 3, "messages": CONVERSATION}
    for path in ("/v1/messages", "/v1/messages/count_tokens"):
        r = await client.post(path, json=body)
        assert r.status_code == 500 and r.json()["error"]["type"] == "api_error", (path, r.text)
    assert (await client.post("/sim/fault", json={"error_rate": 0.0})).status_code == 200
    assert (await client.post("/v1/messages", json=body)).status_code == 200
