"""The tokens the engine will see: the model's own tokenizer files and chat template, cached.

To look a request up in the precise KV index (epp/datalayer/kv_index.py) the EPP needs the token ids
the engine computes. Per model a local folder in the Hugging Face layout is loaded
(``tokenizer.json``, ``tokenizer_config.json`` with ``chat_template``, ``bos_token``,
``eos_token``; or ``chat_template.jinja``). Chat messages are rendered as vLLM renders them
(transformers' ``apply_chat_template``: a sandboxed Jinja environment, ``trim_blocks`` and
``lstrip_blocks``, ``add_generation_prompt=True``, text parts joined with newlines) and
tokenized without adding special tokens (the template writes them); a completions prompt is
tokenized with them (the post-processor adds BOS), as vLLM's endpoints do.

The cache. A multi-turn conversation grows by one or two messages per request, and
tokenizing it from scratch costs about 1 us per character. The tokenizer splits its input at
its special tokens before anything else, so text between two of them is tokenized on its
own: the rendered text is cut there, each piece looked up in a bounded LRU of piece ->
token ids, and only the new pieces (the new messages, when the template puts special tokens
between messages, as Llama-3, ChatML and most templates do) are tokenized. At load a sample
conversation checks that the pieces joined give exactly the full tokenization; if not
(special tokens that strip whitespace, a normalizer that reaches across), the model's
text is tokenized whole (correct, uncached). Tokenizing the new pieces runs in a worker
thread when they are long (``encode_batch`` releases the GIL), so the event loop keeps
serving other requests meanwhile. Only the first ``MAX_CHARS`` characters are tokenized
(prefix matching needs the leading blocks; a huge body must not cost minutes of CPU).

A model without a tokenizer, or whose files fail to load, gets no token ids: scheduling
falls back to the approximate prefix index for it, and ``/debug/pool`` says why.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer

log = logging.getLogger(__name__)

# Piece cache bound, in tokens (each costs ~4 bytes of ids plus its text: ~10 MB at the default).
DEFAULT_CACHE_TOKENS = 1_000_000
# New text longer than this (characters) is tokenized in a worker thread, off the event loop.
OFFLOAD_CHARS = 2048
# Only the leading part of a prompt matters for prefix matching, and a 256 MB body would
# otherwise cost minutes of CPU: text past this many characters (~64k tokens) is not
# tokenized, and the last tokens before the cut, which the cut may have changed, are dropped.
MAX_CHARS = 256 * 1024
CUT_TOKENS = 8
_SAMPLE = [
    {"role": "system", "content": " You answer briefly.\n"},
    {"role": "user", "content": "Hello there,  world!\n\n  How are you?"},
    {"role": "assistant", "content": "Fine. 12345 tokens, 'quoted' & ünïcode."},
    {"role": "user", "content": "\tAnd again? "},
]


class TokenizerLoadError(ValueError):
    """A model's tokenizer folder is missing or its files are unusable."""


class TokenizeError(ValueError):
    """The request's messages or prompt cannot be rendered or tokenized (no token ids)."""


def _token_text(value: Any) -> str | None:
    """``bos_token`` etc.: a string or an AddedToken-style ``{"content": ...}`` object."""
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping) and isinstance(value.get("content"), str):
        return str(value["content"])
    return None


def _raise_exception(message: str) -> None:
    raise TokenizeError(f"chat template: {message}")


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: Any = None,
    sort_keys: bool = False,
) -> str:
    """transformers' `tojson` (Jinja's own escapes <, >, & and ' for HTML, which no engine does)."""
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _environment() -> ImmutableSandboxedEnvironment:
    """The environment transformers' apply_chat_template renders in (what vLLM calls)."""
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


def _content_text(content: Any) -> str:
    """A message's content as vLLM's "string" content format: text parts joined by newlines."""
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list):
        texts = []
        for part in content:
            if not isinstance(part, Mapping):
                raise TokenizeError("message content parts must be objects")
            if part.get("type") == "text":
                if not isinstance(part.get("text"), str):
                    raise TokenizeError("a text content part needs a string 'text'")
                texts.append(part["text"])
        return "\n".join(texts)
    raise TokenizeError("message content must be a string or a list of parts")


