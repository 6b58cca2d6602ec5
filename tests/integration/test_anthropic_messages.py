"""Anthropic's Messages API through the real Envoy, with the official `anthropic` client.

`/v1/messages` (streamed and not) and `/v1/messages/count_tokens` are routed by BBR and the EPP
like `/v1/chat/completions` (two-hop and single-hop): each request reaches the pod the EPP
chose; bad bodies get Anthropic's error shape from whichever part refuses them (the services,
Envoy's own routes); count_tokens books nothing, and in-flight returns to zero.
"""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator, Iterator
from typing import Any

import anthropic
import httpx
import httpx2
import pytest

from devstack.launch import LocalGateway, dev_trust
from tests.integration.conftest import MODES, local_gateway
from tests.integration.test_inflight import LLAMA, Epp

MODEL = LLAMA  # the model whose EPP `Epp` reads
FLEET = {
    "time_scale": 10.0,
    "pods": [{"name": "llama", "model": MODEL, "profile": "h100-llama3.1-8b", "replicas": 3}],
}
DECISION = {"x-gateway-decision": "true"}
SYSTEM = "You answer geography questions in one word."
CONVERSATION: list[anthropic.types.MessageParam] = [
    {"role": "user", "content": "What is the capital of France?"},
    {"role": "assistant", "content": [{"type": "text", "text": "Paris."}]},
    {"role": "user", "content": [{"type": "text", "text": "And of Italy?"}]},
]


@pytest.fixture(scope="module", params=MODES)
def gw(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalGateway]:
    yield from local_gateway(
        tmp_path_factory,
        f"anthropic-{request.param}",
        fleet=FLEET,
        config_patch=dev_trust,
        single_hop=request.param == "single-hop",
    )


@pytest.fixture
async def client(gw: LocalGateway) -> AsyncIterator[anthropic.AsyncAnthropic]:
    tls = ssl.create_default_context(cafile=str(gw.certs.ca))
    async with httpx2.AsyncClient(verify=tls, timeout=30) as http:
        yield anthropic.AsyncAnthropic(base_url=gw.url, api_key="unused", http_client=http, max_retries=0)


@pytest.fixture
async def epp(gw: LocalGateway) -> AsyncIterator[Epp]:
    async with httpx.AsyncClient(timeout=5) as http:
        yield Epp(gw, http)


def pod_of(gw: LocalGateway, name: str) -> str:
    return next(p["address"] for p in gw.pods if p["name"] == name)


def chosen(headers: Any) -> str:
    """The pod the EPP chose, from its decision header (`chosen=ADDRESS pod=NAME; ...`)."""
    head = headers["x-gateway-decision"].split(";", 1)[0]
    return head.split()[0].removeprefix("chosen=")


async def test_a_message_goes_to_the_pod_the_epp_chose(
    gw: LocalGateway, client: anthropic.AsyncAnthropic, epp: Epp
) -> None:
    _, before, _ = await epp.counts()
    raw = await client.messages.with_raw_response.create(
        model=MODEL, system=SYSTEM, messages=CONVERSATION, max_tokens=5, extra_headers=DECISION
    )
    answer = await raw.parse()
    assert answer.type == "message" and answer.model == MODEL and answer.stop_reason == "max_tokens"
    assert answer.content[0].type == "text" and answer.usage.output_tokens == 5
    assert pod_of(gw, raw.headers["x-modelsim-pod"]) == chosen(raw.headers)
    await epp.settled()
    assert (await epp.counts())[1] == before + 1  # booked, and released


async def test_a_streamed_message_holds_its_slot_to_the_end(
    gw: LocalGateway, client: anthropic.AsyncAnthropic, epp: Epp
) -> None:
    events: list[str] = []
    async with client.messages.stream(
        model=MODEL, system=SYSTEM, messages=CONVERSATION, max_tokens=2000, extra_headers=DECISION
    ) as stream:
        assert pod_of(gw, stream.response.headers["x-modelsim-pod"]) == chosen(stream.response.headers)
        async for event in stream:
            events.append(event.type)
            if len(events) == 20:  # mid-stream: the slot is held (not freed at the headers)
                assert await epp.inflight() == 1
        final = await stream.get_final_message()
    assert events[:2] == ["message_start", "content_block_start"]
    assert events[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert final.usage.output_tokens == 2000 and final.stop_reason == "max_tokens"
    assert final.usage.input_tokens > 0 and len(final.content[0].text) > 0  # type: ignore[union-attr]
    await epp.settled()


async def test_count_tokens_reaches_a_pod_and_books_nothing(
    gw: LocalGateway, client: anthropic.AsyncAnthropic, epp: Epp
) -> None:
    _, routed_before, finished_before = await epp.counts()
    raw = await client.messages.with_raw_response.count_tokens(
        model=MODEL, system=SYSTEM, messages=CONVERSATION, extra_headers=DECISION
    )
    assert pod_of(gw, raw.headers["x-modelsim-pod"]) == chosen(raw.headers)
    counted = (await raw.parse()).input_tokens
    answer = await client.messages.create(model=MODEL, system=SYSTEM, messages=CONVERSATION, max_tokens=1)
    assert counted == answer.usage.input_tokens > 0  # the count the pod would prefill
    await epp.settled()
    _, routed, finished = await epp.counts()
    assert (routed, finished) == (routed_before + 1, finished_before + 1)  # the message only


async def test_bad_requests_get_anthropics_error_shape(
    gw: LocalGateway, client: anthropic.AsyncAnthropic
) -> None:
    with pytest.raises(anthropic.NotFoundError) as unknown:
        await client.messages.create(model="no-such-model", messages=CONVERSATION, max_tokens=1)
    assert unknown.value.body == {
        "type": "error",
        "error": {"type": "not_found_error", "message": "The model 'no-such-model' does not exist"},
    }
    with pytest.raises(anthropic.BadRequestError) as bad:
        await client.messages.create(model=MODEL, messages="hi", max_tokens=1)  # type: ignore[arg-type]
    assert bad.value.body == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": "'messages' must be an array"},
    }
    cases = [  # (method, path, body, status, Anthropic error type)
        ("POST", "/v1/messages", b"{not json", 400, "invalid_request_error"),
        ("POST", "/v1/messages/count_tokens", b"[]", 400, "invalid_request_error"),
        ("POST", "/v1/messages?beta=true", b'{"model": 3, "messages": []}', 400, "invalid_request_error"),
        ("POST", "/v1/messages", b"", 400, "invalid_request_error"),  # no body: no model to route on
        ("GET", "/v1/messages", None, 405, "invalid_request_error"),
        # The pod's own refusal (no max_tokens), in the shape vLLM answers.
        (
            "POST",
            "/v1/messages",
            b'{"model": "%s", "messages": []}' % MODEL.encode(),
            400,
            "invalid_request_error",
        ),
    ]
    async with gw.client() as http:
        for method, path, body, status, kind in cases:
            r = await http.request(method, path, content=body, headers={"content-type": "application/json"})
            assert r.status_code == status, (path, body, r.text)
            error = r.json()
            assert error["type"] == "error" and error["error"]["type"] == kind, (path, body, error)
            assert error["error"]["message"]
        # Other paths keep OpenAI's shape.
        openai = await http.post("/v1/chat/completions", content=b"{not json")
        assert openai.status_code == 400 and openai.json()["error"]["code"] == "invalid_json"
