"""In-flight counts shared by a pool's EPP replicas through Redis.

Every replica routes its own share of the requests (Envoy balances ext_proc streams over
them), so each knows only its own in-flight per pod. A background loop looks at its own counts
every `publishIntervalMs` (a dict scan, no I/O) and, when they changed or `idleIntervalMs`
passed, sends one script call that (1) replaces this replica's hash (pod -> "requests,tokens")
and sets it to expire after `ttlMs`, (2) registers the replica in the pool's set and (3)
returns the other live replicas' counts, summed per pod by the script; with `prefixIndex` (the
default) the same call appends this replica's routing decisions since the last one (pod,
prompt block hashes) to the pool's capped stream and returns the entries after the last one
read, which the approximate prefix index `learn`s, so every replica's index sees every
replica's traffic; with `shareScrapes` (the default) it also carries this replica's scrapes
since the last call (each pod's waiting, running, KV use and adapters, times on the wall
clock), which the others record as their own when newer than what they hold: with the
scrape shared across N replicas, each reads a pod only every N intervals itself. The totals
go into `Pool.set_remote_inflight`, and snapshots add them to the local counts: a
scheduling decision reads memory, never Redis. Beside its counts each replica publishes, per pod,
the predicted prefill seconds of its pending picks that no page shows yet (its ledger,
epp/datalayer/ledger.py `busy_since_s`); the others add them to the pod's `busy_s`, so a 4,000-token prompt
another replica just sent there weighs as what it is, not as one request of a typical size. A busy replica is one
publish interval behind the others; an idle one, one idle interval. The call runs on the EPP's
event loop over one lean connection (epp/datalayer/redis_script.py): ~0.1-0.3 ms of loop CPU per cycle
at 16-100 pods (bench/micro/shared_state_bench.py), several times less than through redis-py's
client, and that loop also carries the ext_proc streams. A replica that dies stops being counted
when its hash expires (its in-flight requests died with it); one that stops cleanly deletes
its hash at once. Redis unreachable or slow: the remote share is dropped (local counts only),
the error logged and counted, and requests are never failed for it.

All keys of a pool share one hash tag (`{pool}`), so the script stays in one Redis Cluster
slot (the script, its keys and its payload: epp/datalayer/shared_state_wire.py; what is queued
for the next call: epp/datalayer/shared_state_outbox.py). Adapter residency stays per replica (docs/architecture.md, "EPP replicas"); the
KV-event index is the same on every replica because each subscribes to every pod.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import secrets
import socket
import time
from collections.abc import Callable, Mapping
from typing import Any

import msgpack
from prometheus_client import CollectorRegistry, Counter, Gauge
from redis.exceptions import RedisError

from epp.datalayer.adapter_residency import AdapterResidency
from epp.datalayer.endpoint_records import Metrics
from epp.datalayer.pool import Pool
from epp.datalayer.prefix_index import PrefixIndex
from epp.datalayer.redis_script import ScriptConnection, Subscription, encode_command
from epp.datalayer.session_memory import SessionMemory
from epp.datalayer.shared_state_outbox import Outbox, count_lines
from epp.datalayer.shared_state_wire import (
    ROUND_TRIP_SCRIPT,
    Outgoing,
    PoolKeys,
    apply_scrapes,
    as_text,
    learn_decisions,
    parse_busy,
    parse_lora,
    parse_totals,
)
from gateway.config import SharedStateConfig
from gateway.supervise import spawn

log = logging.getLogger(__name__)


def default_replica_id() -> str:
    """Unique per process (a restarted replica is a new one: its old hash just expires)."""
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"


def _wake_up(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class RoundTripCadence:
    """When a replica sends its next round trip (`SharedState.run`'s rule, also followed by the
    virtual-time store): at once when its counts, decisions, scrapes or picks changed since the
    last one (checked every `publishIntervalMs`), else every `idleIntervalMs`; while Redis is
    down, every half TTL (a dead Redis costs a connect attempt, not 50 a second)."""

    def __init__(self, config: SharedStateConfig) -> None:
        self.interval_s = config.publish_interval_ms / 1000
        self.idle_s = config.idle_interval_ms / 1000
        self.retry_s = max(self.idle_s, config.ttl_ms / 2000)
        self.published: Mapping[str, tuple[int, int]] | None = None
        self.published_busy: Mapping[str, int] = {}
        self.last = -math.inf
        self.ok = True

    def due(
        self, now: float, local: Mapping[str, tuple[int, int]], busy: Mapping[str, int], news: bool
    ) -> bool:
        changed = local != self.published or busy != self.published_busy or news
        return (changed and self.ok) or now - self.last >= (self.idle_s if self.ok else self.retry_s)

    def sent(
        self, now: float, local: Mapping[str, tuple[int, int]], busy: Mapping[str, int], ok: bool
    ) -> None:
        self.published, self.published_busy, self.last, self.ok = local, busy, now, ok


class SharedStateMetrics:
    """The loop's health on /metrics: failed round trips, up, live peers."""

    def __init__(self, registry: CollectorRegistry, pool_name: str) -> None:
        labels = {"inference_pool": pool_name}
        self.errors = Counter(
            "gateway_shared_state_errors",
            "Shared-state round trips that failed (Redis unreachable, slow or erroring); "
            "the EPP then schedules on its own in-flight counts",
            ["inference_pool"],
            registry=registry,
        ).labels(**labels)
        self.up = Gauge(
            "gateway_shared_state_up",
            "1 while the last shared-state round trip succeeded",
            ["inference_pool"],
            registry=registry,
        ).labels(**labels)
        self.peers = Gauge(
            "gateway_shared_state_peers",
            "Other live EPP replicas of this pool",
            ["inference_pool"],
            registry=registry,
        ).labels(**labels)


