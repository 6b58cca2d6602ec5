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
slot. Adapter residency stays per replica (docs/architecture.md, "EPP replicas"); the
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
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import msgpack
from prometheus_client import CollectorRegistry, Counter, Gauge
from redis.exceptions import RedisError

from epp.datalayer.adapter_residency import AdapterResidency
from epp.datalayer.pool import Metrics, Pool
from epp.datalayer.prefix_index import PrefixIndex
from epp.datalayer.redis_script import ScriptConnection, Subscription, encode_command
from gateway.config import SharedStateConfig
from gateway.supervise import spawn

log = logging.getLogger(__name__)

# KEYS: 1 the pool's replica set, 2 this replica's hash, 3 the pool's routing-decision stream.
# ARGV: 1 ttl_ms, 2 this replica's id, 3 the prefix of every replica's hash key, 4 the last
# stream id read ("" = none yet: read from the oldest kept), 5 this replica's decisions since
# the last call (msgpack, "" = none), 6 the stream's cap, 7 whether to read the stream (0/1),
# 8 this replica's counts ("pod requests,tokens" lines, "busy:pod ms" lines: its pending
# prefill milliseconds on the pod that no page shows yet, and "lora:pod/adapter n" lines: its
# requests in flight per pod and LoRA adapter; one argument whatever the pod count),
# 9 this replica's scrapes since the last call (msgpack, "" = none), 10 the pool's picks channel,
# 11 this replica's picks since the last call (msgpack, "" = none): published on the channel
# once its hash holds them, so a peer that reads the hash after the message counts them once.
# Returns {{the other live replicas' ids}, {pod, requests, tokens, ...: their counts summed per
# pod (malformed values skipped)}, {the other replicas' decision blobs after ARGV[4]}, the last
# stream id read, {their scrape blobs}, {pod, ms, ...: their busy milliseconds summed per pod},
# {pod/adapter, requests, ...: their LoRA requests in flight summed per pod and adapter}}.
# A replica running an older script reads a "busy:pod" or "lora:..." field as a pod it does not know. Summing here keeps the reply (and its parsing on the
# EPP's event loop) one entry per pod however many replicas there are.
_SCRIPT = """
local ttl = tonumber(ARGV[1])
redis.call('DEL', KEYS[2])
redis.call('HSET', KEYS[2], '_', '1')
local fields = {}
for pod, counts in string.gmatch(ARGV[8], '([^ \\n]+) ([^\\n]+)') do
  fields[#fields + 1] = pod
  fields[#fields + 1] = counts
end
if #fields > 0 then
  redis.call('HSET', KEYS[2], unpack(fields))
end
redis.call('PEXPIRE', KEYS[2], ttl)
redis.call('SADD', KEYS[1], ARGV[2])
redis.call('PEXPIRE', KEYS[1], ttl * 100)
local peers, totals, order, busy, busy_order, lora, lora_order = {}, {}, {}, {}, {}, {}, {}
for _, id in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  if id ~= ARGV[2] then
    local vals = redis.call('HGETALL', ARGV[3] .. id)
    if #vals == 0 then
      redis.call('SREM', KEYS[1], id)
    else
      peers[#peers + 1] = id
      for i = 1, #vals - 1, 2 do
        local requests, tokens = string.match(vals[i + 1], '^(-?%d+),?(-?%d*)$')
        local busy_pod = string.match(vals[i], '^busy:(.+)$')
        local lora_key = string.match(vals[i], '^lora:(.+)$')
        if lora_key then
          if requests then
            if lora[lora_key] == nil then
              lora[lora_key] = 0
              lora_order[#lora_order + 1] = lora_key
            end
            lora[lora_key] = lora[lora_key] + math.max(0, tonumber(requests))
          end
        elseif busy_pod then
          if requests then
            if busy[busy_pod] == nil then
              busy[busy_pod] = 0
              busy_order[#busy_order + 1] = busy_pod
            end
            busy[busy_pod] = busy[busy_pod] + math.max(0, tonumber(requests))
          end
        elseif requests and vals[i] ~= '_' then
          local sum = totals[vals[i]]
          if sum == nil then
            sum = {0, 0}
            totals[vals[i]] = sum
            order[#order + 1] = vals[i]
          end
          sum[1] = sum[1] + math.max(0, tonumber(requests))
          sum[2] = sum[2] + math.max(0, tonumber(tokens) or 0)
        end
      end
    end
  end
end
local flat = {}
for _, pod in ipairs(order) do
  flat[#flat + 1] = pod
  flat[#flat + 1] = totals[pod][1]
  flat[#flat + 1] = totals[pod][2]
end
if ARGV[5] ~= '' or ARGV[9] ~= '' then
  local entry = {'r', ARGV[2]}
  if ARGV[5] ~= '' then entry[#entry + 1] = 'b'; entry[#entry + 1] = ARGV[5] end
  if ARGV[9] ~= '' then entry[#entry + 1] = 's'; entry[#entry + 1] = ARGV[9] end
  redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[6], '*', unpack(entry))
  redis.call('PEXPIRE', KEYS[3], ttl * 100)
end
local blobs, scrapes, last = {}, {}, ARGV[4]
if ARGV[7] == '1' then
  local from = '-'
  if ARGV[4] ~= '' then from = '(' .. ARGV[4] end
  for _, entry in ipairs(redis.call('XRANGE', KEYS[3], from, '+', 'COUNT', 1000)) do
    last = entry[1]
    local fields, from_us, blob, scrape = entry[2], false, nil, nil
    for i = 1, #fields - 1, 2 do
      if fields[i] == 'r' and fields[i + 1] == ARGV[2] then from_us = true end
      if fields[i] == 'b' then blob = fields[i + 1] end
      if fields[i] == 's' then scrape = fields[i + 1] end
    end
    if not from_us then
      if blob then blobs[#blobs + 1] = blob end
      if scrape then scrapes[#scrapes + 1] = scrape end
    end
  end
end
local busy_flat = {}
for _, pod in ipairs(busy_order) do
  busy_flat[#busy_flat + 1] = pod
  busy_flat[#busy_flat + 1] = busy[pod]
end
if ARGV[11] ~= nil and ARGV[11] ~= '' then
  redis.call('PUBLISH', ARGV[10], ARGV[11])
end
local lora_flat = {}
for _, key in ipairs(lora_order) do
  lora_flat[#lora_flat + 1] = key
  lora_flat[#lora_flat + 1] = lora[key]
end
return {peers, flat, blobs, last, scrapes, busy_flat, lora_flat}
"""

