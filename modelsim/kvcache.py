"""KV cache of fixed-size blocks with automatic prefix caching, after vLLM V1's block pool.

A full block's hash chains its parent's hash with the block's token ids (and the adapter), so
equal hashes mean equal prefixes. Blocks whose last user finished keep their hash and sit in a
free queue in LRU order; allocation takes from the front of that queue and evicts the hash.
Partially filled blocks are never cached.

When ``events`` is a list (KV events on), evictions append a vLLM ``BlockRemoved`` each and
a prefix-cache reset an ``AllBlocksCleared``; the engine adds ``BlockStored`` (it knows the
tokens) and publishes the list once per step.
"""

from __future__ import annotations

from array import array
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import xxhash

from modelsim.kv_events import all_blocks_cleared, block_removed


def block_hash(parent: int, tokens: Sequence[int], extra: str = "") -> int:
    """Chained hash of one full block: xxh64(parent || tokens || extra)."""
    h = xxhash.xxh64(parent.to_bytes(8, "little"))
    h.update(array("q", tokens).tobytes())
    if extra:
        h.update(extra.encode())
    return h.intdigest()


def chain_hashes(tokens: Sequence[int], block_size: int, extra: str = "", start: int = 0) -> list[int]:
    """Hashes of every full block of ``tokens`` (seeded with ``start`` as the root parent)."""
    out: list[int] = []
    parent = start
    for i in range(0, len(tokens) - block_size + 1, block_size):
        parent = block_hash(parent, tokens[i : i + block_size], extra)
        out.append(parent)
    return out


class KVCache:
    """Block pool: reference counts, a hash -> block map and an LRU free queue."""

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self._ref = [0] * num_blocks
        self._hash: list[int | None] = [None] * num_blocks
        self._free: OrderedDict[int, None] = OrderedDict((b, None) for b in range(num_blocks))
        self._cached: dict[int, int] = {}
        self.events: list[dict[str, Any]] | None = None

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_cached(self) -> int:
        return len(self._cached)

    def usage(self) -> float:
        """Fraction of blocks in use by requests (cached-but-free blocks count as free, as in vLLM)."""
        return 1.0 - len(self._free) / self.num_blocks

    def lookup(self, hashes: Sequence[int]) -> list[int]:
        """Blocks holding the longest cached prefix of ``hashes`` (no side effects)."""
        if not self.enable_prefix_caching:
            return []
        found: list[int] = []
        for h in hashes:
            b = self._cached.get(h)
            if b is None:
                break
            found.append(b)
        return found

    def touch(self, blocks: Sequence[int]) -> None:
        """Take a reference on cached blocks a new request reuses."""
        for b in blocks:
            if self._ref[b] == 0:
                del self._free[b]
            self._ref[b] += 1

    def allocate(self, n: int) -> list[int] | None:
        """``n`` fresh blocks, evicting least recently freed cached blocks; None if too few."""
        if n > len(self._free):
            return None
        out = []
        for _ in range(n):
            b, _ = self._free.popitem(last=False)
            h = self._hash[b]
            if h is not None:
                if self._cached.get(h) == b:
                    del self._cached[h]
                    if self.events is not None:
                        self.events.append(block_removed([h]))
                self._hash[b] = None
            self._ref[b] = 1
            out.append(b)
        return out

    def release(self, blocks: Sequence[int]) -> None:
        """Drop a request's references; tail blocks go to the queue first so they evict first."""
        for b in reversed(blocks):
            self._ref[b] -= 1
            if self._ref[b] == 0:
                self._free[b] = None
                if self._hash[b] is None:
                    self._free.move_to_end(b, last=False)

    def register(self, block: int, h: int) -> bool:
        """Mark a now-full, computed block as holding the prefix with hash ``h``; True when
        the hash is newly cached (a duplicate of a cached block is not)."""
        if not self.enable_prefix_caching or self._hash[block] is not None:
            return False
        if h in self._cached:
            return False
        self._cached[h] = block
        self._hash[block] = h
        return True

    def reset_prefix_cache(self) -> bool:
        """Forget every cached hash, as vLLM's ``reset_prefix_cache``: refused (False) while
        any block is in use."""
        if len(self._free) != self.num_blocks:
            return False
        self._cached.clear()
        self._hash = [None] * self.num_blocks
        if self.events is not None:
            self.events.append(all_blocks_cleared())
        return True
