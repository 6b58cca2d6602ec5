"""The parsed view of one inference request that scheduling reads.

Parsed once per request from the JSON body of an OpenAI-compatible path or of Anthropic's
Messages API (`/v1/messages`, `/v1/messages/count_tokens`); everything downstream (filters,
scorers, admission, accounting) reads this record and never the raw body again.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from epp.datalayer.prefix_index import PromptHashes

# A deterministic, dependency-free token estimate: ~4 characters per token is what
# OpenAI documents for English text, and it is all the gateway needs to weigh load.
CHARS_PER_TOKEN = 4
# Output tokens assumed for a request without max_tokens when predicting its load or service time.
DEFAULT_OUTPUT_TOKENS = 256
# Cap on the client's max_tokens in such predictions: any int is a valid JSON max_tokens, and
# 10**400 x a float overflows.
MAX_OUTPUT_TOKENS = 1_000_000


@dataclass(frozen=True, slots=True)
class InferenceRequest:
    request_id: str
    model: str  # the name the client asked for (base model or LoRA adapter)
    target_model: str  # the base model whose pool serves it
    adapter: str | None  # the LoRA adapter to run, when `model` names one
    prompt: str  # prompt text used for prefix-affinity hashing
    prompt_tokens: int  # chars / 4 of the prompt; the tokenizer's count once token_ids are set
    max_tokens: int | None
    objective: str | None = None  # x-gateway-inference-objective
    priority: int = 0  # negative = sheddable
    headers: Mapping[str, str] = field(default_factory=dict)
    # The conversation's key: the sessionAffinity header, else what coding agents send
    # (epp/requestcontrol/agent_session.py); None when the request carries none.
    session_key: str | None = None
    previous_response_id: str | None = None  # /v1/responses: the turn this one continues
    slo_ttft_s: float | None = (
        None  # its time-to-first-token objective (epp/requestcontrol/header_policy.py), if any
    )
    # The prompt as the engine tokenizes it (epp/datalayer/tokenizer.py), when the model has a tokenizer
    # and the profile scores with the precise KV index; None otherwise.
    token_ids: tuple[int, ...] | None = None
    # The prompt's block hashes, when the parse computed them (epp/requestcontrol/parse.py): the prefix index
    # uses them where they fit its key, instead of hashing the prompt again.
    prefix: PromptHashes | None = None
    # The agent program that sent it (epp/requestcontrol/agent_session.py AGENTS), None when not read.
    agent: str | None = None

    @property
    def expected_output_tokens(self) -> int:
        """max_tokens when given (capped), else the default guess."""
        return min(self.max_tokens or DEFAULT_OUTPUT_TOKENS, MAX_OUTPUT_TOKENS)

    @property
    def estimated_tokens(self) -> int:
        """Prompt plus expected output: what this request adds to a pod's load."""
        return self.prompt_tokens + self.expected_output_tokens


class RequestError(ValueError):
    """The body is not a request the gateway can route (maps to HTTP 400)."""


def _message_text(message: Mapping[str, Any]) -> str:
    """`role:text` lines of one chat message or Responses input item (string or typed parts)."""
    content = message.get("content")
    role = str(message.get("role", ""))
    if isinstance(content, str):
        return f"{role}:{content}\n"
    parts: list[str] = []
    if isinstance(content, list):
        for item in content:
            if isinstance(item, Mapping) and isinstance(item.get("text"), str):
                parts.append(f"{role}:{item['text']}\n")
    return "".join(parts)


def _input_text(value: Any, field_name: str) -> str:
    """`prompt` (completions), `input` (embeddings, responses): a string, or an array of
    strings, token ids, token-id arrays or (responses) message items."""
    if isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise RequestError(f"'{field_name}' must be a string or an array")
    parts: list[str] = []
    for item in value:
        if isinstance(item, str):
            parts.append(item)
        elif isinstance(item, int) and not isinstance(item, bool):
            parts.append(f"{item},")  # token ids hash as their decimal text
        elif isinstance(item, list):
            parts.append("".join(f"{t}," for t in item if isinstance(t, int)) + "\n")
        elif isinstance(item, Mapping):
            parts.append(_message_text(item))
        else:
            raise RequestError(f"'{field_name}' items must be strings, token ids or objects")
    return "".join(parts)