# Pods per script call: Lua's unpack takes at most a few thousand values.
MAX_PODS_PER_CALL = 2000
# Routing decisions waiting for the next call, at most (the oldest dropped beyond).
MAX_OUTBOX = 5000


def default_replica_id() -> str:
    """Unique per process (a restarted replica is a new one: its old hash just expires)."""
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"


def _wake_up(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def encode_scrape(address: str, m: Metrics, sent_at: float, wall_now: float, mono_now: float) -> list[Any]:
    """One scrape as a stream entry: its times as wall-clock (the replicas' monotonic clocks
    differ), then the fields scheduling reads."""
    to_wall = wall_now - mono_now
    return [
        address,
        sent_at + to_wall,
        m.scraped_at + to_wall,
        m.waiting,
        m.running,
        m.kv_usage,
        sorted(m.running_adapters),
        sorted(m.waiting_adapters),
        m.max_lora,
        m.block_size,
        m.num_gpu_blocks,
    ]


def decode_scrape(entry: Any, wall_now: float, mono_now: float) -> tuple[str, Metrics, float]:
    """(address, metrics, sent_at) on this process's monotonic clock; a peer's clock ahead of
    ours reads as now. Raises ValueError or TypeError on a malformed entry."""
    address, sent, scraped, waiting, running, kv, run_ad, wait_ad, max_lora, block_size, blocks = entry
    if not isinstance(address, str) or not all(isinstance(a, str) for a in (*run_ad, *wait_ad)):
        raise TypeError("scrape entry: address and adapters must be strings")

    def mono(wall: float) -> float:
        lag = wall_now - float(wall)
        return mono_now - lag if lag > 0.0 else mono_now

    metrics = Metrics(
        waiting=None if waiting is None else float(waiting),
        running=None if running is None else float(running),
        kv_usage=None if kv is None else float(kv),
        running_adapters=frozenset(run_ad),
        waiting_adapters=frozenset(wait_ad),
        max_lora=int(max_lora),
        block_size=None if block_size is None else int(block_size),
        num_gpu_blocks=None if blocks is None else int(blocks),
        scraped_at=mono(scraped),
    )
    return address, metrics, mono(sent)


def parse_busy(flat: list[Any]) -> dict[str, float]:
    """The script's summed busy milliseconds (pod, ms, ...) -> pod -> seconds."""
    it = iter(flat)
    return {pod.decode(): ms / 1000.0 for pod, ms in zip(it, it, strict=False)}


def parse_lora(flat: list[Any]) -> dict[str, dict[str, int]]:
    """The script's summed LoRA counts (pod/adapter, requests, ...) -> pod -> adapter -> requests."""
    it = iter(flat)
    out: dict[str, dict[str, int]] = {}
    for key, requests in zip(it, it, strict=False):
        pod, _, adapter = _text(key).partition("/")
        if adapter:
            out.setdefault(pod, {})[adapter] = int(requests)
    return out


def parse_totals(flat: list[Any]) -> dict[str, tuple[int, int]]:
    """The script's summed counts (pod, requests, tokens, ...) -> pod -> (requests, tokens)."""
    it = iter(flat)
    return {pod.decode(): (requests, tokens) for pod, requests, tokens in zip(it, it, it, strict=False)}


@dataclass(frozen=True)
class Outgoing:
    """What one round trip sends (the script's ARGV beyond the keys and ids): this replica's
    counts ("pod requests,tokens" and "busy:pod ms" lines), its routing decisions, scrapes and
    picks since the last call (msgpack, b"" = none), and whether it reads the stream. Built by
    `SharedState.outgoing`; the live loop sends it to Redis, the virtual-time store
    (bench/vtime/shared_store.py) does what the script does with it."""

    counts: bytes
    decisions: bytes
    scrapes: bytes
    picks: bytes
    reading: bool


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
    ) -> None:
        self.pool = pool
        # Adapter residency (epp/datalayer/adapter_residency.py): this replica's LoRA requests in flight per
        # pod are published and pushed with its picks; the peers' are its remote share.
        self.residency = residency
        self.prefix_index = prefix_index if config.prefix_index else None
        # A peer's scrape (address, metrics, sent_at): applied as if this replica had read it.
        self.on_scrape = on_scrape if config.share_scrapes else None
        self._outbox: deque[tuple[str, Sequence[int]]] = deque(maxlen=MAX_OUTBOX)
        self._scrapes: dict[str, tuple[Metrics, float]] = {}  # this replica's, latest per pod
        self.scrapes_learned = 0
        self._last_id = ""
        self.learned = 0  # peers' routing decisions taught to the prefix index
        self.bad_entries = 0
        if self.prefix_index is not None:
            self.prefix_index.on_add = self._on_add
        self.config = config
        self.replica_id = replica_id or default_replica_id()
        # The clocks scrapes are carried on (wall) and kept on (monotonic, the pool's).
        self.wall_clock: Callable[[], float] = time.time
        self.mono_clock: Callable[[], float] = time.monotonic
        # One connection, no hidden retries: the loop's own cadence retries.
        self._redis = ScriptConnection(config.redis, _SCRIPT, config.timeout_ms / 1000)
        tag = f"{config.key_prefix}:{{{pool_name}}}"
        self._set_key = f"{tag}:replicas"
        self._hash_prefix = f"{tag}:inflight:"
        self._stream_key = f"{tag}:prefix"
        self._channel = f"{tag}:picks"
        # Pushed picks (`pushPicks`): this replica's picks since its last round trip, which
        # carries them (and wakes at once for them while peers are live); the peers' arrive on
        # `_subscription` and count until the next round trip replaces their totals.
        self._picks: list[tuple[str, int, int]] = []
        self._adapter_picks: list[tuple[str, str, int]] = []  # (pod, adapter, output tokens)
        self._wake: asyncio.Future[None] | None = None
        self.wake_hook: Callable[[], None] | None = None  # a pick to tell (virtual time's loop)
        self._pushed = False  # a peer's pick counted since our last round trip
        self.picks_learned = 0
        self._subscription: Subscription | None = None
        self._listen_task: asyncio.Task[None] | None = None
        if config.push_picks:
            self._subscription = Subscription(
                config.redis, self._channel.encode(), config.timeout_ms / 1000, self.apply_peer_picks
            )
            pool.pick_hook = self._on_pick
            if residency is not None:
                residency.routed_hook = self._on_adapter_pick
        self.peers: list[str] = []  # the other live replicas' ids
        self.remote: dict[str, tuple[int, int]] = {}  # their counts summed per pod
        self._totals: list[Any] | None = None  # the script's reply they were parsed from
        self.connected = False
        self.errors = 0
        self._task: asyncio.Task[None] | None = None
        labels = {"inference_pool": pool_name}
        self._m_errors = Counter(
            "gateway_shared_state_errors",
            "Shared-state round trips that failed (Redis unreachable, slow or erroring); "
            "the EPP then schedules on its own in-flight counts",
            ["inference_pool"],
            registry=registry,
        ).labels(**labels)
        self._m_up = Gauge(
            "gateway_shared_state_up",
            "1 while the last shared-state round trip succeeded",
            ["inference_pool"],
            registry=registry,
        ).labels(**labels)
        self._m_peers = Gauge(
            "gateway_shared_state_peers",
            "Other live EPP replicas of this pool",
            ["inference_pool"],
            registry=registry,
        ).labels(**labels)

    async def sync_once(self) -> bool:
        """One round trip: publish ours, read theirs. False (and local counts only) on failure."""
        return await self._round_trip(
            self.pool.local_inflight(), self.pool.local_busy_ms(), self.local_lora()
        )

    def local_lora(self) -> dict[str, dict[str, int]]:
        """This replica's LoRA requests in flight per pod and adapter ({} without residency)."""
        return self.residency.local_active() if self.residency is not None else {}

    def _on_add(self, address: str, hashes: Sequence[int]) -> None:
        self._outbox.append((address, hashes))

    def _on_pick(self, address: str, prefill_s: float, tokens: int) -> None:
        """A pick of this replica (Pool.pick_hook): published with the next round trip, which
        starts at once while there are peers to tell."""
        if not self.peers:
            return
        self._picks.append((address, int(prefill_s * 1000.0 + 0.5), tokens))
        wake = self._wake
        if wake is not None and not wake.done():
            wake.set_result(None)
        if self.wake_hook is not None:
            self.wake_hook()

    def _on_adapter_pick(self, address: str, adapter: str, output_tokens: int) -> None:
        """A LoRA pick of this replica (AdapterResidency.routed_hook): pushed with its pick."""
        if self.peers:
            self._adapter_picks.append((address, adapter, output_tokens))

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
            self._scrapes[address] = (metrics, sent_at)

    def has_news(self) -> bool:
        """Decisions, scrapes or picks of ours to send, or a peer's pick counted since the last
        round trip (whose totals the next one replaces)."""
        return bool(self._outbox) or bool(self._scrapes) or self.has_picks() or self._pushed

    def has_picks(self) -> bool:
        """Picks of ours made since the last payload was built (`run` sends them at once)."""
        return bool(self._picks) or bool(self._adapter_picks)

    def outgoing(
        self,
        local: Mapping[str, tuple[int, int]],
        busy: Mapping[str, int] | None = None,
        lora: Mapping[str, Mapping[str, int]] | None = None,
    ) -> Outgoing:
        """This replica's payload for one round trip; takes its queued decisions, scrapes and
        picks (lost if the call fails: the index is a guess anyway, the next scrape replaces a
        scrape, the next round trip's counts carry the picks)."""
        decisions = b""
        if self._outbox:
            decisions = msgpack.packb([[a, list(h)] for a, h in self._outbox])
            self._outbox.clear()
        scrapes = b""
        if self._scrapes:
            wall, mono = self.wall_clock(), self.mono_clock()
            scrapes = msgpack.packb(
                [encode_scrape(a, m, t, wall, mono) for a, (m, t) in self._scrapes.items()]
            )
            self._scrapes.clear()
        lines = [f"{pod} {r},{t}" for pod, (r, t) in list(local.items())[:MAX_PODS_PER_CALL]]
        lines += [f"busy:{pod} {ms}" for pod, ms in list((busy or {}).items())[:MAX_PODS_PER_CALL]]
        lines += [
            f"lora:{pod}/{adapter} {n}"
            for pod, adapters in list((lora or {}).items())[:MAX_PODS_PER_CALL]
            for adapter, n in adapters.items()
            if " " not in adapter and "\n" not in adapter
        ]
        picks = b""
        if self._picks or self._adapter_picks:
            message: list[Any] = [self.replica_id, self._picks]
            if self._adapter_picks:  # only then: a peer of an older version reads [sender, picks]
                message.append(self._adapter_picks)
            picks = msgpack.packb(message)
            self._picks, self._adapter_picks = [], []
        self._pushed = False
        reading = self.prefix_index is not None or self.on_scrape is not None
        return Outgoing("\n".join(lines).encode(), decisions, scrapes, picks, reading)

    async def _round_trip(
        self,
        local: Mapping[str, tuple[int, int]],
        busy: Mapping[str, int] | None = None,
        lora: Mapping[str, Mapping[str, int]] | None = None,
    ) -> bool:
        out = self.outgoing(local, busy, lora)
        config, me = self.config, self.replica_id
        args = [b"%d" % config.ttl_ms, me.encode(), self._hash_prefix.encode(), self._last_id.encode()]
        args += (out.decisions, b"%d" % config.prefix_stream_max_len, b"1" if out.reading else b"0")
        args += (out.counts, out.scrapes, self._channel.encode(), out.picks)
        keys = [k.encode() for k in (self._set_key, self._hash_prefix + me, self._stream_key)]
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
            self.peers = [_text(p) for p in peers]
            self._last_id = _text(last_id)
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
        self._m_up.set(1)
        self._m_peers.set(len(self.peers))
        return True

    def _learn(self, blobs: list[bytes]) -> None:
        """Teach the prefix index the other replicas' routing decisions from the stream."""
        index = self.prefix_index
        if index is None:
            return
        for blob in blobs:
            try:
                for address, hashes in msgpack.unpackb(blob):
                    if isinstance(address, str) and address in self.pool:
                        index.learn(address, [h for h in hashes if isinstance(h, int)])
                        self.learned += 1
            except (ValueError, TypeError, msgpack.UnpackException):  # not ours: skip the entry
                self.bad_entries += 1

    def _apply_scrapes(self, blobs: list[bytes]) -> None:
        """Hand the other replicas' scrapes, oldest first, to `on_scrape`."""
        apply = self.on_scrape
        if apply is None or not blobs:
            return
        wall, mono = self.wall_clock(), self.mono_clock()
        for blob in blobs:
            try:
                decoded = [decode_scrape(entry, wall, mono) for entry in msgpack.unpackb(blob)]
            except (ValueError, TypeError, msgpack.UnpackException):  # not ours: skip the entry
                self.bad_entries += 1
                continue
            for address, metrics, sent_at in decoded:
                if address in self.pool:
                    apply(address, metrics, sent_at)
                    self.scrapes_learned += 1

    def _failed(self, exc: BaseException) -> None:
        self.errors += 1
        self._m_errors.inc()
        self._m_up.set(0)
        self._m_peers.set(0)
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
        self._task = spawn("shared-state", f"shared state {self._set_key}", self.run)
        if self._subscription is not None:
            self._listen_task = spawn("shared-state", f"shared state picks {self._set_key}", self.listen)

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
        delete = encode_command([b"DEL", (self._hash_prefix + self.replica_id).encode()])
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