class SharedState:
    """Publishes this replica's in-flight per pod and feeds the others' into the Pool; with a
    `prefix_index`, shares its routing decisions too and teaches the index the others'."""

    def __init__(
        self,
        pool: Pool,
        pool_name: str,
        config: SharedStateConfig,
        registry: CollectorRegistry,
        *,
        replica_id: str | None = None,
        prefix_index: PrefixIndex | None = None,
        on_scrape: Callable[[str, Metrics, float], None] | None = None,
        residency: AdapterResidency | None = None,
        memory: SessionMemory | None = None,
    ) -> None:
        self.pool = pool
        # Adapter residency (epp/datalayer/adapter_residency.py): this replica's LoRA requests in flight per
        # pod are published and pushed with its picks; the peers' are its remote share.
        self.residency = residency
        self.prefix_index = prefix_index if config.prefix_index else None
        # A peer's scrape (address, metrics, sent_at): applied as if this replica had read it.
        self.on_scrape = on_scrape if config.share_scrapes else None
        # What the next round trip tells the peers (epp/datalayer/shared_state_outbox.py).
        self.outbox = Outbox(lambda: bool(self.peers), self._wake_loop)
        self.scrapes_learned = 0
        self._last_id = ""
        self.learned = 0  # peers' routing decisions taught to the prefix index
        self.bad_entries = 0
        if self.prefix_index is not None:
            self.prefix_index.on_add = self.outbox.add_decision
        # The KV memory (epp/datalayer/session_memory.py) is shared like the prefix index.
        self.memory = memory if config.prefix_index else None
        if self.memory is not None:
            self.memory.on_routed = self.outbox.add_memory_routing
        self.config = config
        self.replica_id = replica_id or default_replica_id()
        # The clocks scrapes are carried on (wall) and kept on (monotonic, the pool's).
        self.wall_clock: Callable[[], float] = time.time
        self.mono_clock: Callable[[], float] = time.monotonic
        # One connection, no hidden retries: the loop's own cadence retries.
        self._redis = ScriptConnection(config.redis, ROUND_TRIP_SCRIPT, config.timeout_ms / 1000)
        self.keys = PoolKeys.of(config.key_prefix, pool_name)
        # Pushed picks (`pushPicks`): this replica's, in the outbox, wake the loop at once while
        # peers are live; the peers' arrive on `_subscription` and count until the next round
        # trip replaces their totals.
        self._wake: asyncio.Future[None] | None = None
        self.wake_hook: Callable[[], None] | None = None  # a pick to tell (virtual time's loop)
        self._pushed = False  # a peer's pick counted since our last round trip
        self.picks_learned = 0
        self._subscription: Subscription | None = None
        self._listen_task: asyncio.Task[None] | None = None
        if config.push_picks:
            self._subscription = Subscription(
                config.redis, self.keys.channel.encode(), config.timeout_ms / 1000, self.apply_peer_picks
            )
            pool.pick_hook = self.outbox.add_pick
            if residency is not None:
                residency.routed_hook = self.outbox.add_adapter_pick
        self.peers: list[str] = []  # the other live replicas' ids
        self.remote: dict[str, tuple[int, int]] = {}  # their counts summed per pod
        self._totals: list[Any] | None = None  # the script's reply they were parsed from
        self.connected = False
        self.errors = 0
        self._task: asyncio.Task[None] | None = None
        self._metrics = SharedStateMetrics(registry, pool_name)

    async def sync_once(self) -> bool:
        """One round trip: publish ours, read theirs. False (and local counts only) on failure."""
        return await self._round_trip(
            self.pool.local_inflight(), self.pool.local_busy_ms(), self.local_lora()
        )

    def local_lora(self) -> dict[str, dict[str, int]]:
        """This replica's LoRA requests in flight per pod and adapter ({} without residency)."""
        return self.residency.local_active() if self.residency is not None else {}

    def _wake_loop(self) -> None:
        """A pick to push: the loop's round trip starts now (and virtual time's, `wake_hook`)."""
        wake = self._wake
        if wake is not None and not wake.done():
            wake.set_result(None)
        if self.wake_hook is not None:
            self.wake_hook()

    def apply_peer_picks(self, payload: bytes) -> None:
        """Another replica's picks, as it made them: counted now (Pool.add_remote_pick), and
        their adapters in the residency (AdapterResidency.on_peer_routed)."""
        try:
            message = msgpack.unpackb(payload)
            sender, picks = message[0], message[1]
            if sender == self.replica_id:
                return
            for address, ms, tokens in picks:
                if isinstance(address, str) and address in self.pool:
                    self.pool.add_remote_pick(address, max(0, int(ms)) / 1000.0, max(0, int(tokens)))
                    self.picks_learned += 1
                    self._pushed = True
            residency = self.residency
            for address, adapter, output_tokens in message[2] if len(message) > 2 else ():
                if residency is not None and isinstance(adapter, str) and address in self.pool:
                    residency.on_peer_routed(address, adapter, max(0, int(output_tokens)))
                    self._pushed = True
        except (ValueError, TypeError, msgpack.UnpackException):  # not ours: skip the message
            self.bad_entries += 1

    def publish_scrape(self, address: str, metrics: Metrics, sent_at: float) -> None:
        """Queue this replica's scrape of a pod for the next round trip (the newest per pod)."""
        if self.on_scrape is not None:
            self.outbox.scrapes[address] = (metrics, sent_at)

    def has_news(self) -> bool:
        """Decisions, scrapes or picks of ours to send, or a peer's pick counted since the last
        round trip (whose totals the next one replaces)."""
        return self.outbox.pending() or self._pushed

    def has_picks(self) -> bool:
        """Picks of ours made since the last payload was built (`run` sends them at once)."""
        return self.outbox.has_picks()

    def outgoing(
        self,
        local: Mapping[str, tuple[int, int]],
        busy: Mapping[str, int] | None = None,
        lora: Mapping[str, Mapping[str, int]] | None = None,
    ) -> Outgoing:
        """This replica's payload for one round trip; takes its queued decisions, scrapes and
        picks (lost if the call fails: the index is a guess anyway, the next scrape replaces a
        scrape, the next round trip's counts carry the picks)."""
        box = self.outbox
        decisions = box.take_decisions()
        scrapes = box.take_scrapes(self.wall_clock, self.mono_clock)
        counts = count_lines(local, busy, lora)
        picks = box.take_picks(self.replica_id)
        self._pushed = False
        reading = self.prefix_index is not None or self.on_scrape is not None
        return Outgoing(counts, decisions, scrapes, picks, reading)

    async def _round_trip(
        self,
        local: Mapping[str, tuple[int, int]],
        busy: Mapping[str, int] | None = None,
        lora: Mapping[str, Mapping[str, int]] | None = None,
    ) -> bool:
        out = self.outgoing(local, busy, lora)
        config = self.config
        keys, args = self.keys.round_trip(
            self.replica_id, self._last_id, config.ttl_ms, config.prefix_stream_max_len, out
        )
        try:  # bounded by timeoutMs
            reply = await self._redis.evalsha(keys, args)
        except (RedisError, OSError, TimeoutError) as exc:
            self._failed(exc)
            return False
        return self.apply_reply(reply)

    @property
    def last_read(self) -> str:
        """The last stream entry id this replica read ("" = none yet)."""
        return self._last_id

    def apply_reply(self, reply: Any) -> bool:
        """Take the script's reply: the peers, their counts and busy summed per pod, their
        decisions and scrapes since our last read. False (and local counts only) when malformed."""
        try:
            peers, totals, blobs, last_id, scrape_blobs, busy_flat, lora_flat = reply
            remote_busy = parse_busy(busy_flat)
            remote_lora = parse_lora(lora_flat)
            if totals != self._totals:  # unchanged (idle peers): nothing to parse
                self.remote, self._totals = parse_totals(totals), totals
            self.peers = [as_text(p) for p in peers]
            self._last_id = as_text(last_id)
        except (ValueError, TypeError, AttributeError) as exc:
            self._failed(exc)
            return False
        self._learn(blobs)
        self._apply_scrapes(scrape_blobs)
        self.pool.set_remote_inflight(self.remote)
        self.pool.set_remote_busy(remote_busy)
        if self.residency is not None:
            self.residency.set_remote_active(remote_lora)
        if not self.connected:
            log.info("shared state: connected (replica %s, %d peers)", self.replica_id, len(self.peers))
        self.connected = True
        self._metrics.up.set(1)
        self._metrics.peers.set(len(self.peers))
        return True

    def _learn(self, blobs: list[bytes]) -> None:
        """Teach the prefix index and the KV memory the other replicas' routing decisions."""
        if self.prefix_index is not None:
            learned, bad = learn_decisions(blobs, self.pool, self.prefix_index, self.memory)
            self.learned += learned
            self.bad_entries += bad

    def _apply_scrapes(self, blobs: list[bytes]) -> None:
        """Hand the other replicas' scrapes, oldest first, to `on_scrape`."""
        if self.on_scrape is not None and blobs:
            now = (self.wall_clock(), self.mono_clock())
            learned, bad = apply_scrapes(blobs, now, self.pool, self.on_scrape)
            self.scrapes_learned += learned
            self.bad_entries += bad

    def _failed(self, exc: BaseException) -> None:
        self.errors += 1
        self._metrics.errors.inc()
        self._metrics.up.set(0)
        self._metrics.peers.set(0)
        self.peers, self.remote, self._totals = [], {}, None
        self.pool.set_remote_inflight({})
        if self.residency is not None:
            self.residency.set_remote_active({})
        if self.connected or self.errors in (1, 10, 100) or self.errors % 1000 == 0:
            log.warning(
                "shared state: redis unavailable (%s: %s); scheduling on this replica's in-flight only",
                type(exc).__name__,
                exc,
            )
        self.connected = False

    async def run(self) -> None:
        cadence = RoundTripCadence(self.config)
        loop = asyncio.get_running_loop()
        while True:
            local, busy = self.pool.local_inflight(), self.pool.local_busy_ms()
            now = loop.time()
            if cadence.due(now, local, busy, self.has_news()):
                cadence.sent(now, local, busy, await self._round_trip(local, busy, self.local_lora()))
            if self.has_picks() and cadence.ok:
                continue  # picks made during the round trip: publish them now
            await self._sleep(loop, cadence.interval_s)

    async def _sleep(self, loop: asyncio.AbstractEventLoop, seconds: float) -> None:
        """`seconds`, or less when this replica picks (its picks wake the loop)."""
        self._wake = wake = loop.create_future()
        timer = loop.call_later(seconds, _wake_up, wake)
        try:
            await wake
        finally:
            timer.cancel()
            self._wake = None

    async def listen(self) -> None:
        """Count the peers' picks as they are published; reconnect after a lost connection."""
        subscription = self._subscription
        if subscription is None:
            return
        retry = max(self.config.idle_interval_ms / 1000, self.config.ttl_ms / 2000)
        failures = 0
        while True:
            try:
                await subscription.run()
            except (RedisError, OSError, TimeoutError) as exc:
                failures += 1
                if failures in (1, 10, 100) or failures % 1000 == 0:
                    log.warning(
                        "shared state: picks channel unavailable (%s: %s); retrying", type(exc).__name__, exc
                    )
            await asyncio.sleep(retry)

    def start(self) -> None:
        self._task = spawn("shared-state", f"shared state {self.keys.replicas}", self.run)
        if self._subscription is not None:
            self._listen_task = spawn("shared-state", f"shared state picks {self.keys.replicas}", self.listen)

    async def stop(self) -> None:
        """Stop publishing and remove our share now (not after the TTL)."""
        for task in (self._task, self._listen_task):
            if task is None:
                continue
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass
        if self._subscription is not None:
            self._subscription.close()
        delete = encode_command([b"DEL", (self.keys.inflight_prefix + self.replica_id).encode()])
        try:
            await self._redis.request(delete)  # bounded by timeoutMs
        except (RedisError, OSError, TimeoutError):
            pass
        self._redis.close()

    def debug(self) -> dict[str, Any]:
        return {
            "replica": self.replica_id,
            "connected": self.connected,
            "errors": self.errors,
            "prefix_decisions_learned": self.learned,
            "scrapes_learned": self.scrapes_learned,
            "picks_learned": self.picks_learned,
            "peers": list(self.peers),
            "remote_inflight": {pod: list(c) for pod, c in self.remote.items()},
        }
