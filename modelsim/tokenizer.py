"""Prompt tokenisation: approximate by default, or a model's own tokenizer files.

Without a configured tokenizer (``ApproxTokenizer``):

Text is split by a regex into words, single punctuation marks and runs of whitespace-free
symbols; words longer than 4 characters are cut into 4-character pieces. Each piece maps to a
stable id ``xxh32(piece) % vocab_size``. Same text gives the same ids, and texts sharing a prefix
share a token prefix (up to the word where they diverge). About 1.2-1.4 tokens per English word,
close to BPE tokenisers. Chat messages are first rendered with a fixed template.

With ``tokenizer:`` (fleet spec) or ``--tokenizer`` (``HFTokenizer``): a folder in the Hugging
Face layout (``tokenizer.json``, ``tokenizer_config.json`` with ``chat_template``), or the name
of one shipped in modelsim/tokenizer_files/ (``sim-llama3-12k``, built by
``python -m modelsim.build_tokenizer``). Chat messages are rendered as vLLM renders them
(transformers' sandboxed Jinja environment, ``add_generation_prompt=True``, text parts joined
by newlines) and the whole text is tokenized in one call without adding special tokens;
completions prompts are tokenized with them (BOS). No cache: this is the engine's side, the
reference the EPP's cached tokenisation (epp/datalayer/tokenizer.py) must equal.
"""

from __future__ import annotations

import json
import re
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

import xxhash

_PIECE = re.compile(r"\w+|[^\w\s]")
_MAX_PIECE = 4

FILLER_WORDS = (
    "the", "model", "answers", "with", "simulated", "tokens", "and", "a", "steady", "pace",
    "of", "text", "for", "routing", "tests", "only",
)  # fmt: skip


class PromptError(ValueError):
    """The request's prompt or messages are malformed."""


def split_pieces(text: str) -> list[str]:
    pieces: list[str] = []
    for match in _PIECE.finditer(text):
        word = match.group()
        if len(word) <= _MAX_PIECE:
            pieces.append(word)
        else:
            pieces.extend(word[i : i + _MAX_PIECE] for i in range(0, len(word), _MAX_PIECE))
    return pieces


def piece_id(piece: str, vocab_size: int) -> int:
    return xxhash.xxh32_intdigest(piece.encode()) % vocab_size


def encode(text: str, vocab_size: int) -> list[int]:
    try:
        text.encode()
    except UnicodeEncodeError as exc:  # JSON allows "\ud800"; no tokenizer can take it
        raise PromptError(f"the prompt is not valid Unicode: {exc.reason} at position {exc.start}") from None
    return [piece_id(p, vocab_size) for p in split_pieces(text)]


def _content_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if not isinstance(part, dict):
                raise PromptError("message content parts must be objects")
            if part.get("type") == "text":
                if not isinstance(part.get("text"), str):
                    raise PromptError("text content part needs a string 'text'")
                parts.append(part["text"])
        return "\n".join(parts)
    raise PromptError("message content must be a string or a list of parts")


def render_chat(messages: Any) -> str:
    """Render chat messages with a fixed template: ``<|role|>\\ncontent\\n`` ... ``<|assistant|>``."""
    if not isinstance(messages, list) or not messages:
        raise PromptError("'messages' must be a non-empty list")
    out = []
    for msg in messages:
        if not isinstance(msg, dict) or not isinstance(msg.get("role"), str):
            raise PromptError("each message must be an object with a string 'role'")
        out.append(f"<|{msg['role']}|>\n{_content_text(msg.get('content'))}\n")
    out.append("<|assistant|>\n")
    return "".join(out)


def filler_piece(index: int) -> str:
    return FILLER_WORDS[index % len(FILLER_WORDS)]


SHIPPED_TOKENIZERS = Path(__file__).resolve().parent / "tokenizer_files"


class TokenizerFileError(ValueError):
    """A configured tokenizer folder is missing or unusable."""


class PromptTokenizer(Protocol):
    vocab_size: int

    def encode_chat(self, messages: Any) -> list[int]: ...

    def encode_text(self, text: str) -> list[int]: ...


class ApproxTokenizer:
    """The default: `render_chat` + `encode` over ``vocab_size`` ids."""

    def __init__(self, vocab_size: int) -> None:
        self.vocab_size = vocab_size

    def encode_chat(self, messages: Any) -> list[int]:
        return encode(render_chat(messages), self.vocab_size)

    def encode_text(self, text: str) -> list[int]:
        return encode(text, self.vocab_size)


def _token_text(value: Any) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]
    return None


def _template_error(message: str) -> None:
    raise PromptError(f"chat template: {message}")


class HFTokenizer:
    """A model's tokenizer.json and chat template, used the way vLLM uses them."""

    def __init__(self, folder: str | Path) -> None:
        from jinja2 import TemplateError
        from jinja2.sandbox import ImmutableSandboxedEnvironment
        from tokenizers import Tokenizer

        path = Path(folder)
        if not path.is_absolute() and not path.exists() and (SHIPPED_TOKENIZERS / path).is_dir():
            path = SHIPPED_TOKENIZERS / path
        self.path = path
        try:
            self.tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))
            config = json.loads((path / "tokenizer_config.json").read_text())
        except Exception as exc:  # missing files, bad JSON, not a tokenizer
            raise TokenizerFileError(f"tokenizer {folder}: {exc}") from None
        template = config.get("chat_template") if isinstance(config, dict) else None
        if not isinstance(template, str):
            raise TokenizerFileError(f"tokenizer {folder}: tokenizer_config.json has no chat_template string")
        env = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
        )
        env.globals["raise_exception"] = _template_error
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        # transformers' tojson (Jinja's own HTML-escapes <, >, &, ')
        env.filters["tojson"] = lambda v, ensure_ascii=False, indent=None, separators=None, sort_keys=False: (
            json.dumps(
                v, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
            )
        )
        try:
            self.template = env.from_string(template)
        except TemplateError as exc:
            raise TokenizerFileError(f"tokenizer {folder}: chat template: {exc}") from None
        self.specials = {
            k: v
            for k in ("bos_token", "eos_token", "unk_token", "pad_token")
            if (v := _token_text(config.get(k))) is not None
        }
        self.vocab_size = self.tokenizer.get_vocab_size()

    def render(self, messages: Any) -> str:
        if not isinstance(messages, list) or not messages:
            raise PromptError("'messages' must be a non-empty list")
        msgs = []
        for msg in messages:
            if not isinstance(msg, dict) or not isinstance(msg.get("role"), str):
                raise PromptError("each message must be an object with a string 'role'")
            msgs.append({**msg, "content": _content_text(msg.get("content"))})
        try:
            return self.template.render(messages=msgs, add_generation_prompt=True, **self.specials)
        except PromptError:
            raise
        except Exception as exc:
            raise PromptError(f"chat template failed: {exc}") from None

    def _encode(self, text: str, add_special_tokens: bool) -> list[int]:
        try:
            text.encode()
        except UnicodeEncodeError as exc:
            raise PromptError(
                f"the prompt is not valid Unicode: {exc.reason} at position {exc.start}"
            ) from None
        return list(self.tokenizer.encode(text, add_special_tokens=add_special_tokens).ids)

    def encode_chat(self, messages: Any) -> list[int]:
        return self._encode(self.render(messages), add_special_tokens=False)

    def encode_text(self, text: str) -> list[int]:
        return self._encode(text, add_special_tokens=True)
