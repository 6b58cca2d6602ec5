"""A decision's first step: parse the request, pure and request-local.

Everything here reads only the request (its headers and body) and a few configuration facts
(`ParseHints`), never the picture of the pool, so it can run in whichever process holds the
stream: the single EPP process, or an ext_proc worker of a multi-core EPP (epp/workers/processes.py),
which then hands the deciding process a compact record (`ParsedBody.to_wire`, msgpack-able)
instead of a body to decode. The second step, deciding with the picture (snapshot, scoring,
pick, admission, flow control, ledger), is `EppProcessor.on_parsed`, the same in both.

What the parse does: the strict JSON decode, the scheduling fields (`epp.scheduling.request.read_fields`:
model, max_tokens, prompt text, previous response id, the first bad field; the request's path
says whether the body is OpenAI's or Anthropic's Messages API) and the prompt's
block hashes for the approximate prefix index, keyed by the model's base model and adapter as
the configuration routes it (`ParseHints`). The deciding process uses those hashes only where
they fit the key it would hash with (a rewrite to another model, pods reporting another KV block
size: it hashes again), so a decision never depends on where the parse ran. The raw body stays
with the record: the few paths that need the whole body (the precise prefix path's tokenizer
and chat template, the /v1/responses id tag, a model rewrite re-encoding the body) decode it
there, once, when they need it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from epp.datalayer.prefix_index import (
    DEFAULT_BLOCK_CHARS,
    DEFAULT_MAX_BLOCKS,
    PrefixIndex,
    PromptHashes,
    prompt_hashes,
)
from epp.requestcontrol.agent_session import body_session_key
from epp.scheduling.request import BodyFields, read_fields
from extproc.body import decode_json_object
from extproc.errors import ErrorResponse, bad_request, is_anthropic_path
from extproc.headers import MODEL_HEADER
from gateway.config import GatewayConfig

# msgpack carries 64-bit integers; a JSON max_tokens beyond them only ever counts as "huge"
# (InferenceRequest caps it at MAX_OUTPUT_TOKENS), so it crosses the link clamped.
_INT64_MAX = 2**63 - 1


@dataclass(frozen=True, slots=True)
class ParseHints:
    """The configuration facts a parse reads: per model name the base model and adapter its
    prompt is hashed under (the routes of the pools this process serves), the key for a model
    the routes do not name (a pool that accepts any model), and the index's block geometry."""

    keys: Mapping[str, tuple[str, str | None]] = field(default_factory=dict)
    any_model: tuple[str, str | None] | None = None
    block_chars: int = DEFAULT_BLOCK_CHARS
    max_blocks: int = DEFAULT_MAX_BLOCKS

    @classmethod
    def for_pools(
        cls,
        config: GatewayConfig,
        pools: Collection[str],
        index: PrefixIndex | None = None,
        *,
        unrouted: bool = False,
    ) -> ParseHints:
        """The hints of a process serving `pools`; `unrouted`: one pool's EPP, where a pool that
        accepts any model takes a name the routes do not know as its first model."""
        routes = config.routes()
        any_model = None
        if unrouted and len(pools) == 1:
            pool = config.pool(next(iter(pools)))
            if pool.accept_any_model and pool.models:
                any_model = (pool.models[0].name, None)
        return cls(
            keys={m: (r.base_model, r.adapter) for m, r in routes.items() if r.pool in pools},
            any_model=any_model,
            block_chars=index.block_chars if index is not None else DEFAULT_BLOCK_CHARS,
            max_blocks=index.max_blocks if index is not None else DEFAULT_MAX_BLOCKS,
        )

    def key(self, model: str) -> tuple[str, str | None] | None:
        return self.keys.get(model, self.any_model)

    def to_wire(self) -> dict[str, Any]:
        return {
            "keys": {m: list(k) for m, k in self.keys.items()},
            "any_model": list(self.any_model) if self.any_model is not None else None,
            "block_chars": self.block_chars,
            "max_blocks": self.max_blocks,
        }

    @classmethod
    def from_wire(cls, wire: Mapping[str, Any]) -> ParseHints:
        anyone = wire.get("any_model")
        return cls(
            keys={m: (str(k[0]), k[1]) for m, k in wire["keys"].items()},
            any_model=(str(anyone[0]), anyone[1]) if anyone is not None else None,
            block_chars=int(wire["block_chars"]),
            max_blocks=int(wire["max_blocks"]),
        )


