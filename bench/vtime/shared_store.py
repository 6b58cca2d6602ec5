"""The shared store of EPP replicas in virtual time: what Redis and its script do for
epp/datalayer/shared_state.py, on the run's clock.

Each replica's `SharedState` (the production object its `EppApp` built) decides when to send
(`RoundTripCadence`, `SharedState.run`'s rule), builds its payload (`SharedState.outgoing`)
and takes the reply (`SharedState.apply_reply`) and the peers' pushed picks
(`SharedState.apply_peer_picks`); this store does only what the Lua script does in between:
keep each replica's hash (expiring after `ttlMs`), sum the other live replicas' counts and busy
milliseconds per pod, append to and read from the capped decision stream, and publish the
picks. A call reaches the store half a round trip after it is sent and its reply (and the
picks it publishes, to every subscriber) arrive half a round trip later: `rtt_ms` wall
milliseconds, loopback Valkey by default (bench/micro/shared_state_bench.py).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from bench.vtime.loop import TIMER, Events
from epp.datalayer.shared_state import RoundTripCadence, SharedState
from epp.datalayer.shared_state_wire import Outgoing

DEFAULT_RTT_MS = 0.3  # one script call on a loopback Valkey (docs/benchmarks/costs.md)
STREAM_READ_MAX = 1000  # the script's XRANGE COUNT


@dataclass
class _Entry:
    id: int
    replica: str
    decisions: bytes
    scrapes: bytes


@dataclass
class _Hash:
    counts: dict[str, tuple[int, int]] = field(default_factory=dict)
    busy: dict[str, int] = field(default_factory=dict)
    lora: dict[str, int] = field(default_factory=dict)  # "pod/adapter" -> requests
    expires_at: float = 0.0  # EPP seconds


def parse_counts(counts: bytes) -> _Hash:
    """The script's reading of ARGV[8]: "pod requests,tokens", "busy:pod ms" and
    "lora:pod/adapter n" lines."""
    out = _Hash()
    for line in counts.decode().split("\n"):
        pod, _, value = line.partition(" ")
        if not pod or not value:
            continue
        if pod.startswith("lora:"):
            out.lora[pod[5:]] = max(0, int(value.split(",", 1)[0]))
        elif pod.startswith("busy:"):
            out.busy[pod[5:]] = max(0, int(value.split(",", 1)[0]))
        else:
            requests, _, tokens = value.partition(",")
            out.counts[pod] = (max(0, int(requests)), max(0, int(tokens or 0)))
    return out


class StoreScript:
    """One pool's keys and the script's semantics over them (the pool's replica set, each
    replica's hash, the decision stream), on EPP seconds."""

    def __init__(self, ttl_s: float, stream_max_len: int) -> None:
        self.ttl_s = ttl_s
        self.stream_max_len = stream_max_len
        self.members: list[str] = []  # the replica set, in the order replicas joined
        self.hashes: dict[str, _Hash] = {}
        self.stream: list[_Entry] = []
        self._ids = itertools.count(1)

    def call(self, now: float, me: str, last_read: str, out: Outgoing) -> list[Any]:
        """What the script returns to replica `me` for `out` at `now`, with its writes done."""
        mine = parse_counts(out.counts)
        mine.expires_at = now + self.ttl_s
        self.hashes[me] = mine
        if me not in self.members:
            self.members.append(me)
        peers: list[bytes] = []
        totals: dict[str, list[int]] = {}
        busy: dict[str, int] = {}
        lora: dict[str, int] = {}
        for replica in list(self.members):
            if replica == me:
                continue
            held = self.hashes.get(replica)
            if held is None or held.expires_at <= now:
                self.members.remove(replica)
                self.hashes.pop(replica, None)
                continue
            peers.append(replica.encode())
            for pod, (requests, tokens) in held.counts.items():
                total = totals.setdefault(pod, [0, 0])
                total[0] += requests
                total[1] += tokens
            for pod, ms in held.busy.items():
                busy[pod] = busy.get(pod, 0) + ms
            for key, n in held.lora.items():
                lora[key] = lora.get(key, 0) + n
        if out.decisions or out.scrapes:
            self.stream.append(_Entry(next(self._ids), me, out.decisions, out.scrapes))
            del self.stream[: max(0, len(self.stream) - self.stream_max_len)]
        blobs: list[bytes] = []
        scrapes: list[bytes] = []
        last = last_read
        if out.reading:
            after = int(last_read.split("-", 1)[0]) if last_read else 0
            for entry in [e for e in self.stream if e.id > after][:STREAM_READ_MAX]:
                last = f"{entry.id}-0"
                if entry.replica != me:
                    if entry.decisions:
                        blobs.append(entry.decisions)
                    if entry.scrapes:
                        scrapes.append(entry.scrapes)
        flat: list[Any] = []
        for pod, (requests, tokens) in totals.items():
            flat += [pod.encode(), requests, tokens]
        busy_flat: list[Any] = []
        for pod, ms in busy.items():
            busy_flat += [pod.encode(), ms]
        lora_flat: list[Any] = []
        for key, n in lora.items():
            lora_flat += [key.encode(), n]
        return [peers, flat, blobs, last.encode(), scrapes, busy_flat, lora_flat]


class _ReplicaLoop:
    """One replica's `SharedState.run` on the event loop: tick, maybe send, sleep the publish
    interval (a pick of its own ends the sleep at once, as `SharedState._sleep` does)."""

    def __init__(self, store: VirtualSharedStore, state: SharedState, script: StoreScript) -> None:
        self.store = store
        self.state = state
        self.script = script
        self.cadence = RoundTripCadence(state.config)
        self.in_flight = False
        self.sleep_generation = 0
        self.round_trips = 0
        state.wake_hook = self.wake

    def tick(self, generation: int | None = None) -> None:
        if self.in_flight or (generation is not None and generation != self.sleep_generation):
            return
        self.sleep_generation += 1  # the sleep (if any) ends here
        store, state = self.store, self.state
        now = store.epp_now()
        local, busy = state.pool.local_inflight(), state.pool.local_busy_ms()
        if self.cadence.due(now, local, busy, state.has_news()):
            out = state.outgoing(local, busy, state.local_lora())
            self.in_flight = True
            self.round_trips += 1
            last_read = state.last_read
            half = store.rtt_s / 2
            reply: list[Any] = []

            def execute() -> None:
                reply.extend(self.script.call(store.epp_now(), state.replica_id, last_read, out))
                if out.picks:
                    store.publish(self.script, out.picks, half)

            def answered() -> None:
                self.in_flight = False
                self.cadence.sent(now, local, busy, state.apply_reply(reply))
                if state.has_picks() and self.cadence.ok:
                    self.tick()  # picks made during the round trip: publish them now
                else:
                    self.sleep()

            store.after(half, execute)
            store.after(2 * half, answered)
            return
        self.sleep()

    def sleep(self) -> None:
        self.sleep_generation += 1
        generation = self.sleep_generation
        self.store.after(self.cadence.interval_s, lambda: self.tick(generation))

    def wake(self) -> None:
        """A pick of this replica: its loop runs as soon as the decision has returned (the live
        loop resumes on the event loop after the request's handler yields)."""
        if not self.in_flight:
            generation = self.sleep_generation
            self.store.after(0.0, lambda: self.tick(generation))


class VirtualSharedStore:
    """Every pool's store for one run of N replicas; `attach` each replica's SharedState."""

    def __init__(self, events: Events, time_scale: float, rtt_ms: float = DEFAULT_RTT_MS) -> None:
        self.events = events
        self.time_scale = time_scale
        self.rtt_ms = rtt_ms
        self.rtt_s = rtt_ms / 1000  # EPP (wall) seconds
        self._scripts: dict[str, StoreScript] = {}
        self._subscribers: dict[str, list[SharedState]] = {}
        self.loops: list[_ReplicaLoop] = []

    def epp_now(self) -> float:
        return self.events.now / self.time_scale

    def after(self, seconds: float, fn: Any) -> None:
        """Run `fn` `seconds` EPP seconds from now."""
        self.events.at(self.events.now + seconds * self.time_scale, TIMER, fn)

    def attach(self, pool: str, state: SharedState) -> None:
        """One replica's shared state for `pool`: its clocks on the run's, its loop started now."""
        config = state.config
        script = self._scripts.get(pool)
        if script is None:
            script = self._scripts[pool] = StoreScript(config.ttl_ms / 1000, config.prefix_stream_max_len)
        state.wall_clock = state.mono_clock = self.epp_now
        if config.push_picks:
            self._subscribers.setdefault(pool, []).append(state)
        loop = _ReplicaLoop(self, state, script)
        self.loops.append(loop)
        self.after(0.0, loop.tick)

    def publish(self, script: StoreScript, payload: bytes, delay_s: float) -> None:
        """PUBLISH on the pool's picks channel: every subscriber (the sender skips its own)."""
        pool = next(name for name, s in self._scripts.items() if s is script)
        for state in list(self._subscribers.get(pool, ())):
            self.after(delay_s, lambda state=state: state.apply_peer_picks(payload))

    def config(self, states: Sequence[SharedState]) -> dict[str, object]:
        """The store model's parameters, for a summary."""
        shared = states[0].config.model_dump(by_alias=True, exclude={"redis"}) if states else {}
        return {
            "model": "bench/vtime/shared_store.py: the script's semantics, replies after rtt_ms",
            "rtt_ms": self.rtt_ms,
            "shared_state": shared,
            "round_trips": sum(loop.round_trips for loop in self.loops),
        }
