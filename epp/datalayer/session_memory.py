"""Each pod's KV memory of the conversations this EPP routed there: how much of a long prompt a
pod still holds, and what placing a prompt there would evict (issue #51).

The approximate prefix index hashes at most a prompt's first `max_blocks` blocks (16 KB): past
it, an agent session's history (up to ~100k tokens) is invisible, so a pod that holds 49k of a
50k-token prompt and one that holds only its system prompt look alike, and a shared system
prompt longer than 16 KB makes every session look like every other. This model sees the whole
prompt at a coarse grain: a checkpoint hash every `stride` bytes (one streamed xxh64 pass, its
digest at each checkpoint, chained as the engine chains KV blocks: equal checkpoint, equal
prefix). A pod holds a prompt's checkpoints as entries, one per conversation it serves, in LRU
order as the engine frees blocks; a new prompt's deepest checkpoint a pod holds is how much
of it that pod caches, at any length, with an error below one stride (~1k tokens).

Tokens: an entry counts what it added to the pod's cache (its prompt past what other entries
already held, plus its output); the pod's capacity (reported KV blocks x block size) evicts
least recently used entries, as the engine does. The next turn of a conversation supersedes
its entry: the entry whose deepest checkpoint its prompt extends, or, for a request with a
session key (the sessionAffinity header or the one a coding agent sends,
epp/requestcontrol/agent_session.py), the entry of that key, so that a conversation the agent
compacted or rewrote still holds one entry per pod. A keyed entry counts its prompt past what
the pod's other entries hold. Peers learn routings without the key (by checkpoint).

`eviction_tokens` prices a placement: a prompt that needs `need` new tokens on a pod with
`free` evicts max(0, need - free) from the LRU end, and those of conversations still live
(seen within the horizon: `HORIZON_GAPS` x the observed mean gap between a conversation's
turns) will be prefilled again by their next turn.

A prefix many conversations share (a system prompt, tool definitions) is prefilled once per pod
and then serves every conversation sent there: seeding one more pod with it is an investment,
not a per-request cost. `shared_prefix` says how popular the prompt's shared part is, so that
the prediction charges a pod that lacks it only its share (the scheduling side says how):
without it, affinity herds every new conversation onto the pods that held the prompt first
and leaves the others idle.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import xxhash

DEFAULT_STRIDE = 4096  # bytes between checkpoints: ~1k tokens
MAX_CHECKPOINTS = 512  # 2 MB of prompt
MAX_ENTRIES_PER_POD = 4096  # bound while a pod reports no KV capacity
# Live: seen within HORIZON_GAPS x the mean gap between a conversation's turns, within
# [MIN_HORIZON_S, MAX_HORIZON_S]; DEFAULT_HORIZON_S until a gap is observed.
HORIZON_GAPS = 4.0
MIN_HORIZON_S, MAX_HORIZON_S, DEFAULT_HORIZON_S = 1.0, 600.0, 60.0
_GAP_ALPHA = 0.1
_SESSION_SEED = 0x5E55  # keyed entries' ids: their own hash space, apart from checkpoint hashes


def session_entry(session: str) -> int:
    """The entry id of a conversation with this session key."""
    return xxhash.xxh64_intdigest(session.encode(), seed=_SESSION_SEED)


def checkpoints(
    model: str, adapter: str | None, prompt: str, stride: int = DEFAULT_STRIDE, limit: int = MAX_CHECKPOINTS
) -> tuple[tuple[int, ...], float]:
    """The prompt's checkpoint hashes (seeded by model and adapter) and the tokens one stride
    holds at `CHARS_PER_TOKEN`-style density (bytes / 4)."""
    data = prompt.encode()
    h = xxhash.xxh64(f"{model}\0{adapter or ''}".encode())
    out: list[int] = []
    view = memoryview(data)
    for start in range(0, min(len(data) // stride, limit) * stride, stride):
        h.update(view[start : start + stride])
        out.append(h.intdigest())
    return tuple(out), stride / 4.0


@dataclass(slots=True)
class _Entry:
    hashes: tuple[int, ...]
    tokens: float  # what it holds beyond `base`: its prompt past `base` and its output
    base: float  # the tokens of its prompt other entries held when it arrived
    seen: float


class SessionMemory:
    """Per pod, the conversations routed there (entries keyed by their deepest checkpoint, or
    by their session key), their tokens and capacity; a reverse map checkpoint -> pods for
    one-pass lookups."""

    def __init__(self, stride: int = DEFAULT_STRIDE, clock: Callable[[], float] = time.monotonic) -> None:
        self.stride = stride
        self.clock = clock
        self._pods: dict[str, OrderedDict[int, _Entry]] = {}
        self._used: dict[str, float] = {}
        self._capacity: dict[str, float] = {}
        self._holders: dict[int, dict[str, int]] = {}
        self._gap: float | None = None
        # A routing of this replica (address, checkpoints, tokens per checkpoint, prompt tokens,
        # output): epp/datalayer/shared_state.py publishes it; the peers `learn` it.
        self.on_routed: Callable[[str, tuple[int, ...], float, float, float], None] | None = None

    # ---- reads ------------------------------------------------------------------------------
    def depths(self, hashes: Sequence[int], addresses: Sequence[str]) -> list[int]:
        """Per address, how many of the leading checkpoints it holds."""
        out = [0] * len(addresses)
        if not hashes or not self._holders:
            return out
        where = {a: i for i, a in enumerate(addresses)}
        left = len(where)
        for depth in range(len(hashes), 0, -1):
            held = self._holders.get(hashes[depth - 1])
            if not held:
                continue
            for address in held:
                i = where.pop(address, None)
                if i is not None:
                    out[i] = depth
                    left -= 1
            if not left:
                break
        return out

    def shared_prefix(self, hashes: Sequence[int]) -> tuple[int, int, int]:
        """The deepest of the prompt's checkpoints that two or more conversations hold (depth),
        how many entries hold it and on how many pods; (0, 0, 0) when none is shared.

        Shared means two entries on one pod: a pod holds one entry per conversation (its next
        turn supersedes it), whereas a conversation that moved leaves copies on several pods,
        which are one conversation, not a popular prefix."""
        holders = self._holders
        for depth in range(len(hashes), 0, -1):
            held = holders.get(hashes[depth - 1])
            if held and max(held.values()) >= 2:
                return depth, sum(held.values()), len(held)
        return 0, 0, 0

    def horizon_s(self) -> float:
        if self._gap is None:
            return DEFAULT_HORIZON_S
        return min(MAX_HORIZON_S, max(MIN_HORIZON_S, HORIZON_GAPS * self._gap))

    def eviction_tokens(self, address: str, need: float, own: int | None) -> float:
        """Tokens of live conversations that `need` new tokens on `address` would evict (its
        own entry `own`, the conversation it continues, excepted); 0 without a capacity."""
        capacity = self._capacity.get(address)
        lru = self._pods.get(address)
        if capacity is None or lru is None:
            return 0.0
        over = need - (capacity - self._used.get(address, 0.0))
        if over <= 0.0:
            return 0.0
        live_after = self.clock() - self.horizon_s()
        cost = 0.0
        for key, entry in lru.items():  # least recently used first
            if key == own:
                continue
            take = entry.tokens if entry.tokens < over else over
            if entry.seen >= live_after:
                cost += take
            over -= take
            if over <= 0.0:
                break
        return cost

    def entry_key(
        self, address: str, hashes: Sequence[int], depth: int, session: str | None = None
    ) -> int | None:
        """The entry on `address` this prompt continues: its session's, when it has a key the
        pod holds; else the one whose deepest checkpoint is the prompt's `depth`-th; None if none."""
        lru = self._pods.get(address)
        if lru is None:
            return None
        if session is not None:
            key = session_entry(session)
            if key in lru:
                return key
        if depth <= 0:
            return None
        key = hashes[depth - 1]
        return key if key in lru else None

    def used_tokens(self, address: str) -> float:
        return self._used.get(address, 0.0)

    def entries(self, address: str) -> int:
        return len(self._pods.get(address, ()))

    # ---- writes -----------------------------------------------------------------------------
    def set_capacity(self, address: str, tokens: float) -> None:
        """The pod's KV cache in tokens; evicts down to it."""
        if self._capacity.get(address) == tokens:
            return
        self._capacity[address] = tokens
        if address in self._pods:
            self._trim(address)

    def routed(
        self,
        address: str,
        hashes: tuple[int, ...],
        per_checkpoint: float,
        prompt_tokens: float,
        output: float,
        session: str | None = None,
    ) -> None:
        """This replica sent a prompt with these checkpoints to `address` (`learn`, and told to
        `on_routed`, without the session key)."""
        if not hashes:
            return
        self.learn(address, hashes, per_checkpoint, prompt_tokens, output, session)
        if self.on_routed is not None:
            self.on_routed(address, hashes, per_checkpoint, prompt_tokens, output)

    def learn(
        self,
        address: str,
        hashes: tuple[int, ...],
        per_checkpoint: float,
        prompt_tokens: float,
        output: float,
        session: str | None = None,
    ) -> None:
        """A prompt with these checkpoints went to `address` (this replica's or a peer's): it
        continues the entry whose deepest checkpoint it extends (or, with a `session` key, that
        session's entry, whatever its prompt), or adds one; LRU entries past capacity go."""
        if not hashes:
            return
        lru = self._pods.setdefault(address, OrderedDict())
        now = self.clock()
        if session is not None:
            self._learn_keyed(
                address, lru, session_entry(session), hashes, per_checkpoint, prompt_tokens, output, now
            )
            return
        depth = self.depths(hashes, (address,))[0]
        key = self.entry_key(address, hashes, depth)
        if key is not None:
            old = lru.pop(key)
            self._drop(address, old)
            self._learn_gap(now - old.seen)
            base = old.base
        else:
            base = depth * per_checkpoint
        tokens = max(0.0, prompt_tokens - base) + output
        entry = _Entry(hashes, tokens, base, now)
        existing = lru.pop(hashes[-1], None)  # the same prompt again: replaced
        if existing is not None:
            self._drop(address, existing)
        self._insert(address, lru, hashes[-1], entry)

    def _learn_keyed(
        self,
        address: str,
        lru: OrderedDict[int, _Entry],
        key: int,
        hashes: tuple[int, ...],
        per_checkpoint: float,
        prompt_tokens: float,
        output: float,
        now: float,
    ) -> None:
        """A keyed conversation's turn: it supersedes that conversation's entry (else the entry
        it extends, as an unkeyed turn would: one a peer told of, or an unkeyed earlier turn), and
        counts its prompt past what the pod's other entries hold."""
        old = lru.pop(key, None)
        if old is None:
            extended = self.entry_key(address, hashes, self.depths(hashes, (address,))[0])
            if extended is not None:
                old = lru.pop(extended)
        if old is not None:
            self._drop(address, old)
            self._learn_gap(now - old.seen)
        base = self.depths(hashes, (address,))[0] * per_checkpoint
        tokens = max(0.0, prompt_tokens - base) + output
        self._insert(address, lru, key, _Entry(hashes, tokens, base, now))

    def _insert(self, address: str, lru: OrderedDict[int, _Entry], key: int, entry: _Entry) -> None:
        lru[key] = entry
        self._used[address] = self._used.get(address, 0.0) + entry.tokens
        holders = self._holders
        for h in entry.hashes:
            held = holders.get(h)
            if held is None:
                holders[h] = {address: 1}
            else:
                held[address] = held.get(address, 0) + 1
        self._trim(address)

    def retain(self, addresses: Sequence[str]) -> None:
        """Forget pods that left the pool."""
        keep = set(addresses)
        for address in [a for a in self._pods if a not in keep]:
            for entry in self._pods.pop(address).values():
                self._unref(address, entry)
            self._used.pop(address, None)
            self._capacity.pop(address, None)

    def _trim(self, address: str) -> None:
        lru = self._pods[address]
        capacity = self._capacity.get(address)
        while lru and (
            (capacity is not None and self._used[address] > capacity) or len(lru) > MAX_ENTRIES_PER_POD
        ):
            _, entry = lru.popitem(last=False)
            self._drop(address, entry)

    def _drop(self, address: str, entry: _Entry) -> None:
        self._used[address] = max(0.0, self._used.get(address, 0.0) - entry.tokens)
        self._unref(address, entry)

    def _unref(self, address: str, entry: _Entry) -> None:
        holders = self._holders
        for h in entry.hashes:
            held = holders.get(h)
            if held is None:
                continue
            n = held.get(address, 0) - 1
            if n > 0:
                held[address] = n
            else:
                held.pop(address, None)
                if not held:
                    del holders[h]

    def _learn_gap(self, gap: float) -> None:
        if gap < 0.0:
            return
        self._gap = gap if self._gap is None else self._gap + _GAP_ALPHA * (gap - self._gap)