@dataclass(slots=True)
class ParsedBody:
    """A request body parsed once: its fields and prompt hashes, or the error that refuses it.
    `raw` is the body as received; `data()` its decoded object, for the few paths that need it."""

    raw: bytes
    fields: BodyFields | None = None
    error: ErrorResponse | None = None
    prefix: PromptHashes | None = None
    _data: dict[str, Any] | None = None  # the decoded body, where this process decoded it

    def data(self) -> dict[str, Any]:
        """The decoded body (decoded here on first use when the parse ran in a worker)."""
        if self._data is None:
            decoded = decode_json_object(self.raw)
            if isinstance(decoded, ErrorResponse):  # the parse accepted it: it cannot fail now
                raise ValueError(f"the parsed body no longer decodes: {decoded.message}")
            self._data = decoded
        return self._data

    def to_wire(self) -> list[Any]:
        """The record without the raw body (it travels beside it) and the decoded object."""
        if self.error is not None:
            e = self.error
            return [0, e.status, e.message, e.code, e.headers]
        f = self.fields
        assert f is not None
        max_tokens = f.max_tokens
        if max_tokens is not None:
            max_tokens = max(-_INT64_MAX, min(max_tokens, _INT64_MAX))
        prefix = None
        if self.prefix is not None:
            p = self.prefix
            prefix = [p.model, p.adapter, p.block_chars, p.max_blocks, list(p.hashes)]
        return [1, f.model, max_tokens, f.prompt, f.previous_response_id, f.error, prefix, f.session_key]

    @classmethod
    def from_wire(cls, wire: list[Any], raw: bytes) -> ParsedBody:
        if wire[0] == 0:
            _, status, message, code, headers = wire
            return cls(raw, error=ErrorResponse(int(status), message, code, headers))
        _, model, max_tokens, prompt, previous, error, prefix, session_key = wire
        fields = BodyFields(model, max_tokens, prompt, previous, error, session_key)
        hashes = None
        if prefix is not None:
            model_, adapter, block_chars, max_blocks, values = prefix
            hashes = PromptHashes(model_, adapter, int(block_chars), int(max_blocks), tuple(values))
        return cls(raw, fields=fields, prefix=hashes)


def parse_body(headers: Mapping[str, str], body: bytes, hints: ParseHints) -> ParsedBody:
    """Decode and read the body, and hash its prompt under the key its model is routed with
    (the body's model, else the model header, as the EPP reads it)."""
    if not body:
        return ParsedBody(body, error=bad_request("an inference request needs a JSON body", "missing_body"))
    data = decode_json_object(body)
    if isinstance(data, ErrorResponse):
        return ParsedBody(body, error=data)
    fields = read_fields(data, messages_api=is_anthropic_path(headers.get(":path")))
    session_key = body_session_key(data)
    if session_key is not None:
        fields = dataclasses.replace(fields, session_key=session_key)
    parsed = ParsedBody(body, fields=fields, _data=data)
    model = fields.model or headers.get(MODEL_HEADER)
    key = hints.key(model) if isinstance(model, str) else None
    if key is not None and fields.error is None:
        base, adapter = key
        hashes = prompt_hashes(base, fields.prompt, hints.block_chars, hints.max_blocks, adapter)
        parsed.prefix = PromptHashes(base, adapter, hints.block_chars, hints.max_blocks, hashes)
    return parsed


class WorkerParser:
    """A worker's parse (epp/workers/worker.py): the hints from the deciding process's settings
    (`"parse"`, re-read when they change), the record out as the REQUEST's payload."""

    def __init__(self) -> None:
        self._settings: Mapping[str, Any] | None = None
        self._hints: ParseHints | None = None

    def __call__(
        self, headers: Mapping[str, str], body: bytes, settings: Mapping[str, Any]
    ) -> list[Any] | None:
        if settings is not self._settings:
            self._settings = settings
            wire = settings.get("parse")
            self._hints = ParseHints.from_wire(wire) if wire is not None else None
        if self._hints is None or not body:  # a service that does not parse: the body as it is
            return None
        return parse_body(headers, body, self._hints).to_wire()
