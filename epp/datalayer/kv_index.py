"""A precise, event-fed index of which pod holds which KV blocks (vLLM KV events).

The engine's block hashes are its own (seeded, version-dependent), so the index keys blocks
with its own chain hash, computed from the events' token ids exactly as `block_keys`
computes it from a request's token ids: ``k_i = xxh64(tokens of block i, seed=k_{i-1})``
with ``k_{-1} = xxh64(model \\0 adapter)``, which keys every block per model and LoRA
adapter. Per pod it maps engine hash -> own key, because a ``BlockRemoved`` carries only
engine hashes. A ``BlockStored`` whose parent the index never saw (stored before the
subscription, or lost in a gap) cannot be keyed: it is counted as unanchored and skipped.

Two tiers: the blocks in the pod's GPU memory, and those an engine that offloads KV (vLLM's CPU
offload, SGLang's HiCache) reports in host memory (the events' ``medium``). A host block is a
copy the engine loads back instead of recomputing it, so `lookup` answers the GPU tier (what a
request finds cached) and `lookup_held` both (what it finds cached or on the host); the
prediction prices the difference (epp/scheduling/ttft_prediction.py).

Memory is bounded by ``max_blocks`` (pod, block) entries per tier: past it the least recently
stored entry of any pod is forgotten (the pod may still hold it; the index then under-reports,
never invents). Synchronous and single-threaded, like the rest of the EPP's state.
"""

from __future__ import annotations

from array import array
from collections import OrderedDict
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, field

import xxhash

_xxh64 = xxhash.xxh64_intdigest

DEFAULT_MAX_BLOCKS = 1_000_000


def root_key(model: str, adapter: str | None) -> int:
    return _xxh64(f"{model}\0{adapter or ''}".encode())


def block_keys(
    token_ids: Sequence[int], block_size: int, model: str, adapter: str | None, parent: int | None = None
) -> list[int]:
    """Own keys of every full block of ``token_ids`` (chained from ``parent`` or the root)."""
    key = root_key(model, adapter) if parent is None else parent
    out: list[int] = []
    buf = array("Q", token_ids).tobytes()
    step = 8 * block_size
    for end in range(step, len(buf) + 1, step):
        key = _xxh64(buf[end - step : end], key)
        out.append(key)
    return out


@dataclass(slots=True)
class PodBlocks:
    """One pod's side of the index."""

    model: str
    block_size: int | None = None
    precise: bool = False  # False until the pod's stream is known to be complete
    engine_keys: set[Hashable] = field(default_factory=set)  # engine hashes with an entry
    host_keys: set[Hashable] = field(default_factory=set)  # the same, in host memory
    unanchored: int = 0  # stored blocks skipped because their parent was unknown