def normalize_messages(messages: Any) -> list[dict[str, Any]]:
    if not isinstance(messages, list) or not messages:
        raise TokenizeError("'messages' must be a non-empty list")
    out = []
    for msg in messages:
        if not isinstance(msg, Mapping) or not isinstance(msg.get("role"), str):
            raise TokenizeError("each message must be an object with a string 'role'")
        out.append({**msg, "content": _content_text(msg.get("content"))})
    return out


@dataclass(slots=True)
class _Plan:
    """A text cut at its special tokens: ids of those, and the pieces between (str)."""

    parts: list[str | int]
    missing: list[str]  # distinct pieces not in the cache, to tokenize
    cut: bool = False  # the text was cut at MAX_CHARS inside its last piece


class ModelTokenizer:
    """One model's tokenizer, chat template and piece cache. Synchronous except `encode_async`."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        chat_template: str | None = None,
        special_tokens: Mapping[str, str | None] | None = None,
        *,
        cache_tokens: int = DEFAULT_CACHE_TOKENS,
        source: str = "",
    ) -> None:
        self.tokenizer = tokenizer
        self.source = source
        self.vocab_size = tokenizer.get_vocab_size()
        self._specials = {k: v for k, v in (special_tokens or {}).items() if v is not None}
        self.template: jinja2.Template | None = None
        if chat_template is not None:
            try:
                self.template = _environment().from_string(chat_template)
            except jinja2.TemplateError as exc:
                raise TokenizerLoadError(f"chat template does not compile: {exc}") from None
        # Special tokens the tokenizer splits at, exactly (no whitespace stripping, not normalized).
        splitters = {
            t.content: i
            for i, t in tokenizer.get_added_tokens_decoder().items()
            if t.special and not (t.lstrip or t.rstrip or t.single_word or t.normalized)
        }
        self._special_ids = splitters
        self._split = (
            re.compile("(" + "|".join(re.escape(s) for s in sorted(splitters, key=len, reverse=True)) + ")")
            if splitters
            else None
        )
        self.cache_tokens = cache_tokens
        self._cache: OrderedDict[str, list[int]] = OrderedDict()
        self._cached_tokens = 0
        self.hits = 0
        self.misses = 0
        self.segmented = self._split is not None and self._check_segmentation()

    # ---- rendering ---------------------------------------------------------------------
    def render_chat(self, messages: Any, add_generation_prompt: bool = True) -> str:
        if self.template is None:
            raise TokenizeError("the model's tokenizer has no chat template")
        try:
            return self.template.render(
                messages=normalize_messages(messages),
                add_generation_prompt=add_generation_prompt,
                **self._specials,
            )
        except TokenizeError:
            raise
        except Exception as exc:  # a template error, or the sandbox refusing an operation
            raise TokenizeError(f"chat template failed: {type(exc).__name__}: {exc}") from None

    # ---- tokenizing --------------------------------------------------------------------
    def encode_full(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """The reference: the whole text in one call, no cache."""
        return list(self.tokenizer.encode(text, add_special_tokens=add_special_tokens).ids)

    def plan(self, text: str) -> _Plan:
        _check_unicode(text)
        cut = len(text) > MAX_CHARS
        if cut:
            text = text[:MAX_CHARS]
        if not self.segmented or self._split is None:
            pieces: list[str] = [text] if text else []
        else:
            pieces = [p for p in self._split.split(text) if p]
        parts: list[str | int] = []
        missing: dict[str, None] = {}
        cache, ids = self._cache, self._special_ids
        for piece in pieces:
            special = ids.get(piece)
            if special is not None:
                parts.append(special)
                continue
            parts.append(piece)
            if piece not in cache:
                missing[piece] = None
        cut = cut and bool(parts) and isinstance(parts[-1], str)
        return _Plan(parts, list(missing), cut)

    def encode_missing(self, missing: Sequence[str]) -> list[list[int]]:
        """Tokenize the new pieces (thread-safe: no shared state; releases the GIL)."""
        if not missing:
            return []
        return [list(e.ids) for e in self.tokenizer.encode_batch(list(missing), add_special_tokens=False)]

    def complete(self, plan: _Plan, encoded: Sequence[list[int]]) -> list[int]:
        """Join a plan's parts, storing the newly encoded pieces in the cache."""
        fresh = dict(zip(plan.missing, encoded, strict=True))
        cache = self._cache
        out: list[int] = []
        for part in plan.parts:
            if isinstance(part, int):
                out.append(part)
                continue
            ids = fresh.get(part)
            if ids is None:
                ids = cache.get(part)
                if ids is None:  # evicted since the plan was made: tokenize it now
                    ids = fresh[part] = self.encode_missing([part])[0]
                else:
                    cache.move_to_end(part)
                    self.hits += 1
            out.extend(ids)
        for piece, ids in fresh.items():
            self.misses += 1
            self._store(piece, ids)
        if plan.cut:
            del out[-CUT_TOKENS:]
        return out

    def _store(self, piece: str, ids: list[int]) -> None:
        if len(ids) > self.cache_tokens:
            return
        old = self._cache.pop(piece, None)
        if old is not None:
            self._cached_tokens -= len(old)
        self._cache[piece] = ids
        self._cached_tokens += len(ids)
        while self._cached_tokens > self.cache_tokens:
            _, gone = self._cache.popitem(last=False)
            self._cached_tokens -= len(gone)

    def encode_text(self, text: str) -> list[int]:
        """Rendered text (special tokens written out) -> ids, through the piece cache."""
        plan = self.plan(text)
        return self.complete(plan, self.encode_missing(plan.missing))

    async def encode_text_async(self, text: str) -> list[int]:
        """`encode_text`, tokenizing long new pieces in a worker thread."""
        plan = self.plan(text)
        if sum(len(p) for p in plan.missing) > OFFLOAD_CHARS:
            encoded = await asyncio.to_thread(self.encode_missing, plan.missing)
        else:
            encoded = self.encode_missing(plan.missing)
        return self.complete(plan, encoded)

    def encode_chat(self, messages: Any) -> list[int]:
        return self.encode_text(self.render_chat(messages))

    def encode_prompt(self, prompt: str) -> list[int]:
        """A completions prompt: special tokens added by the post-processor (BOS), no cache."""
        _check_unicode(prompt)
        # encode_batch releases the GIL (encode does not): this runs in a worker thread when long
        ids = list(self.tokenizer.encode_batch([prompt[:MAX_CHARS]], add_special_tokens=True)[0].ids)
        return ids if len(prompt) <= MAX_CHARS else ids[:-CUT_TOKENS]

    def _check_segmentation(self) -> bool:
        """Do the cached pieces join to exactly the full tokenization (on a sample)?"""
        if self.template is None:
            specials = list(self._special_ids)
            sample = "".join(f"{specials[i % len(specials)]}{m['content']}" for i, m in enumerate(_SAMPLE))
        else:
            try:
                sample = self.render_chat(_SAMPLE)
            except TokenizeError:
                return False
        self.segmented = True
        try:
            ok = self.encode_text(sample) == self.encode_full(sample)
        finally:
            self._cache.clear()
            self._cached_tokens = self.hits = self.misses = 0
        if not ok:
            log.warning(
                "tokenizer %s: pieces between special tokens do not tokenize alone; no cache", self.source
            )
        return ok

    def stats(self) -> dict[str, Any]:
        return {
            "vocab_size": self.vocab_size,
            "chat_template": self.template is not None,
            "segmented_cache": self.segmented,
            "cache_pieces": len(self._cache),
            "cache_tokens": self._cached_tokens,
            "cache_hits": self.hits,
            "cache_misses": self.misses,
        }


