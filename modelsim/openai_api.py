"""Parsing and shaping of OpenAI-compatible requests and responses, as vLLM serves them.

Errors use the OpenAI shape ``{"error": {"message", "type", "param", "code"}}`` that current vLLM
returns (older vLLM used a flat ``{"object": "error", "message", ...}``).
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from typing import Any

from modelsim.tokenizer import PromptError, PromptTokenizer

_ERROR_TYPES = {
    400: "BadRequestError",
    404: "NotFoundError",
    500: "InternalServerError",
    503: "ServiceUnavailable",
}


class ApiError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message

    def body(self) -> dict[str, Any]:
        return error_body(self.status, self.message)


def error_body(status: int, message: str) -> dict[str, Any]:
    return {
        "error": {
            "message": message,
            "type": _ERROR_TYPES.get(status, "Error"),
            "param": None,
            "code": status,
        }
    }


@dataclass(frozen=True, slots=True)
class GenerationRequest:
    kind: str  # "chat" | "completion"
    served_model: str
    adapter: str | None
    prompt_ids: list[int]
    max_tokens: int | None
    stream: bool
    include_usage: bool
    seed: int | None


def parse_json(raw: bytes) -> dict[str, Any]:
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ApiError(400, f"request body is not valid JSON: {exc}") from None
    except RecursionError:  # nesting deeper than the interpreter's stack
        raise ApiError(400, "request body is nested too deeply") from None
    if not isinstance(body, dict):
        raise ApiError(400, "request body must be a JSON object")
    return body


INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def _opt_int(body: dict[str, Any], key: str, minimum: int, maximum: int = INT64_MAX) -> int | None:
    """vLLM's integer fields are int64 at most (its request models bound `seed` exactly so)."""
    v = body.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise ApiError(400, f"'{key}' must be an integer")
    if v < minimum:
        raise ApiError(400, f"'{key}' must be >= {minimum}")
    if v > maximum:
        raise ApiError(400, f"'{key}' must be <= {maximum}")
    return v


def _opt_bool(body: dict[str, Any], key: str) -> bool:
    v = body.get(key, False)
    if v is None:
        return False
    if not isinstance(v, bool):
        raise ApiError(400, f"'{key}' must be a boolean")
    return v


def resolve_model(body: dict[str, Any], model: str, adapters: tuple[str, ...]) -> tuple[str, str | None]:
    """The served name and adapter a request asks for; a missing model means the base model."""
    name = body.get("model")
    if name is None:
        return model, None
    if not isinstance(name, str):
        raise ApiError(400, "'model' must be a string")
    if name == model:
        return model, None
    if name in adapters:
        return name, name
    raise ApiError(404, f"The model `{name}` does not exist.")


def prompt_ids_of(body: dict[str, Any], kind: str, tok: PromptTokenizer) -> list[int]:
    vocab_size = tok.vocab_size
    try:
        if kind == "chat":
            if "messages" not in body:
                raise ApiError(400, "'messages' is required")
            return tok.encode_chat(body["messages"])
        if "prompt" not in body:
            raise ApiError(400, "'prompt' is required")
        prompt = body["prompt"]
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if isinstance(prompt, str):
            ids = tok.encode_text(prompt)
        elif (
            isinstance(prompt, list)
            and prompt
            and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)
        ):
            bad = next((t for t in prompt if not 0 <= t < vocab_size), None)
            if bad is not None:  # vLLM's wording
                raise ApiError(400, f"Token id {bad} is out of vocabulary")
            ids = list(prompt)
        else:
            raise ApiError(
                400, "'prompt' must be a string or a list of token ids (batches are not supported)"
            )
    except PromptError as exc:
        raise ApiError(400, str(exc)) from None
    if not ids:
        raise ApiError(400, "the prompt has no tokens")
    return ids


def parse_generation(
    body: dict[str, Any], kind: str, model: str, adapters: tuple[str, ...], tok: PromptTokenizer
) -> GenerationRequest:
    served, adapter = resolve_model(body, model, adapters)
    ids = prompt_ids_of(body, kind, tok)
    max_tokens = _opt_int(body, "max_completion_tokens", 1) if kind == "chat" else None
    if max_tokens is None:
        max_tokens = _opt_int(body, "max_tokens", 1)
    n = _opt_int(body, "n", 1)
    if n not in (None, 1):
        raise ApiError(400, "modelsim supports only n=1")
    stream = _opt_bool(body, "stream")
    opts = body.get("stream_options")
    if opts is not None and not isinstance(opts, dict):
        raise ApiError(400, "'stream_options' must be an object")
    include_usage = bool(opts and _opt_bool(opts, "include_usage"))
    if include_usage and not stream:
        raise ApiError(400, "Stream options can only be defined when `stream=True`.")
    seed = _opt_int(body, "seed", INT64_MIN)
    return GenerationRequest(kind, served, adapter, ids, max_tokens, stream, include_usage, seed)


def check_context(prompt_tokens: int, max_tokens: int | None, max_model_len: int) -> None:
    """vLLM refuses (400) a request whose prompt plus `max_tokens` cannot fit the context (a prompt
    that alone is too long gets the engine's own message)."""
    if max_tokens is not None and prompt_tokens < max_model_len < prompt_tokens + max_tokens:
        raise ApiError(
            400,
            f"'max_tokens' or 'max_completion_tokens' is too large: {max_tokens}. This model's maximum "
            f"context length is {max_model_len} tokens and your request has {prompt_tokens} input tokens "
            f"({max_tokens} > {max_model_len} - {prompt_tokens}).",
        )


def new_id(kind: str) -> str:
    return ("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex


def usage(prompt: int, completion: int, cached: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt,
        "total_tokens": prompt + completion,
        "completion_tokens": completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    }


def chunk(
    kind: str, rid: str, created: int, model: str, text: str | None, finish: str | None
) -> dict[str, Any]:
    """One streaming chunk; ``text=None`` on chat gives the opening role delta."""
    if kind == "chat":
        if text is None and finish is None:
            delta: dict[str, Any] = {"role": "assistant", "content": ""}
        else:
            delta = {"content": text} if text else {}
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        obj = "chat.completion.chunk"
    else:
        choice = {
            "index": 0,
            "text": text or "",
            "logprobs": None,
            "finish_reason": finish,
            "stop_reason": None,
        }
        obj = "text_completion"
    return {"id": rid, "object": obj, "created": created, "model": model, "choices": [choice]}


def usage_chunk(kind: str, rid: str, created: int, model: str, use: dict[str, Any]) -> dict[str, Any]:
    obj = "chat.completion.chunk" if kind == "chat" else "text_completion"
    return {"id": rid, "object": obj, "created": created, "model": model, "choices": [], "usage": use}


def full_response(
    kind: str, rid: str, created: int, model: str, text: str, finish: str, use: dict[str, Any]
) -> dict[str, Any]:
    if kind == "chat":
        message = {"role": "assistant", "content": text, "reasoning_content": None, "tool_calls": []}
        choice: dict[str, Any] = {"index": 0, "message": message, "logprobs": None, "finish_reason": finish,
                                  "stop_reason": None}  # fmt: skip
        obj = "chat.completion"
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish, "stop_reason": None,
                  "prompt_logprobs": None}  # fmt: skip
        obj = "text_completion"
    return {"id": rid, "object": obj, "created": created, "model": model, "choices": [choice], "usage": use}


def now_s() -> int:
    return int(time.time())
