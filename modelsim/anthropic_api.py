"""Anthropic's Messages API (`/v1/messages`, `/v1/messages/count_tokens`) as vLLM serves it.

vLLM turns a Messages request into a chat completion (the system prompt as a system message,
each message's content blocks as text) and the answer back into Anthropic's shapes: a `message`
object, or the SSE events `message_start`, `content_block_start`, `content_block_delta`...,
`content_block_stop`, `message_delta` (stop reason and output usage), `message_stop`.
`count_tokens` tokenizes the same rendering and runs nothing. Errors are Anthropic's
`{"type": "error", "error": {"type", "message"}}`.

Tool definitions, tool calls and tool results are rendered as text (the simulator serves
shapes and timing, not tool use): they count as prompt tokens, and the answer is always one
text block.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from modelsim.openai_api import ApiError

# Anthropic's error `type` per HTTP status.
_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    529: "overloaded_error",
}
# The engine's finish reason -> Anthropic's stop reason.
_STOP_REASONS = {"stop": "end_turn", "length": "max_tokens"}


def error_body(status: int, message: str) -> dict[str, Any]:
    kind = _ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


def _block_text(block: Any) -> str:
    if not isinstance(block, dict):
        raise ApiError(400, "each content block must be an object")
    kind = block.get("type")
    if kind == "text":
        if not isinstance(block.get("text"), str):
            raise ApiError(400, "a text block needs a string 'text'")
        return block["text"]
    if kind == "tool_use":
        return f"[tool_use {block.get('name')}] {json.dumps(block.get('input'), sort_keys=True)}"
    if kind == "tool_result":
        return f"[tool_result] {_content_text(block.get('content', ''))}"
    if kind == "thinking":
        return str(block.get("thinking", ""))
    return ""  # images, documents: no text tokens in the simulator


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(_block_text(block) for block in content)
    raise ApiError(400, "content must be a string or an array of content blocks")


def chat_body(body: dict[str, Any], *, count_only: bool = False) -> dict[str, Any]:
    """The chat-completions body a Messages request is served as (vLLM's conversion)."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "'messages' must be a non-empty array")
    if not count_only and "max_tokens" not in body:
        raise ApiError(400, "'max_tokens' is required")
    chat: list[dict[str, Any]] = []
    system = body.get("system")
    tools = body.get("tools")
    head = [] if system is None else [_content_text(system)]
    if tools is not None:
        if not isinstance(tools, list):
            raise ApiError(400, "'tools' must be an array")
        head += [f"[tool] {json.dumps(tool, sort_keys=True)}" for tool in tools]
    if head:
        chat.append({"role": "system", "content": "\n".join(head)})
    for message in messages:
        if not isinstance(message, dict) or message.get("role") not in ("user", "assistant"):
            raise ApiError(400, "each message must be an object with role 'user' or 'assistant'")
        chat.append({"role": message["role"], "content": _content_text(message.get("content"))})
    out: dict[str, Any] = {"messages": chat}
    for key in ("model", "max_tokens"):
        if key in body:
            out[key] = body[key]
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise ApiError(400, "'stream' must be a boolean")
    if stream:
        out["stream"] = True
        out["stream_options"] = {"include_usage": True}
    return out


def new_message_id() -> str:
    return f"msg_{uuid.uuid4().hex}"


def stop_reason(finish: str) -> str:
    return _STOP_REASONS.get(finish, "end_turn")


def message(
    rid: str, model: str, text: str, finish: str, input_tokens: int, output_tokens: int
) -> dict[str, Any]:
    """The non-streamed answer."""
    return {
        "id": rid,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [{"type": "text", "text": text}],
        "stop_reason": stop_reason(finish),
        "stop_sequence": None,
        "usage": {"input_tokens": input_tokens, "output_tokens": output_tokens},
    }


def sse(event: dict[str, Any]) -> bytes:
    """One server-sent event, named by its `type` as Anthropic names them."""
    return f"event: {event['type']}\ndata: {json.dumps(event, separators=(',', ':'))}\n\n".encode()


def stream_start(rid: str, model: str, input_tokens: int) -> list[dict[str, Any]]:
    """`message_start` (the message without content, its input usage) and the text block's start."""
    opening = {
        "id": rid,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {"input_tokens": input_tokens, "output_tokens": 0},
    }
    return [
        {"type": "message_start", "message": opening},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
    ]


def text_delta(text: str) -> dict[str, Any]:
    return {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": text}}


def stream_end(finish: str, output_tokens: int) -> list[dict[str, Any]]:
    return [
        {"type": "content_block_stop", "index": 0},
        {
            "type": "message_delta",
            "delta": {"stop_reason": stop_reason(finish), "stop_sequence": None},
            "usage": {"output_tokens": output_tokens},
        },
        {"type": "message_stop"},
    ]
