"""In-flight counts shared by a pool's EPP replicas through Redis.

Every replica routes its own share of the requests (Envoy balances ext_proc streams over
them), so each knows only its own in-flight per pod. A background loop looks at its own counts
every `publishIntervalMs` (a dict scan, no I/O) and, when they changed or `idleIntervalMs`
passed, sends one script call that (1) replaces this replica's hash (pod -> "requests,tokens")
and sets it to expire after `ttlMs`, (2) registers the replica in the pool's set and (3)
returns every other live replica's hash. The totals go into `Pool.set_remote_inflight`, and
snapshots add them to the local counts: a scheduling decision reads memory, never Redis. A
busy replica is one publish interval behind the others; an idle one, one idle interval (a
round trip costs ~0.5-1 ms of Python CPU, so 50 a second while idle would be 2-5 % of a core). A replica that dies stops being counted
when its hash expires (its in-flight requests died with it); one that stops cleanly deletes
its hash at once. Redis unreachable or slow: the remote share is dropped (local counts only),
the error logged and counted, and requests are never failed for it.

All keys of a pool share one hash tag (`{pool}`), so the script stays in one Redis Cluster
slot. The approximate prefix index and adapter residency stay per replica (docs/architecture.md,
"EPP replicas"); the KV-event index is the same on every replica because each subscribes to
every pod.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import secrets
import socket
from collections.abc import Mapping
from typing import Any

import redis.asyncio as aioredis
from prometheus_client import CollectorRegistry, Counter, Gauge
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

from epp.pool import Pool
from gateway.config import SharedStateConfig
from gateway.supervise import spawn

log = logging.getLogger(__name__)

# KEYS: 1 the pool's replica set, 2 this replica's hash.
# ARGV: 1 ttl_ms, 2 this replica's id, 3 the prefix of every replica's hash key, 4.. pod, counts.
# Returns {id1, {pod, counts, ...}, id2, {...}, ...} for the other live replicas.
_SCRIPT = """
local ttl = tonumber(ARGV[1])
redis.call('DEL', KEYS[2])
redis.call('HSET', KEYS[2], '_', '1')
if #ARGV > 3 then
  redis.call('HSET', KEYS[2], unpack(ARGV, 4))
