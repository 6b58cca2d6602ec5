"""Deterministic approximate tokenisation (no real vocabulary is available offline).

Text is split by a regex into words, single punctuation marks and runs of whitespace-free
symbols; words longer than 4 characters are cut into 4-character pieces. Each piece maps to a
stable id ``xxh32(piece) % vocab_size``. Same text gives the same ids, and texts sharing a prefix
share a token prefix (up to the word where they diverge). About 1.2-1.4 tokens per English word,
close to BPE tokenisers. Chat messages are first rendered with a fixed template.
"""

from __future__ import annotations

import re
from typing import Any

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
