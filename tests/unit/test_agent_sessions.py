"""Agent sessions (epp/requestcontrol/agent_session.py): the session key and the agent program
from what coding agents send, on the request path, and fairness across agent programs in flow
control (issue #51)."""

from __future__ import annotations

import asyncio
import json

import pytest
from prometheus_client import CollectorRegistry

from epp.requestcontrol.agent_session import (
    AGENTS,
    MAX_KEY_CHARS,
    OTHER,
    agent_program,
    body_session_key,
    session_key,
)
from epp.requestcontrol.flow_control import ANONYMOUS, FlowController, tenant_of, ticket_for
from epp.requestcontrol.header_policy import HeaderPolicy
from epp.requestcontrol.parse import ParsedBody, ParseHints, parse_body
from epp.requestcontrol.processor import EppProcessor
from epp.scheduling.request import InferenceRequest
from extproc.headers import CLAIM_HEADER, TENANT_CLAIM_HEADER
from extproc.stream import RequestRoute
from gateway.config import FlowControlConfig
from tests.unit.test_epp_processor import make_ctx
from tests.unit.test_flow_queue import Gate
from tests.waiting import until

CLAUDE_UA = "claude-cli/2.1.205 (external, cli)"
CODEX_UA = "codex_cli_rs/0.72.0 (Ubuntu 24.04.2 LTS; x86_64) WindowsTerminal"


@pytest.mark.parametrize(
    "headers",
    [
        {"x-claude-code-session-id": "S"},  # Claude Code
        {"session_id": "S"},  # Codex CLI
        {"session-id": "S"},  # Codex CLI, newer
        {"x-opencode-session": "S"},  # opencode, its own providers
        {"x-session-affinity": "S"},  # opencode, other providers
        {"x-session-id": "S"},  # generic (opencode v1.17+)
        {"x-grok-conv-id": "S"},  # xAI
    ],
)
def test_each_agents_session_header_is_the_session_key(headers: dict[str, str]) -> None:
    assert session_key(headers, "x-gateway-session") == "S"


@pytest.mark.parametrize(
    "body",
    [
        {"metadata": {"user_id": json.dumps({"device_id": "d", "account_uuid": "", "session_id": "S"})}},
        {"metadata": {"user_id": "user_abc_account_42_session_S"}},  # Claude Code's older form
        {"prompt_cache_key": "S"},  # OpenAI / Codex / xAI Responses
        {"metadata": {"user_id": "plain-user"}, "prompt_cache_key": "S"},  # a user id is no session
    ],
)
def test_the_body_carries_a_session_key(body: dict[str, object]) -> None:
    assert body_session_key(body) == "S"
    assert session_key({}, "x-session-id", body_session_key(body)) == "S"


def test_the_configured_header_comes_first_then_agent_headers_then_the_body() -> None:
    headers = {"x-mine": "mine", "x-claude-code-session-id": "claude", "session_id": "codex"}
    assert session_key(headers, "X-Mine", "body") == "mine"
    assert session_key(headers, "x-other", "body") == "claude"
    assert session_key({"session_id": "codex"}, "x-other", "body") == "codex"
    assert session_key({}, "x-other", "body") == "body"
    assert session_key({}, "x-other", None) is None


def test_blank_values_are_absent_and_keys_are_bounded() -> None:
    assert session_key({"x-claude-code-session-id": "  ", "session_id": ""}, "x-session-id", "") is None
    assert body_session_key({"prompt_cache_key": 7, "metadata": {"user_id": "{not json"}}) is None
    long = "k" * 10_000
    assert session_key({"session_id": long}, None) == "k" * MAX_KEY_CHARS
    assert body_session_key({"prompt_cache_key": long}) == "k" * MAX_KEY_CHARS


@pytest.mark.parametrize(
    ("headers", "program"),
    [
        ({"user-agent": CLAUDE_UA}, "claude-code"),
        ({"user-agent": "claude-cli/2.0.0 (external, claude-vscode)"}, "claude-code"),
        ({"user-agent": "claude-code/2.1.45"}, "claude-code"),
        ({"user-agent": CODEX_UA}, "codex"),
        ({"user-agent": "codex_vscode/0.40.0"}, "codex"),
        ({"user-agent": "opencode/1.18.31"}, "opencode"),
        ({"user-agent": "GeminiCLI/0.24.0 (linux; x64)"}, "gemini-cli"),
        ({"user-agent": "node", "x-claude-code-session-id": "s"}, "claude-code"),  # obfuscated UA
        ({"user-agent": "ai-sdk", "x-opencode-session": "s"}, "opencode"),
        ({"user-agent": "curl/8.5.0"}, OTHER),
        ({}, OTHER),
    ],
)
def test_the_agent_program_comes_from_its_user_agent(headers: dict[str, str], program: str) -> None:
    assert agent_program(headers) == program


def test_the_agent_programs_are_a_fixed_small_set() -> None:
    assert AGENTS == {"claude-code", "codex", "opencode", "gemini-cli", OTHER}
    minted = {agent_program({"user-agent": f"agent-{i}/1.0"}) for i in range(1000)}
    assert minted == {OTHER}