def prompt_text(body: Mapping[str, Any]) -> str:
    """Concatenate the prompt-bearing parts of an OpenAI body, in the order the model reads them.

    Chat: `messages`; completions: `prompt`; embeddings: `input`; responses: `instructions`
    (the system prompt, read first) then `input`. The order matters: prefix affinity hashes the
    leading characters, so a multi-turn chat shares its prefix with its previous turns.
    """
    if "messages" in body:
        messages = body["messages"]
        if not isinstance(messages, list):
            raise RequestError("'messages' must be an array")
        parts: list[str] = []
        for message in messages:
            if not isinstance(message, Mapping):
                raise RequestError("each message must be an object")
            parts.append(_message_text(message))
        return "".join(parts)
    if "input" in body:
        instructions = body.get("instructions")
        if instructions is not None and not isinstance(instructions, str):
            raise RequestError("'instructions' must be a string")
        head = f"system:{instructions}\n" if instructions else ""
        return head + _input_text(body["input"], "input")
    prompt = body.get("prompt", "")
    try:
        return _input_text(prompt, "prompt")
    except RequestError:
        raise RequestError("'prompt' must be a string or an array of strings") from None


# Keys of an Anthropic content block that do not change what the model reads: clients move
# their `cache_control` breakpoint to the newest turn, so a turn's blocks must hash the same
# with it as without it, or a conversation would not share its prefix with its previous turns.
_PRESENTATION_KEYS = frozenset({"cache_control"})


def _canonical(value: Any) -> str:
    """A JSON value as one deterministic string (sorted keys, compact, no presentation keys)."""
    if isinstance(value, Mapping):
        value = {k: v for k, v in value.items() if k not in _PRESENTATION_KEYS}
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _block_text(block: Any, where: str) -> str:
    """What the model reads of one Anthropic content block: a text block's (or thinking
    block's) text, a tool call's name and input, a tool result's content; any other block
    (image, document, ...) as its canonical JSON, so different sources hash differently."""
    if not isinstance(block, Mapping):
        raise RequestError(f"each {where} content block must be an object")
    kind = block.get("type")
    if kind == "text" and isinstance(block.get("text"), str):
        return block["text"]
    if kind == "thinking" and isinstance(block.get("thinking"), str):
        return block["thinking"]
    if kind == "tool_use":
        return f"tool_use {block.get('name')}:{_canonical(block.get('input'))}"
    if kind == "tool_result":
        return "tool_result:" + _anthropic_content(block.get("content", ""), where)
    return _canonical(block)


