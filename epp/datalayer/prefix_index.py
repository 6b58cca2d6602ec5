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
A pod's LRU holds at most what its KV cache holds (`set_capacity`, from the blocks the pod
reports): with a larger bound the index would remember prompts the server evicted long ago
and, under KV pressure, price a move of a prompt family to that pod as a cache hit.

A reverse map, block hash -> the pods holding it, kept in step with the LRUs, lets
`match_counts` do one lookup per block and shrink the set of still-matching pods with C set
operations, instead of walking every pod's LRU: at 1,000 pods that is what keeps a decision
within milliseconds. A hash held by one pod maps to its address alone (no set), which is
most of them.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from itertools import takewhile

import xxhash

DEFAULT_BLOCK_CHARS = 64
DEFAULT_MAX_BLOCKS = 256
DEFAULT_CAPACITY_PER_POD = 31_250
# Measured with tracemalloc on CPython 3.11: an OrderedDict entry costs ~91 bytes (dict slot
# and ordering node) plus 32 for the 64-bit int key, and its reverse-map entry (hash ->
# address, the key object shared) ~42 more when pods do not share it (measured at 31,250
# entries; a dict's table doubles in steps, so allow some slack): ~5 MB for a full pod.
REVERSE_BYTES_PER_ENTRY = 50
APPROX_BYTES_PER_ENTRY = 120 + REVERSE_BYTES_PER_ENTRY

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