class KVIndex:
    """Own block key -> pods holding it, fed by `apply_*`, read by `lookup`."""

    def __init__(self, max_blocks: int = DEFAULT_MAX_BLOCKS) -> None:
        if max_blocks < 1:
            raise ValueError("max_blocks must be >= 1")
        self.max_blocks = max_blocks
        self._pods: dict[str, PodBlocks] = {}
        # (pod, engine hash) -> own key, oldest first: the global LRU behind the bound.
        self._entries: OrderedDict[tuple[str, Hashable], int] = OrderedDict()
        self._holders: dict[int, dict[str, int]] = {}  # own key -> pod -> entry count
        # The host-memory tier, kept the same way apart.
        self._host_entries: OrderedDict[tuple[str, Hashable], int] = OrderedDict()
        self._host_holders: dict[int, dict[str, int]] = {}
        self.evicted = 0

    def set_max_blocks(self, max_blocks: int) -> None:
        if max_blocks < 1:
            raise ValueError("max_blocks must be >= 1")
        self.max_blocks = max_blocks
        for host in (False, True):
            over = len(self._tier(host)[0]) - max_blocks
            if over > 0:
                self._evict(over, host)

    # ---- pods --------------------------------------------------------------------------
    def add_pod(self, pod: str, model: str) -> PodBlocks:
        state = self._pods.get(pod)
        if state is None:
            state = self._pods[pod] = PodBlocks(model)
        state.model = model
        return state

    def pod(self, pod: str) -> PodBlocks | None:
        return self._pods.get(pod)

    def clear_pod(self, pod: str) -> None:
        """Forget every block of ``pod`` (AllBlocksCleared, restart or resync); keep the pod."""
        state = self._pods.get(pod)
        if state is None:
            return
        for host, keys in ((False, state.engine_keys), (True, state.host_keys)):
            entries, holders = self._tier(host)
            for engine_hash in keys:
                key = entries.pop((pod, engine_hash), None)
                if key is not None:
                    self._unhold(holders, key, pod)
        state.engine_keys, state.host_keys = set(), set()

    def remove_pod(self, pod: str) -> None:
        self.clear_pod(pod)
        self._pods.pop(pod, None)

    def retain(self, pods: Iterable[str]) -> None:
        keep = set(pods)
        for pod in [p for p in self._pods if p not in keep]:
            self.remove_pod(pod)

    def not_precise_reason(self, pod: str, model: str) -> str | None:
        """Why ``pod``'s blocks of ``model`` cannot be looked up exactly (None: they can)."""
        state = self._pods.get(pod)
        if state is None:
            return "no KV events from the pod"
        if state.model != model:
            return f"the pod's KV events are indexed for model {state.model!r}"
        if not state.precise:
            return "KV event stream not complete yet (connecting or resyncing)"
        if not state.block_size:
            return "no block stored yet (block size unknown)"
        return None

    def precise_block_size(self, pod: str, model: str) -> int | None:
        """The pod's KV block size when its blocks of ``model`` can be looked up exactly."""
        state = self._pods.get(pod)
        if state is None or not state.precise or state.model != model:
            return None
        return state.block_size or None

    def set_precise(self, pod: str, precise: bool) -> None:
        state = self._pods.get(pod)
        if state is not None:
            state.precise = precise

    # ---- events ------------------------------------------------------------------------
    def apply_stored(
        self,
        pod: str,
        engine_hashes: Sequence[Hashable],
        parent: Hashable | None,
        token_ids: Sequence[int],
        block_size: int,
        adapter: str | None,
        host: bool = False,
    ) -> int:
        """Index the blocks of one ``BlockStored`` (`host`: of the host-memory tier); returns
        how many were keyed. A block's parent may sit in either tier."""
        state = self._pods.get(pod)
        if state is None or block_size < 1 or len(token_ids) < block_size * len(engine_hashes):
            return 0
        state.block_size = block_size
        entries, holders = self._tier(host)
        pod_keys = state.host_keys if host else state.engine_keys
        if parent is None:
            parent_key = None
        else:
            parent_key = entries.get((pod, parent))
            if parent_key is None:
                parent_key = self._tier(not host)[0].get((pod, parent))
            if parent_key is None:
                state.unanchored += len(engine_hashes)
                return 0
        keys = block_keys(
            token_ids[: block_size * len(engine_hashes)], block_size, state.model, adapter, parent_key
        )
        for engine_hash, key in zip(engine_hashes, keys, strict=True):
            slot = (pod, engine_hash)
            old = entries.get(slot)
            if old is not None:
                entries.move_to_end(slot)
                if old == key:
                    continue
                self._unhold(holders, old, pod)
            entries[slot] = key
            pod_keys.add(engine_hash)
            pods = holders.get(key)
            if pods is None:
                holders[key] = {pod: 1}
            else:
                pods[pod] = pods.get(pod, 0) + 1
        if len(entries) > self.max_blocks:
            self._evict(len(entries) - self.max_blocks, host)
        return len(keys)

    def apply_removed(self, pod: str, engine_hashes: Iterable[Hashable], host: bool = False) -> None:
        state = self._pods.get(pod)
        if state is None:
            return
        entries, holders = self._tier(host)
        pod_keys = state.host_keys if host else state.engine_keys
        for engine_hash in engine_hashes:
            key = entries.pop((pod, engine_hash), None)
            if key is not None:
                pod_keys.discard(engine_hash)
                self._unhold(holders, key, pod)

    def _tier(self, host: bool) -> tuple[OrderedDict[tuple[str, Hashable], int], dict[int, dict[str, int]]]:
        return (self._host_entries, self._host_holders) if host else (self._entries, self._holders)

    @staticmethod
    def _unhold(holders: dict[int, dict[str, int]], key: int, pod: str) -> None:
        pods = holders.get(key)
        if pods is None:
            return
        n = pods.get(pod, 0) - 1
        if n > 0:
            pods[pod] = n
        else:
            pods.pop(pod, None)
            if not pods:
                del holders[key]

    def _evict(self, n: int, host: bool = False) -> None:
        entries, holders = self._tier(host)
        for _ in range(n):
            (pod, engine_hash), key = entries.popitem(last=False)
            state = self._pods.get(pod)
            if state is not None:
                (state.host_keys if host else state.engine_keys).discard(engine_hash)
            self._unhold(holders, key, pod)
        self.evicted += n

    # ---- scheduling --------------------------------------------------------------------
    def lookup(self, token_ids: Sequence[int], model: str, adapter: str | None = None) -> dict[str, int]:
        """Per pod of ``model`` with a known block size: leading blocks of ``token_ids`` it holds."""
        return self._walk(token_ids, model, adapter, (self._holders,))

    def has_host_blocks(self) -> bool:
        """Whether any pod reported blocks in host memory (else `lookup_held` is `lookup`)."""
        return bool(self._host_holders)

    def lookup_held(self, token_ids: Sequence[int], model: str, adapter: str | None = None) -> dict[str, int]:
        """`lookup` counting a block held in either tier: the leading blocks a pod has cached
        or can load back from host memory."""
        return self._walk(token_ids, model, adapter, (self._holders, self._host_holders))

    def _walk(
        self,
        token_ids: Sequence[int],
        model: str,
        adapter: str | None,
        tiers: tuple[dict[int, dict[str, int]], ...],
    ) -> dict[str, int]:
        by_size: dict[int, list[str]] = {}
        for pod, state in self._pods.items():
            if state.model == model and state.block_size:
                by_size.setdefault(state.block_size, []).append(pod)
        out: dict[str, int] = {}
        for size, pods in by_size.items():
            live = set(pods)
            depth = 0
            for key in block_keys(token_ids, size, model, adapter):
                if len(tiers) == 1:  # the GPU tier alone: the request path's lookup
                    holders = tiers[0].get(key)
                    if not holders:
                        break
                    still = {p for p in live if p in holders}
                else:
                    found = [h for tier in tiers if (h := tier.get(key))]
                    if not found:
                        break
                    still = {p for p in live if any(p in h for h in found)}
                for gone in live - still:
                    out[gone] = depth
                live = still
                if not live:
                    break
                depth += 1
            for pod in live:
                out[pod] = depth
        return out

    # ---- observability -----------------------------------------------------------------
    def size(self) -> int:
        return len(self._entries)

    def host_size(self) -> int:
        return len(self._host_entries)

    def distinct_blocks(self) -> int:
        return len(self._holders)

    def entries_by_pod(self) -> dict[str, int]:
        return {pod: len(state.engine_keys) for pod, state in self._pods.items()}

    def pods(self) -> dict[str, PodBlocks]:
        return dict(self._pods)
