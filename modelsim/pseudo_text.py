"""Deterministic pseudo-English for the benchmarks' prompts and the shipped tokenizer's corpus.

bench/harness/workloads.py sizes its prompts with `TextSource` (~4 characters per token, the estimate
the gateway itself uses); modelsim/build_tokenizer.py trains the shipped BPE partly on the same
kind of text, so a fleet tokenizing with it sees about the prompt tokens the scenarios target.
It lives here, not in bench/, because the simulator's build script may not import the bench.
"""

from __future__ import annotations

import random

CHARS_PER_TOKEN = 4
_CONSONANTS = "bcdfghjklmnprstvwz"
_VOWELS = "aeiou"


class TextSource:
    """A seeded vocabulary of ~2,000 consonant-vowel words of 1-3 syllables; ~4 chars per token."""

    def __init__(self, seed: int = 0, vocabulary: int = 2000) -> None:
        rng = random.Random(f"vocab-{seed}")
        words: set[str] = set()
        while len(words) < vocabulary:
            syllables = rng.choice((1, 1, 2, 2, 2, 3))
            words.add("".join(rng.choice(_CONSONANTS) + rng.choice(_VOWELS) for _ in range(syllables)))
        self.words = sorted(words)

    def text(self, tokens: int, rng: random.Random) -> str:
        """About `tokens` tokens of text: exactly tokens*4 characters, cut at a word boundary."""
        target = max(1, tokens) * CHARS_PER_TOKEN
        parts: list[str] = []
        size = 0
        while size < target:
            word = rng.choice(self.words)
            parts.append(word)
            size += len(word) + 1
        return " ".join(parts)[:target].rstrip() or "a"