def _check_unicode(text: str) -> None:
    try:
        text.encode()
    except UnicodeEncodeError as exc:  # JSON allows lone surrogates; no tokenizer takes them
        raise TokenizeError(f"the text is not valid Unicode at position {exc.start}") from None


def load_tokenizer(path: str | Path, *, cache_tokens: int = DEFAULT_CACHE_TOKENS) -> ModelTokenizer:
    """Load a Hugging Face tokenizer folder; TokenizerLoadError says what is wrong with it."""
    folder = Path(path)
    tokenizer_file = folder / "tokenizer.json"
    if not tokenizer_file.is_file():
        raise TokenizerLoadError(f"{folder}: no tokenizer.json")
    try:
        tokenizer = Tokenizer.from_file(str(tokenizer_file))
    except Exception as exc:  # the Rust side raises plain Exception for bad JSON or models
        raise TokenizerLoadError(f"{tokenizer_file}: not a tokenizer: {exc}") from None
    config: dict[str, Any] = {}
    config_file = folder / "tokenizer_config.json"
    if config_file.is_file():
        try:
            loaded = json.loads(config_file.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise TokenizerLoadError(f"{config_file}: not JSON: {exc}") from None
        if not isinstance(loaded, dict):
            raise TokenizerLoadError(f"{config_file}: must be a JSON object")
        config = loaded
    template = config.get("chat_template")
    if isinstance(template, list):  # named templates: the default one
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, Mapping)}
        template = named.get("default")
    jinja_file = folder / "chat_template.jinja"
    if template is None and jinja_file.is_file():
        template = jinja_file.read_text()
    if template is not None and not isinstance(template, str):
        raise TokenizerLoadError(f"{config_file}: chat_template must be a string")
    specials: dict[str, str | None] = {
        name: _token_text(config.get(name))
        for name in ("bos_token", "eos_token", "unk_token", "pad_token")
        if name in config
    }
    return ModelTokenizer(tokenizer, template, specials, cache_tokens=cache_tokens, source=str(folder))