def test_the_parse_reads_the_bodys_session_key_and_carries_it_over_the_worker_link() -> None:
    raw = json.dumps({"model": "m", "input": "hi", "prompt_cache_key": "conv-1"}).encode()
    parsed = parse_body({":path": "/v1/responses"}, raw, ParseHints())
    assert parsed.fields is not None and parsed.fields.session_key == "conv-1"
    again = ParsedBody.from_wire(parsed.to_wire(), raw)
    assert again.fields == parsed.fields


async def routed_request(headers: dict[str, str], **extra: object) -> tuple[InferenceRequest, float]:
    """Drive one request through the EPP's request path; the request it routed, and the agent
    counter of its program."""
    ctx = make_ctx()
    seen: list[InferenceRequest] = []
    routed = ctx.telemetry.routed
    ctx.telemetry.routed = lambda request: (seen.append(request), routed(request))  # type: ignore[method-assign]
    body = json.dumps({"model": "llama", "messages": [{"role": "user", "content": "hi"}], **extra}).encode()
    route = await EppProcessor(ctx).on_request(headers, body)
    assert isinstance(route, RequestRoute) and len(seen) == 1
    request = seen[0]
    count = ctx.telemetry.registry.get_sample_value(
        "inference_extension_agent_requests_total", {"agent": request.agent or ""}
    )
    return request, count or 0.0


async def test_the_request_path_keys_the_session_from_an_agent_header_and_counts_the_agent() -> None:
    request, count = await routed_request({"user-agent": CLAUDE_UA, "x-claude-code-session-id": "cc-1"})
    assert request.session_key == "cc-1" and request.agent == "claude-code" and count == 1
    request, count = await routed_request({"user-agent": CODEX_UA, "session_id": "cx-1"})
    assert request.session_key == "cx-1" and request.agent == "codex" and count == 1
    # the configured header (default x-session-id) still wins
    request, _ = await routed_request({"x-session-id": "mine", "x-claude-code-session-id": "cc-1"})
    assert request.session_key == "mine"


async def test_the_request_path_keys_the_session_from_the_body() -> None:
    request, count = await routed_request({}, prompt_cache_key="pck-1")
    assert request.session_key == "pck-1" and request.agent == OTHER and count == 1
    request, _ = await routed_request({})
    assert request.session_key is None


def test_an_anonymous_request_of_a_known_agent_queues_as_that_agent() -> None:
    config, untrusted = FlowControlConfig(enabled=True, tenantHeader="x-tenant"), HeaderPolicy()
    assert tenant_of({"user-agent": CLAUDE_UA}, untrusted, config) == "agent:claude-code"
    assert tenant_of({"user-agent": CODEX_UA}, untrusted, config) == "agent:codex"
    assert tenant_of({"user-agent": "curl/8"}, untrusted, config) == ANONYMOUS
    # an untrusted tenant header is still ignored: the agent's share, not the named tenant's
    assert tenant_of({"x-tenant": "acme", "user-agent": CLAUDE_UA}, untrusted, config) == "agent:claude-code"


def test_explicit_tenants_keep_the_trust_rule() -> None:
    config = FlowControlConfig(enabled=True, tenantHeader="x-tenant")
    trusted = HeaderPolicy(internal=True)
    assert tenant_of({"x-tenant": "acme", "user-agent": CLAUDE_UA}, trusted, config) == "acme"
    claimed = FlowControlConfig(enabled=True, tenantClaim="org")
    claim_policy = HeaderPolicy(claim_value="yes")
    headers = {TENANT_CLAIM_HEADER: "org-7", "user-agent": CLAUDE_UA}
    assert tenant_of(headers, claim_policy, claimed) == "org-7"
    headers = {"x-gateway-tenant": "org-1", CLAIM_HEADER: "yes", "user-agent": CLAUDE_UA}
    assert tenant_of(headers, claim_policy, claimed) == "org-1"


async def test_two_agents_held_in_the_queue_take_turns_rather_than_one_bursts_first() -> None:
    """Claude Code's tool loop queues six requests, then Codex two: they leave alternately.
    Without agent tenants both are `anonymous` and leave first come first served."""
    flow = FlowController(CollectorRegistry(), FlowControlConfig(enabled=True))
    config, policy, gate = flow.config, HeaderPolicy(), Gate()
    waits = []
    for name, agent in [(f"claude{i}", CLAUDE_UA) for i in range(6)] + [
        (f"codex{i}", CODEX_UA) for i in range(2)
    ]:
        ticket = ticket_for(0, {"user-agent": agent}, policy, config)
        waits.append(asyncio.create_task(flow.wait(ticket, gate.attempt(name))))
        queued = len(waits)
        await until(lambda: len(flow.queue) == queued, f"{name} queued")  # noqa: B023 (awaited here)
    gate.open = 8
    flow.signal()
    await asyncio.gather(*waits)
    assert gate.order[:4] == ["claude0", "codex0", "claude1", "codex1"]
    await flow.stop()
