"""Anthropic's Messages API in the EPP: the prompt it hashes, its errors' shape, count_tokens."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from epp.requestcontrol.parse import ParseHints, parse_body
from epp.requestcontrol.processor import EppProcessor
from epp.scheduling.request import RequestError, messages_prompt_text, read_fields
from extproc import messages
from extproc.errors import ErrorResponse, bad_request, is_anthropic_path
from extproc.headers import DESTINATION_HEADER
from extproc.stream import RequestRoute
from gateway.config import parse_config
from gateway.envoy.bootstrap import render_bootstrap
from gateway.envoy.topology import Topology
from tests.unit.test_epp_processor import A, B, make_ctx

TOOLS = [{"name": "lookup", "description": "Look a city up.", "input_schema": {"type": "object"}}]
CONVERSATION: list[dict[str, Any]] = [
    {"role": "user", "content": "What is the capital of France?"},
    {"role": "assistant", "content": [{"type": "text", "text": "Paris."}]},
]


def anthropic_body(**extra: Any) -> dict[str, Any]:
    return {"model": "llama", "max_tokens": 8, "messages": CONVERSATION, **extra}


def test_the_prompt_is_tools_then_system_then_messages() -> None:
    text = messages_prompt_text(anthropic_body(system="Be brief.", tools=TOOLS))
    tool = '{"description":"Look a city up.","input_schema":{"type":"object"},"name":"lookup"}'
    assert text == (f"tool:{tool}\nsystem:Be brief.\nuser:What is the capital of France?\nassistant:Paris.\n")


def test_equivalent_spellings_hash_alike_and_cache_markers_do_not_count() -> None:
    plain = messages_prompt_text(anthropic_body(system="Be brief."))
    blocks = anthropic_body(
        system=[{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
        messages=[
            {"role": "user", "content": [{"type": "text", "text": "What is the capital of France?"}]},
            {"role": "assistant", "content": "Paris."},
        ],
    )
    assert messages_prompt_text(blocks) == plain
    # A tool call's input is canonical JSON: its key order does not change the prompt.
    call = {"type": "tool_use", "id": "t1", "name": "lookup", "input": {"city": "Rome", "country": "IT"}}
    swapped = {**call, "input": {"country": "IT", "city": "Rome"}, "cache_control": {"type": "ephemeral"}}
    result = {"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "text", "text": "41.9N"}]}

    def turn(block: dict[str, Any]) -> str:
        return messages_prompt_text(anthropic_body(messages=[{"role": "assistant", "content": [block]}]))

    assert turn(call) == turn(swapped) == 'assistant:tool_use lookup:{"city":"Rome","country":"IT"}\n'
    assert turn(result) == "assistant:tool_result:41.9N\n"
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}
    other = {**image, "source": {**image["source"], "data": "BBBB"}}
    assert turn(image) != turn(other)  # different images, different prompts


def test_a_conversation_shares_its_prefix_with_its_previous_turn() -> None:
    first = anthropic_body(system="Be brief.", tools=TOOLS)
    second = {**first, "messages": [*CONVERSATION, {"role": "user", "content": "And of Italy?"}]}
    assert messages_prompt_text(second).startswith(messages_prompt_text(first))


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"messages": "hi"}, "'messages' must be an array"),
        ({"messages": ["hi"]}, "each message must be an object"),
        ({"messages": [{"content": "hi"}]}, "string 'role'"),
        ({"messages": [{"role": "user", "content": 3}]}, "content must be a string or an array"),
        ({"messages": [{"role": "user", "content": ["hi"]}]}, "content block must be an object"),
        ({"system": 3}, "'system' must be a string or an array"),
        ({"tools": {"name": "x"}}, "'tools' must be an array of objects"),
    ],
)
def test_bad_prompts_are_refused_with_a_reason(extra: dict[str, Any], message: str) -> None:
    with pytest.raises(RequestError, match=message):
        messages_prompt_text(anthropic_body(**extra))
    fields = read_fields(anthropic_body(**extra), messages_api=True)
    assert fields.error is not None and message.strip("'") in fields.error


def test_the_parse_reads_the_body_by_its_path() -> None:
    raw = json.dumps(anthropic_body(system="Be brief.")).encode()
    hints = ParseHints(keys={"llama": ("llama", None)})
    on_messages = parse_body({":path": "/v1/messages?beta=true"}, raw, hints)
    on_chat = parse_body({":path": "/v1/chat/completions"}, raw, hints)
    assert on_messages.fields is not None and on_chat.fields is not None
    assert on_messages.fields.prompt.startswith("system:Be brief.\nuser:")
    assert not on_chat.fields.prompt.startswith("system:")  # OpenAI's chat has no `system` field
    assert on_messages.fields.max_tokens == 8 and on_messages.fields.model == "llama"
    assert on_messages.prefix is not None and on_messages.prefix.hashes != on_chat.prefix.hashes  # type: ignore[union-attr]
    # A worker's record of it is the same parse.
    assert on_messages.to_wire() == parse_body({":path": "/v1/messages"}, raw, hints).to_wire()


def test_errors_take_the_shape_of_the_api_asked() -> None:
    error = bad_request("'messages' must be an array")
    assert json.loads(error.json_body("/v1/messages")) == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": "'messages' must be an array"},
    }
    assert json.loads(error.json_body("/v1/chat/completions")) == {
        "error": {
            "message": "'messages' must be an array",
            "type": "invalid_request_error",
            "code": "invalid_request",
        }
    }
    expected = {
        404: "not_found_error",
        413: "request_too_large",
        429: "rate_limit_error",
        503: "api_error",
        431: "invalid_request_error",
    }
    for status, kind in expected.items():
        body = json.loads(ErrorResponse(status, "m", "c").json_body("/v1/messages/count_tokens?x=1"))
        assert body["error"]["type"] == kind, status
    response = messages.immediate_response(ErrorResponse(429, "busy", "pool_saturated"), "/v1/messages")
    assert json.loads(response.immediate_response.body)["type"] == "error"
    assert is_anthropic_path("/v1/messages") and not is_anthropic_path("/v1/messages/other")


async def test_a_message_is_booked_until_its_stream_closes() -> None:
    ctx = make_ctx()
    proc = EppProcessor(ctx)
    headers = {":path": "/v1/messages", "x-gateway-model-name": "llama"}
    route = await proc.on_request(headers, json.dumps(anthropic_body(stream=True)).encode())
    assert isinstance(route, RequestRoute) and route.set_headers[DESTINATION_HEADER] == f"{A},{B}"
    assert ctx.pool.inflight_total() == 1
    proc.on_close(True)
    assert ctx.pool.inflight_total() == 0


async def test_count_tokens_goes_to_a_pod_but_is_booked_nowhere() -> None:
    ctx = make_ctx()
    proc = EppProcessor(ctx)
    headers = {":path": "/v1/messages/count_tokens", "x-gateway-model-name": "llama"}
    body = {"model": "llama", "system": "A long shared system prompt. " * 20, "messages": CONVERSATION}
    route = await proc.on_request(headers, json.dumps(body).encode())
    assert isinstance(route, RequestRoute)
    assert route.set_headers[DESTINATION_HEADER] == A  # the best pod, no fallback list needed
    assert route.metadata == {"envoy.lb": {DESTINATION_HEADER: A}}
    assert ctx.pool.inflight_total() == 0  # no slot taken, none to return
    assert proc.on_response_headers({":status": "200"}) is None
    proc.on_close(True)
    assert ctx.pool.inflight_total() == 0
    # Its prompt is not recorded as cached on that pod (the prefix index learns only real work).
    index = ctx.scheduler.prefix_index  # type: ignore[attr-defined]
    assert index.memory_entries() == 0
    message = EppProcessor(ctx)
    await message.on_request(
        {**headers, ":path": "/v1/messages"}, json.dumps({**body, "max_tokens": 4}).encode()
    )
    assert index.memory_entries() > 0 and ctx.pool.inflight_total() == 1
    message.on_close(True)
    assert ctx.pool.inflight_total() == 0


async def test_a_bad_message_is_refused_before_anything_is_booked() -> None:
    ctx = make_ctx()
    proc = EppProcessor(ctx)
    bad = json.dumps(anthropic_body(messages="hi")).encode()
    result = await proc.on_request({":path": "/v1/messages", "x-gateway-model-name": "llama"}, bad)
    assert isinstance(result, ErrorResponse) and (result.status, result.code) == (400, "invalid_request")
    assert "'messages' must be an array" in result.message
    proc.on_close(False)
    assert ctx.pool.inflight_total() == 0


@pytest.mark.parametrize("single_hop", [False, True], ids=["two-hop", "single-hop"])
def test_envoy_routes_the_messages_paths_and_answers_them_in_anthropics_shape(single_hop: bool) -> None:
    config = parse_config(
        {
            "pools": [
                {"name": "llama", "models": [{"name": "llama"}], "endpoints": [{"address": "10.0.0.1:8000"}]}
            ]
        }
    )
    topo = Topology(
        listen_port=18443,
        admin_port=19901,
        bbr=None if single_hop else ("127.0.0.1", 19004),
        epps={"llama": ("127.0.0.1", 19002)},
        server_cert=None,
        server_key=None,
        single_hop=single_hop,
    )
    hcm = render_bootstrap(config, topo)["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
    hcm = hcm["typed_config"]
    routes = hcm["route_config"]["virtual_hosts"][0]["routes"]
    names = [r["name"] for r in routes]
    pool = next(r for r in routes if r["name"] == "llama-picked")
    regex = re.compile(pool["match"]["safe_regex"]["regex"])
    assert regex.fullmatch("/v1/messages") and regex.fullmatch("/v1/messages/count_tokens")
    # Anthropic's own refusals come before the OpenAI-shaped ones that also match its paths.
    assert names.index("no-route-messages-model") < names.index("no-route-model")
    assert names.index("no-route-messages") < names.index("no-route")
    messages_405 = routes[names.index("messages-method-not-allowed")]
    assert names.index("messages-method-not-allowed") < names.index("method-not-allowed")
    assert json.loads(messages_405["direct_response"]["body"]["inline_string"])["type"] == "error"
    if single_hop:  # the one EPP reads its settings from the entry route a request first matches
        entry = routes[names.index("no-route-messages")]["typed_per_filter_config"]["gateway.epp"]
        assert entry == routes[names.index("no-route")]["typed_per_filter_config"]["gateway.epp"]
    # Envoy's own replies on those paths (an EPP down, a failed upstream): Anthropic's shape first.
    mappers = hcm["local_reply_config"]["mappers"]
    shapes = ["type" in m["body_format_override"]["json_format"] for m in mappers]
    assert shapes == sorted(shapes, reverse=True) and shapes.count(True) == shapes.count(False)
    for mapper, anthropic in zip(mappers, shapes, strict=True):
        expression = mapper["filter"]["extension_filter"]["typed_config"]["expression"]
        assert (
            "request.url_path in ['/v1/messages', '/v1/messages/count_tokens']" in expression
        ) == anthropic
