"""`/v1/embeddings` and `/v1/responses` as vLLM serves them (request parsing, response shapes).

Embeddings: `input` is a string, a list of strings, a list of token ids or a list of those
lists; the answer is vLLM's `EmbeddingResponse` (`object: list`, one `embedding` per input,
usage with prompt tokens). The vectors are deterministic pseudo-embeddings of the token ids
(unit length, `EMBEDDING_DIM` floats): the simulator serves shapes and timing, not semantics.

Responses: `input` (a string or message items) after `instructions`; `previous_response_id`
continues a stored response, which only the pod that produced it holds (as vLLM with its
response store: 404 for an unknown id); `request_id` (a vLLM extra parameter) becomes the
response id. Streaming (`stream: true`) is not simulated: 400.
"""

from __future__ import annotations

import math
import random
import uuid
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from modelsim.openai_api import ApiError, _opt_int, now_s, resolve_model
from modelsim.tokenizer import PromptError, PromptTokenizer

EMBEDDING_DIM = 32
STORED_RESPONSES = 10_000  # the pod's response store is bounded, oldest dropped first


@dataclass(frozen=True, slots=True)
class EmbeddingRequest:
    served_model: str
    adapter: str | None
    inputs: list[list[int]]  # token ids per input


def parse_embedding(
    body: dict[str, Any], model: str, adapters: tuple[str, ...], tok: PromptTokenizer
) -> EmbeddingRequest:
    vocab = tok.vocab_size
    served, adapter = resolve_model(body, model, adapters)
    raw = body.get("input")
    if raw is None:
        raise ApiError(400, "'input' is required")
    items = [raw] if isinstance(raw, str) or (isinstance(raw, list) and raw and _is_ids(raw)) else raw
    if not isinstance(items, list) or not items:
        raise ApiError(400, "'input' must be a string, a list of strings or a list of token ids")
    inputs: list[list[int]] = []
    for item in items:
        try:
            ids = tok.encode_text(item) if isinstance(item, str) else list(item) if _is_ids(item) else None
        except PromptError as exc:
            raise ApiError(400, str(exc)) from None
        if not ids:
            raise ApiError(400, "each 'input' must be a non-empty string or list of token ids")
        if any(not 0 <= t < vocab for t in ids):
            raise ApiError(400, "token id out of vocabulary")
        inputs.append(ids)
    return EmbeddingRequest(served, adapter, inputs)


def _is_ids(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in value)


def pseudo_embedding(ids: list[int]) -> list[float]:
    rng = random.Random(hash(tuple(ids[:512])) ^ len(ids))
    vec = [rng.gauss(0.0, 1.0) for _ in range(EMBEDDING_DIM)]
    norm = math.sqrt(sum(v * v for v in vec)) or 1.0
    return [v / norm for v in vec]


def embedding_response(req: EmbeddingRequest) -> dict[str, Any]:
    tokens = sum(len(ids) for ids in req.inputs)
    return {
        "id": f"embd-{uuid.uuid4().hex}",
        "object": "list",
        "created": now_s(),
        "model": req.served_model,
        "data": [
            {"index": i, "object": "embedding", "embedding": pseudo_embedding(ids)}
            for i, ids in enumerate(req.inputs)
        ],
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens, "completion_tokens": 0},
    }


@dataclass(frozen=True, slots=True)
class ResponsesRequest:
    response_id: str
    served_model: str
    adapter: str | None
    messages: list[dict[str, Any]]  # the whole conversation, previous turns first
    prompt_ids: list[int]
    max_tokens: int | None
    instructions: str | None
    previous_response_id: str | None
    store: bool


class ResponseStore:
    """response id -> the conversation it ended with (its messages plus its answer)."""

    def __init__(self, capacity: int = STORED_RESPONSES) -> None:
        self._items: OrderedDict[str, list[dict[str, Any]]] = OrderedDict()
        self._capacity = capacity

    def get(self, response_id: str) -> list[dict[str, Any]] | None:
        return self._items.get(response_id)

    def put(self, response_id: str, conversation: list[dict[str, Any]]) -> None:
        self._items[response_id] = conversation
        while len(self._items) > self._capacity:
            self._items.popitem(last=False)


def _input_messages(raw: Any) -> list[dict[str, Any]]:
    if isinstance(raw, str):
        return [{"role": "user", "content": raw}]
    if not isinstance(raw, list) or not raw:
        raise ApiError(400, "'input' must be a string or a non-empty list of input items")
    out = []
    for item in raw:
        if not isinstance(item, dict) or not isinstance(item.get("role", "user"), str):
            raise ApiError(400, "each input item must be an object with a string 'role'")
        content = item.get("content")
        if isinstance(content, list):  # input_text / output_text parts
            content = "\n".join(p.get("text", "") for p in content if isinstance(p, dict))
        if not isinstance(content, str):
            raise ApiError(400, "input item 'content' must be a string or a list of text parts")
        out.append({"role": item.get("role", "user"), "content": content})
    return out


def parse_responses(
    body: dict[str, Any], model: str, adapters: tuple[str, ...], tok: PromptTokenizer, store: ResponseStore
) -> ResponsesRequest:
    served, adapter = resolve_model(body, model, adapters)
    if body.get("stream"):
        raise ApiError(400, "modelsim does not stream /v1/responses")
    if "input" not in body:
        raise ApiError(400, "'input' is required")
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise ApiError(400, "'instructions' must be a string")
    previous = body.get("previous_response_id")
    history: list[dict[str, Any]] = []
    if previous is not None:
        if not isinstance(previous, str):
            raise ApiError(400, "'previous_response_id' must be a string")
        found = store.get(previous)
        if found is None:  # vLLM's answer when its store does not hold the id
            raise ApiError(404, f"Response with id '{previous}' not found.")
        history = found
    rid = body.get("request_id") or f"resp_{uuid.uuid4().hex}"
    if not isinstance(rid, str):
        raise ApiError(400, "'request_id' must be a string")
    messages = history + _input_messages(body["input"])
    rendered = ([{"role": "system", "content": instructions}] if instructions else []) + messages
    try:
        ids = tok.encode_chat(rendered)
    except PromptError as exc:
        raise ApiError(400, str(exc)) from None
    store_it = body.get("store", True)
    if not isinstance(store_it, bool):
        raise ApiError(400, "'store' must be a boolean")
    return ResponsesRequest(
        rid,
        served,
        adapter,
        messages,
        ids,
        _opt_int(body, "max_output_tokens", 1),
        instructions,
        previous,
        store_it,
    )


def responses_response(
    req: ResponsesRequest, text: str, prompt_tokens: int, output_tokens: int, cached: int, finish: str
) -> dict[str, Any]:
    status = "completed" if finish == "stop" else "incomplete"
    message = {
        "id": f"msg_{uuid.uuid4().hex}",
        "type": "message",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": None}],
    }
    return {
        "id": req.response_id,
        "object": "response",
        "created_at": now_s(),
        "model": req.served_model,
        "status": status,
        "incomplete_details": None if status == "completed" else {"reason": "max_output_tokens"},
        "instructions": req.instructions,
        "max_output_tokens": req.max_tokens,
        "previous_response_id": req.previous_response_id,
        "output": [message],
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "store": req.store,
        "usage": {
            "input_tokens": prompt_tokens,
            "input_tokens_details": {"cached_tokens": cached},
            "output_tokens": output_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt_tokens + output_tokens,
        },
    }
