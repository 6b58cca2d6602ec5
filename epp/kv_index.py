"""A precise, event-fed index of which pod holds which KV blocks (vLLM KV events).

The engine's block hashes are its own (seeded, version-dependent), so the index keys blocks
with its own chain hash, computed from the events' token ids exactly as `block_keys`
computes it from a request's token ids: ``k_i = xxh64(tokens of block i, seed=k_{i-1})``
with ``k_{-1} = xxh64(model \\0 adapter)``, which keys every block per model and LoRA
adapter. Per pod it maps engine hash -> own key, because a ``BlockRemoved`` carries only
engine hashes. A ``BlockStored`` whose parent the index never saw (stored before the
subscription, or lost in a gap) cannot be keyed: it is counted as unanchored and skipped.

Memory is bounded by ``max_blocks`` (pod, block) entries: past it the least recently stored
entry of any pod is forgotten (the pod may still hold it; the index then under-reports,
never invents). Synchronous and single-threaded, like the rest of the EPP's state.

Besides what the pods report, the index holds what this EPP has *sent* and the pod has not
finished: ``reserve`` at routing, ``release`` at the request's end. A pod stores a prompt's
blocks only once its prefill has run, so without this a group's requests arriving while its
first is still queued or prefilling (a spike, or a group just evicted everywhere) all look
cold on every pod and scatter; with it they follow the first. ``lookup`` counts a block held
or reserved on a pod. Reservations are bounded by the requests in flight.
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


def _decrement(counts: dict[int, dict[str, int]], key: int, pod: str) -> None:
    """One count less of ``pod`` under ``key``; empty entries are dropped."""
    pods = counts.get(key)
    if pods is None:
        return
    n = pods.get(pod, 0) - 1
    if n > 0:
        pods[pod] = n
    else:
        pods.pop(pod, None)
        if not pods:
            del counts[key]


@dataclass(slots=True)
class PodBlocks:
    """One pod's side of the index."""

    model: str
    block_size: int | None = None
    precise: bool = False  # False until the pod's stream is known to be complete
    engine_keys: set[Hashable] = field(default_factory=set)  # engine hashes with an entry
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
        self._reserved: dict[int, dict[str, int]] = {}  # own key -> pod -> requests in flight with it
        # (id of the owner, pod) -> (the owner, the keys it reserved there)
        self._reservations: dict[tuple[int, str], tuple[object, tuple[int, ...]]] = {}
        self.evicted = 0

    def set_max_blocks(self, max_blocks: int) -> None:
        if max_blocks < 1:
            raise ValueError("max_blocks must be >= 1")
        self.max_blocks = max_blocks
        if len(self._entries) > max_blocks:
            self._evict(len(self._entries) - max_blocks)

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
        for engine_hash in state.engine_keys:
            key = self._entries.pop((pod, engine_hash), None)
            if key is not None:
                self._unhold(key, pod)
        state.engine_keys = set()

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
    ) -> int:
        """Index the blocks of one ``BlockStored``; returns how many were keyed."""
        state = self._pods.get(pod)
        if state is None or block_size < 1 or len(token_ids) < block_size * len(engine_hashes):
            return 0
        state.block_size = block_size
        entries = self._entries
        if parent is None:
            parent_key = None
        else:
            parent_key = entries.get((pod, parent))
            if parent_key is None:
                state.unanchored += len(engine_hashes)
                return 0
        keys = block_keys(
            token_ids[: block_size * len(engine_hashes)], block_size, state.model, adapter, parent_key
        )
        holders = self._holders
        for engine_hash, key in zip(engine_hashes, keys, strict=True):
            slot = (pod, engine_hash)
            old = entries.get(slot)
            if old is not None:
                entries.move_to_end(slot)
                if old == key:
                    continue
                self._unhold(old, pod)
            entries[slot] = key
            state.engine_keys.add(engine_hash)
            pods = holders.get(key)
            if pods is None:
                holders[key] = {pod: 1}
            else:
                pods[pod] = pods.get(pod, 0) + 1
        if len(entries) > self.max_blocks:
            self._evict(len(entries) - self.max_blocks)
        return len(keys)

    def apply_removed(self, pod: str, engine_hashes: Iterable[Hashable]) -> None:
        state = self._pods.get(pod)
        if state is None:
            return
        for engine_hash in engine_hashes:
            key = self._entries.pop((pod, engine_hash), None)
            if key is not None:
                state.engine_keys.discard(engine_hash)
                self._unhold(key, pod)

    def _unhold(self, key: int, pod: str) -> None:
        _decrement(self._holders, key, pod)

    def _evict(self, n: int) -> None:
        for _ in range(n):
            (pod, engine_hash), key = self._entries.popitem(last=False)
            state = self._pods.get(pod)
            if state is not None:
                state.engine_keys.discard(engine_hash)
            self._unhold(key, pod)
        self.evicted += n

    # ---- this EPP's requests in flight --------------------------------------------------
    def reserve(
        self, owner: object, pod: str, token_ids: Sequence[int], model: str, adapter: str | None = None
    ) -> int:
        """``owner`` (a request) was sent to ``pod`` with these tokens: its blocks count as held
        there until ``release(owner, pod)``; returns how many (0 when the pod has no precise
        state). ``owner`` is held meanwhile, so its identity stays its own."""
        size = self.precise_block_size(pod, model)
        slot = (id(owner), pod)
        if size is None or slot in self._reservations:
            return 0
        keys = tuple(block_keys(token_ids, size, model, adapter))
        if not keys:
            return 0
        self._reservations[slot] = (owner, keys)
        reserved = self._reserved
        for key in keys:
            pods = reserved.get(key)
            if pods is None:
                reserved[key] = {pod: 1}
            else:
                pods[pod] = pods.get(pod, 0) + 1
        return len(keys)

    def release(self, owner: object, pod: str) -> None:
        """``owner``'s request on ``pod`` ended: its reservation there, if any, is gone."""
        held = self._reservations.pop((id(owner), pod), None)
        if held is None:
            return
        for key in held[1]:
            _decrement(self._reserved, key, pod)

    def reservations(self) -> int:
        """Requests in flight holding a reservation (0 once every one ended)."""
        return len(self._reservations)

    def reserved_blocks(self) -> int:
        """Distinct blocks reserved by requests in flight (0 once every request ended)."""
        return len(self._reserved)

    # ---- scheduling --------------------------------------------------------------------
    def lookup(self, token_ids: Sequence[int], model: str, adapter: str | None = None) -> dict[str, int]:
        """Per pod of ``model`` with a known block size: leading blocks of ``token_ids`` it holds
        or has reserved (`reserve`)."""
        by_size: dict[int, list[str]] = {}
        for pod, state in self._pods.items():
            if state.model == model and state.block_size:
                by_size.setdefault(state.block_size, []).append(pod)
        out: dict[str, int] = {}
        all_holders, all_reserved = self._holders, self._reserved
        for size, pods in by_size.items():
            live = set(pods)
            depth = 0
            for key in block_keys(token_ids, size, model, adapter):
                holders = all_holders.get(key)
                reserved = all_reserved.get(key)
                if reserved:
                    still = {p for p in live if p in reserved or (holders is not None and p in holders)}
                elif holders:
                    still = {p for p in live if p in holders}
                else:
                    break
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

    def distinct_blocks(self) -> int:
        return len(self._holders)

    def entries_by_pod(self) -> dict[str, int]:
        return {pod: len(state.engine_keys) for pod, state in self._pods.items()}

    def pods(self) -> dict[str, PodBlocks]:
        return dict(self._pods)