end
redis.call('PEXPIRE', KEYS[2], ttl)
redis.call('SADD', KEYS[1], ARGV[2])
redis.call('PEXPIRE', KEYS[1], ttl * 100)
local out = {}
for _, id in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  if id ~= ARGV[2] then
    local vals = redis.call('HGETALL', ARGV[3] .. id)
    if #vals == 0 then
      redis.call('SREM', KEYS[1], id)
    else
      out[#out + 1] = id
      out[#out + 1] = vals
    end
  end
end
return out
"""

# Pods per script call: Lua's unpack takes at most a few thousand values.
MAX_PODS_PER_CALL = 2000


def default_replica_id() -> str:
    """Unique per process (a restarted replica is a new one: its old hash just expires)."""
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def parse_peers(reply: list[Any]) -> dict[str, dict[str, tuple[int, int]]]:
    """The script's reply -> replica id -> pod -> (requests, tokens); malformed entries skipped."""
    peers: dict[str, dict[str, tuple[int, int]]] = {}
    for i in range(0, len(reply) - 1, 2):
        flat = reply[i + 1]
        counts: dict[str, tuple[int, int]] = {}
        for j in range(0, len(flat) - 1, 2):
            pod = _text(flat[j])
            if pod == "_":
                continue
            requests, _, tokens = _text(flat[j + 1]).partition(",")
            try:
                counts[pod] = (max(0, int(requests)), max(0, int(tokens or 0)))
            except ValueError:
                continue
        peers[_text(reply[i])] = counts
    return peers


def sum_peers(peers: Mapping[str, Mapping[str, tuple[int, int]]]) -> dict[str, tuple[int, int]]:
    totals: dict[str, tuple[int, int]] = {}
    for counts in peers.values():
        for pod, (requests, tokens) in counts.items():
            r, t = totals.get(pod, (0, 0))
            totals[pod] = (r + requests, t + tokens)
    return totals


class SharedInflight:
    """Publishes this replica's in-flight per pod and feeds the others' into the Pool."""

    def __init__(
        self,
        pool: Pool,
        pool_name: str,
        config: SharedStateConfig,
        registry: CollectorRegistry,
        *,
        replica_id: str | None = None,
        client: aioredis.Redis | None = None,
    ) -> None:
        self.pool = pool
        self.config = config
        self.replica_id = replica_id or default_replica_id()
        timeout = config.timeout_ms / 1000
        self._redis = client or aioredis.Redis.from_url(
            config.redis,
            socket_timeout=timeout,
            socket_connect_timeout=timeout,
            retry=Retry(NoBackoff(), 0),  # no hidden retries: the loop's own cadence retries
            max_connections=4,
        )
        self._script = self._redis.register_script(_SCRIPT)
        tag = f"{config.key_prefix}:{{{pool_name}}}"
        self._set_key = f"{tag}:replicas"
        self._hash_prefix = f"{tag}:inflight:"
        self.peers: dict[str, dict[str, tuple[int, int]]] = {}
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
        return await self._round_trip(self.pool.local_inflight())

    async def _round_trip(self, local: Mapping[str, tuple[int, int]]) -> bool:
        args: list[str | int] = [self.config.ttl_ms, self.replica_id, self._hash_prefix]
        for pod, (requests, tokens) in list(local.items())[:MAX_PODS_PER_CALL]:
            args += [pod, f"{requests},{tokens}"]
        try:  # bounded by the client's socket timeouts (timeoutMs)
            reply = await self._script(keys=[self._set_key, self._hash_prefix + self.replica_id], args=args)
        except (RedisError, OSError, TimeoutError) as exc:
            self._failed(exc)
            return False
        self.peers = parse_peers(reply)
        self.pool.set_remote_inflight(sum_peers(self.peers))
        if not self.connected:
            log.info("shared state: connected (replica %s, %d peers)", self.replica_id, len(self.peers))
        self.connected = True
        self._m_up.set(1)
        self._m_peers.set(len(self.peers))
        return True

    def _failed(self, exc: BaseException) -> None:
        self.errors += 1
        self._m_errors.inc()
        self._m_up.set(0)
        self._m_peers.set(0)
        self.peers = {}
        self.pool.set_remote_inflight({})
        if self.connected or self.errors in (1, 10, 100) or self.errors % 1000 == 0:
            log.warning(
                "shared state: redis unavailable (%s: %s); scheduling on this replica's in-flight only",
                type(exc).__name__,
                exc,
            )
        self.connected = False

    async def run(self) -> None:
        interval = self.config.publish_interval_ms / 1000
        idle = self.config.idle_interval_ms / 1000
        # Down: retry every half TTL, so a dead Redis costs a connect attempt, not 50 a second.
        retry = max(idle, self.config.ttl_ms / 2000)
        loop = asyncio.get_running_loop()
        published: Mapping[str, tuple[int, int]] | None = None
        last, ok = -math.inf, True
        while True:
            local = self.pool.local_inflight()
            now = loop.time()
            if (local != published and ok) or now - last >= (idle if ok else retry):
                ok = await self._round_trip(local)
                published, last = local, now
            await asyncio.sleep(interval)

    def start(self) -> None:
        self._task = spawn("shared-state", f"shared state {self._set_key}", self.run)

    async def stop(self) -> None:
        """Stop publishing and remove our share now (not after the TTL)."""
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        try:
            await asyncio.wait_for(self._redis.delete(self._hash_prefix + self.replica_id), 1.0)
        except (RedisError, OSError, TimeoutError):
            pass
        await self._redis.aclose()

    def debug(self) -> dict[str, Any]:
        return {
            "replica": self.replica_id,
            "connected": self.connected,
            "errors": self.errors,
            "peers": {rid: {pod: list(c) for pod, c in counts.items()} for rid, counts in self.peers.items()},
        }