@dataclass(frozen=True, slots=True)
class PromptHashes:
    """A prompt's block hashes computed ahead of the decision (by the process that parsed the
    request: an ext_proc worker of a multi-core EPP, epp/requestcontrol/parse.py), with the key they were
    computed for; used only where the decision would compute exactly these."""

    model: str
    adapter: str | None
    block_chars: int
    max_blocks: int
    hashes: tuple[int, ...]

    def fits(self, model: str, adapter: str | None, block_chars: int, max_blocks: int) -> bool:
        return (
            self.block_chars == block_chars
            and self.max_blocks == max_blocks
            and self.model == model
            and self.adapter == adapter
        )


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
        self._capacity: dict[str, int] = {}  # per pod, when below capacity_per_pod
        self._holders: dict[int, str | set[str]] = {}  # hash -> the pod, or pods, holding it
        # Told of every `add` (this process's routing decisions), e.g. to share them with the
        # pool's other EPP replicas (epp/datalayer/shared_state.py), which `learn` them.
        self.on_add: Callable[[str, Sequence[int]], None] | None = None

    def hashes(
        self,
        model: str,
        prompt: str,
        block_chars: int | None = None,
        adapter: str | None = None,
        known: PromptHashes | None = None,
    ) -> tuple[int, ...]:
        """`prompt_hashes` at this index's block size (or `block_chars`); `known` when it was
        computed for exactly that key (the same prompt: it comes with the request)."""
        chars = block_chars or self.block_chars
        if known is not None and known.fits(model, adapter, chars, self.max_blocks):
            return known.hashes
        return prompt_hashes(model, prompt, chars, self.max_blocks, adapter)

    def add(self, address: str, hashes: Sequence[int]) -> None:
        """This process routed a prompt with these blocks to `address`: `learn` it, and tell
        `on_add`."""
        if self.on_add is not None:
            self.on_add(address, hashes)
        self.learn(address, hashes)

    def learn(self, address: str, hashes: Sequence[int]) -> None:
        """Remember that `address` now caches these blocks (leading blocks most recent).

        `hashes` are a prompt's leading blocks from the first (what `hashes()` returns, or a
        prefix of it): that keeps every pod's holdings prefix-closed, which `match_counts`
        relies on for speed (and detects, falling back to a slower walk, when broken).
        """
        lru = self._pods.get(address)
        if lru is None:
            lru = self._pods[address] = OrderedDict()
        move = lru.move_to_end
        holders = self._holders
        for h in reversed(hashes):
            if h in lru:
                move(h)
                continue
            lru[h] = None
            held = holders.get(h)
            if held is None:
                holders[h] = address
            elif isinstance(held, str):
                if held != address:
                    holders[h] = {held, address}
            else:
                held.add(address)
        self._trim(address, lru)

    def set_capacity(self, address: str, blocks: int) -> None:
        """`address` caches at most `blocks` of this index's blocks (its KV cache's size): its
        LRU is bounded by that, never above `capacity_per_pod`."""
        cap = max(1, min(int(blocks), self.capacity_per_pod))
        if self._capacity.get(address, self.capacity_per_pod) == cap:
            return
        if cap == self.capacity_per_pod:
            self._capacity.pop(address, None)
        else:
            self._capacity[address] = cap
        lru = self._pods.get(address)
        if lru is not None:
            self._trim(address, lru)

    def capacity(self, address: str) -> int:
        return self._capacity.get(address, self.capacity_per_pod)

    def _trim(self, address: str, lru: OrderedDict[int, None]) -> None:
        overflow = len(lru) - self._capacity.get(address, self.capacity_per_pod)
        for _ in range(overflow):
            self._release(lru.popitem(last=False)[0], address)

    def _release(self, h: int, address: str) -> None:
        """`address` no longer holds block `h`: update the reverse map."""
        held = self._holders.get(h)
        if held is None:
            return
        if isinstance(held, str):
            if held == address:
                del self._holders[h]
            return
        held.discard(address)
        if len(held) == 1:
            self._holders[h] = next(iter(held))
        elif not held:
            del self._holders[h]

    def match(self, hashes: Sequence[int], address: str) -> int:
        """Number of leading blocks of `hashes` that `address` probably caches."""
        lru = self._pods.get(address)
        if not lru:
            return 0
        return len(list(takewhile(lru.__contains__, hashes)))  # the scan runs in C

    def match_counts(self, hashes: Sequence[int], addresses: Iterable[str]) -> list[int]:
        """`match` for many pods at once: one reverse-map lookup per block, not per pod.

        A pod's holdings are prefix-closed (`add` gets a prompt's leading blocks, and the LRU
        evicts a prefix's tail before its head), so the pods matching d leading blocks are
        exactly the holders of block d-1: consecutive holder sets are compared (C set
        operations), and the pods leaving between two depths get their count. Holdings that
        are not nested (blocks added with gaps) are detected there and fall back to walking
        each pod's LRU, so the answer is always exact.
        """
        holders = self._holders
        levels: list[set[str] | tuple[str]] = []
        for h in hashes:
            held = holders.get(h)
            if held is None:
                break
            levels.append((held,) if isinstance(held, str) else held)
        counts: dict[str, int] = {}
        last = len(levels) - 1
        for depth, level in enumerate(levels, start=1):
            deeper = levels[depth] if depth <= last else ()
            if len(deeper) == len(level):
                if deeper is level or deeper == level:  # set == set in C; a tuple is one address
                    continue
                return self._walk_counts(hashes, addresses)
            dropped = (level if isinstance(level, set) else set(level)).difference(deeper)
            if len(level) - len(dropped) != len(deeper):  # a deeper holder lacks this block
                return self._walk_counts(hashes, addresses)
            counts.update(dict.fromkeys(dropped, depth))
        get = counts.get
        return [get(address, 0) for address in addresses]

    def _walk_counts(self, hashes: Sequence[int], addresses: Iterable[str]) -> list[int]:
        pods = self._pods
        out: list[int] = []
        for address in addresses:
            lru = pods.get(address)
            out.append(len(list(takewhile(lru.__contains__, hashes))) if lru else 0)
        return out

    def retain(self, addresses: Iterable[str]) -> None:
        """Forget pods that left the pool."""
        keep = set(addresses)
        for address in [a for a in self._pods if a not in keep]:
            for h in self._pods.pop(address):
                self._release(h, address)
        for address in [a for a in self._capacity if a not in keep]:
            del self._capacity[address]

    def memory_entries(self) -> int:
        return sum(len(lru) for lru in self._pods.values())

    def approx_bytes(self) -> int:
        return self.memory_entries() * APPROX_BYTES_PER_ENTRY