@dataclass(frozen=True, slots=True)
class _Entry:
    path: str
    tokenizer: ModelTokenizer | None
    error: str | None = None


class PoolTokenizers:
    """The tokenizers of one pool's models, (re)loaded from config, read per request."""

    def __init__(self, cache_tokens: int = DEFAULT_CACHE_TOKENS) -> None:
        self.cache_tokens = cache_tokens
        self._entries: dict[str, _Entry] = {}
        self.failures = 0  # requests of a model with a tokenizer that yielded no ids

    def configure(self, models: Iterable[tuple[str, str | None]]) -> None:
        """(model, tokenizer folder or None) pairs; unchanged paths keep their loaded tokenizer
        and cache. A folder that fails to load is logged and that model falls back."""
        entries: dict[str, _Entry] = {}
        for model, path in models:
            if path is None:
                continue
            old = self._entries.get(model)
            if old is not None and old.path == path:
                entries[model] = old
                continue
            try:
                entries[model] = _Entry(path, load_tokenizer(path, cache_tokens=self.cache_tokens))
                log.info("model %s: tokenizer loaded from %s", model, path)
            except (TokenizerLoadError, OSError) as exc:
                log.warning("model %s: tokenizer not loaded, approximate prefix scoring: %s", model, exc)
                entries[model] = _Entry(path, None, str(exc))
        self._entries = entries

    def get(self, model: str) -> ModelTokenizer | None:
        entry = self._entries.get(model)
        return entry.tokenizer if entry is not None else None

    async def token_ids(self, model: str, body: Mapping[str, Any]) -> tuple[int, ...] | None:
        """The prompt's token ids for ``model``'s engine, or None (no tokenizer, not a chat or
        completions body, or a body the template or tokenizer cannot take)."""
        tok = self.get(model)
        if tok is None:
            return None
        try:
            if "messages" in body:
                return tuple(await tok.encode_text_async(tok.render_chat(body["messages"])))
            prompt = body.get("prompt")
            if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
                prompt = prompt[0]
            if isinstance(prompt, str):
                if len(prompt) > OFFLOAD_CHARS:  # (encode_prompt cuts at MAX_CHARS)
                    return tuple(await asyncio.to_thread(tok.encode_prompt, prompt))
                return tuple(tok.encode_prompt(prompt))
            if isinstance(prompt, list) and prompt and all(type(t) is int for t in prompt):
                return tuple(prompt)
            return None
        except TokenizeError as exc:
            self.failures += 1
            log.debug("model %s: no token ids: %s", model, exc)
            return None

    def debug(self) -> dict[str, Any]:
        """For /debug/pool: per model, where its tokenizer came from and how its cache does."""
        out: dict[str, Any] = {}
        for model, entry in self._entries.items():
            row: dict[str, Any] = {"path": entry.path, "loaded": entry.tokenizer is not None}
            if entry.error is not None:
                row["error"] = entry.error
            if entry.tokenizer is not None:
                row.update(entry.tokenizer.stats())
            out[model] = row
        return {"models": out, "failures": self.failures}