def _anthropic_content(content: Any, where: str) -> str:
    """A string, or an array of content blocks (their texts, one per line)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise RequestError(f"{where} content must be a string or an array of content blocks")
    return "\n".join(_block_text(block, where) for block in content)


def messages_prompt_text(body: Mapping[str, Any]) -> str:
    """The prompt of an Anthropic Messages API body (`/v1/messages`, its `count_tokens`), in the
    order Anthropic's own prompt cache reads it: `tools`, then `system`, then `messages`, one
    `role:text` line per message as the OpenAI shapes hash, so a multi-turn conversation shares
    its prefix with its previous turns. Deterministic: tool definitions and non-text blocks are
    canonical JSON (sorted keys), and `cache_control` markers are left out."""
    parts: list[str] = []
    tools = body.get("tools")
    if tools is not None:
        if not isinstance(tools, list) or not all(isinstance(t, Mapping) for t in tools):
            raise RequestError("'tools' must be an array of objects")
        parts.extend(f"tool:{_canonical(tool)}\n" for tool in tools)
    system = body.get("system")
    if system is not None:
        if not isinstance(system, (str, list)):
            raise RequestError("'system' must be a string or an array of text blocks")
        parts.append(f"system:{_anthropic_content(system, 'system')}\n")
    messages = body.get("messages")
    if not isinstance(messages, list):
        raise RequestError("'messages' must be an array")
    for message in messages:
        if not isinstance(message, Mapping):
            raise RequestError("each message must be an object")
        role = message.get("role")
        if not isinstance(role, str):
            raise RequestError("each message needs a string 'role'")
        parts.append(f"{role}:{_anthropic_content(message.get('content'), 'message')}\n")
    return "".join(parts)


@dataclass(frozen=True, slots=True)
class BodyFields:
    """What scheduling reads of a decoded body, before any configuration is applied: pure and
    request-local, so an ext_proc worker can read it (epp/requestcontrol/parse.py) and the deciding process
    `request_from_fields` it, exactly as `parse_request` would have."""

    # The body's "model": its string, None when absent or null, False / True for another
    # JSON value that is falsy / truthy (both are refused, but a falsy one falls back to
    # the model header where the EPP reads one).
    model: str | bool | None
    max_tokens: int | None
    prompt: str
    previous_response_id: str | None
    error: str | None = None  # the first bad field after `model`, in `parse_request`'s order
    # The session key the body carries (`metadata.user_id`'s session, `prompt_cache_key`), set
    # by the parse (epp/requestcontrol/parse.py, with agent_session.py's `body_session_key`).
    session_key: str | None = None


def _model_field(value: Any) -> str | bool | None:
    if value is None or isinstance(value, str):
        return value
    return bool(value)


def read_fields(body: Mapping[str, Any], *, messages_api: bool = False) -> BodyFields:
    """The scheduling fields of a decoded body; a bad one is recorded in `error` (the fields
    after it are left empty), as `parse_request` would raise it after checking the model.
    `messages_api`: the body is Anthropic's (`/v1/messages`), whose prompt is read by
    `messages_prompt_text`; its other fields (`model`, `max_tokens`, `stream`) are OpenAI's."""
    model = _model_field(body.get("model"))
    try:
        max_tokens = body.get("max_completion_tokens", body.get("max_tokens", body.get("max_output_tokens")))
        if max_tokens is not None and (not isinstance(max_tokens, int) or isinstance(max_tokens, bool)):
            raise RequestError("'max_tokens' must be an integer")
        if not isinstance(body.get("stream", False), bool):  # refused here, with a clear 400
            raise RequestError("'stream' must be a boolean")
        text = messages_prompt_text(body) if messages_api else prompt_text(body)
        previous = body.get("previous_response_id")
        if previous is not None and not isinstance(previous, str):
            raise RequestError("'previous_response_id' must be a string")
    except RequestError as exc:
        return BodyFields(model, None, "", None, str(exc))
    return BodyFields(model, max_tokens, text, previous)


def request_from_fields(
    fields: BodyFields,
    *,
    request_id: str,
    target_model: str,
    adapter: str | None,
    headers: Mapping[str, str],
    objective: str | None = None,
    priority: int = 0,
    session_key: str | None = None,
    model: str | bool | None = None,
    prefix: PromptHashes | None = None,
    slo_ttft_s: float | None = None,
    agent: str | None = None,
) -> InferenceRequest:
    """The scheduling view of a body's fields; raises RequestError on bad fields. `model`:
    the name the request is sent as when a rewrite replaced the body's."""
    model = fields.model if model is None else model
    if not isinstance(model, str) or not model:
        raise RequestError("'model' must be a non-empty string")
    if fields.error is not None:
        raise RequestError(fields.error)
    return InferenceRequest(
        request_id=request_id,
        model=model,
        target_model=target_model,
        adapter=adapter,
        prompt=fields.prompt,
        prompt_tokens=max(1, len(fields.prompt) // CHARS_PER_TOKEN),
        max_tokens=fields.max_tokens,
        objective=objective,
        priority=priority,
        headers=headers,
        session_key=session_key or None,
        previous_response_id=fields.previous_response_id,
        prefix=prefix,
        slo_ttft_s=slo_ttft_s,
        agent=agent,
    )


def parse_request(
    body: Mapping[str, Any],
    *,
    request_id: str,
    target_model: str,
    adapter: str | None,
    headers: Mapping[str, str],
    objective: str | None = None,
    priority: int = 0,
    session_key: str | None = None,
    messages_api: bool = False,
) -> InferenceRequest:
    """Build the scheduling view of a decoded JSON body; raises RequestError on bad fields."""
    return request_from_fields(
        read_fields(body, messages_api=messages_api),
        request_id=request_id,
        target_model=target_model,
        adapter=adapter,
        headers=headers,
        objective=objective,
        priority=priority,
        session_key=session_key,
    )
