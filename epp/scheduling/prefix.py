"""Approximate prefix-cache index: which pod probably still holds a prompt's leading blocks.

The gateway cannot see the model servers' KV caches, so it remembers what it sent where.
A prompt is cut into fixed-size character blocks (64 by default: vLLM's 16-token block at
~4 characters per token) and each block is hashed with xxhash64, seeded by the previous
block's hash (the first seed is the hash of the model name, chained with the LoRA adapter's
name when there is one: vLLM keys cached blocks by adapter, so the same prompt under two
adapters, or under an adapter and its base model, shares no block). A block hash therefore
names the whole prefix up to it, as a KV block does in vLLM. Only full blocks are hashed (a
server caches only full blocks) and at most `max_blocks` of them, which bounds the cost of
huge prompts: a 200 KB prompt costs the same as a 16 KB one.

Each pod has a bounded LRU of block hashes, filled after a request is routed there. A
request's blocks are inserted last-block-first so the leading blocks are the most recently
used and the last to be evicted, as in the server's own cache, which frees tail blocks first.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from itertools import takewhile

import xxhash

DEFAULT_BLOCK_CHARS = 64
DEFAULT_MAX_BLOCKS = 256
DEFAULT_CAPACITY_PER_POD = 31_250
# Measured with tracemalloc on CPython 3.11: an OrderedDict entry costs ~91 bytes (dict slot
# and ordering node) plus 32 for the 64-bit int key: ~3.7 MB for a full 31,250-entry pod.
APPROX_BYTES_PER_ENTRY = 120

_xxh64 = xxhash.xxh64_intdigest


def prompt_hashes(
    model: str,
    prompt: str,
    block_chars: int = DEFAULT_BLOCK_CHARS,
    max_blocks: int = DEFAULT_MAX_BLOCKS,
    adapter: str | None = None,
) -> tuple[int, ...]:
    """Chained block hashes: h0 = xxh64(model), then xxh64(adapter, seed=h0) for a LoRA
    adapter; h_i = xxh64(block_i, seed=h_{i-1})."""
    if block_chars <= 0:
        raise ValueError("block_chars must be positive")
    n = min(len(prompt) // block_chars, max_blocks)
    h = _xxh64(model.encode())
    if adapter:
        h = _xxh64(adapter.encode(), h)
    out = []
    for start in range(0, n * block_chars, block_chars):
        h = _xxh64(prompt[start : start + block_chars].encode(), h)
        out.append(h)
    return tuple(out)


class PrefixIndex:
    """Per-pod LRU sets of block hashes; all methods are synchronous and O(blocks)."""

    def __init__(
        self,
        capacity_per_pod: int = DEFAULT_CAPACITY_PER_POD,
        *,
        block_chars: int = DEFAULT_BLOCK_CHARS,
        max_blocks: int = DEFAULT_MAX_BLOCKS,
    ) -> None:
        if capacity_per_pod <= 0 or block_chars <= 0 or max_blocks <= 0:
            raise ValueError("capacity_per_pod, block_chars and max_blocks must be positive")
        self.capacity_per_pod = capacity_per_pod
        self.block_chars = block_chars
        self.max_blocks = max_blocks
        self._pods: dict[str, OrderedDict[int, None]] = {}

    def hashes(
        self, model: str, prompt: str, block_chars: int | None = None, adapter: str | None = None
    ) -> tuple[int, ...]:
        return prompt_hashes(model, prompt, block_chars or self.block_chars, self.max_blocks, adapter)

    def add(self, address: str, hashes: Sequence[int]) -> None:
        """Remember that `address` now caches these blocks (leading blocks most recent)."""
        lru = self._pods.get(address)
        if lru is None:
            lru = self._pods[address] = OrderedDict()
        move = lru.move_to_end
        for h in reversed(hashes):
            if h in lru:
                move(h)
            else:
                lru[h] = None
        overflow = len(lru) - self.capacity_per_pod
        for _ in range(overflow):
            lru.popitem(last=False)

    def match(self, hashes: Sequence[int], address: str) -> int:
        """Number of leading blocks of `hashes` that `address` probably caches."""
        lru = self._pods.get(address)
        if not lru:
            return 0
        return len(list(takewhile(lru.__contains__, hashes)))  # the scan runs in C

    def match_counts(self, hashes: Sequence[int], addresses: Iterable[str]) -> list[int]:
        """`match` for many pods at once (one call per request, not per pod)."""
        pods = self._pods
        out: list[int] = []
        for address in addresses:
            lru = pods.get(address)
            out.append(len(list(takewhile(lru.__contains__, hashes))) if lru else 0)
        return out

    def match_many(self, hashes: Sequence[int], addresses: Iterable[str]) -> dict[str, int]:
        addresses = list(addresses)
        return dict(zip(addresses, self.match_counts(hashes, addresses), strict=True))

    def retain(self, addresses: Iterable[str]) -> None:
        """Forget pods that left the pool."""
        keep = set(addresses)
        for address in [a for a in self._pods if a not in keep]:
            del self._pods[address]

    def drop(self, address: str) -> None:
        self._pods.pop(address, None)

    def memory_entries(self) -> int:
        return sum(len(lru) for lru in self._pods.values())

    def approx_bytes(self) -> int:
        return self.memory_entries() * APPROX_BYTES_PER_ENTRY

    def entries_by_pod(self) -> Mapping[str, int]:
        return {a: len(lru) for a, lru in self._pods.items()}
