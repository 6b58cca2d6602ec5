"""What the EPP replicas' shared-state loop sends to and reads from Redis: the one Lua script
of the round trip and the encoding of its arguments and replies. Pure; the loop itself is
epp/datalayer/shared_state.py.
"""

from __future__ import annotations

from collections.abc import Callable, Container, Sequence
from dataclasses import dataclass
from typing import Any

import msgpack

from epp.datalayer.endpoint_records import Metrics
from epp.datalayer.prefix_index import PrefixIndex
from epp.datalayer.session_memory import SessionMemory

_NOT_OURS = (ValueError, TypeError, KeyError, msgpack.UnpackException)

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
ROUND_TRIP_SCRIPT = """
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


@dataclass(frozen=True)
class PoolKeys:
    """A pool's keys, all under one hash tag (`{pool}`) so the script stays in one Redis
    Cluster slot, and the script's calling convention over them (KEYS and ARGV above)."""

    replicas: str  # the set of live replicas
    inflight_prefix: str  # + a replica's id: its hash
    stream: str  # the routing decisions
    channel: str  # the pushed picks

    @classmethod
    def of(cls, key_prefix: str, pool_name: str) -> PoolKeys:
        tag = f"{key_prefix}:{{{pool_name}}}"
        return cls(f"{tag}:replicas", f"{tag}:inflight:", f"{tag}:prefix", f"{tag}:picks")

    def round_trip(
        self, replica_id: str, last_id: str, ttl_ms: int, stream_max_len: int, out: Outgoing
    ) -> tuple[list[bytes], list[bytes]]:
        """The script's KEYS and ARGV for one round trip."""
        args = [b"%d" % ttl_ms, replica_id.encode(), self.inflight_prefix.encode(), last_id.encode()]
        args += (out.decisions, b"%d" % stream_max_len, b"1" if out.reading else b"0")
        args += (out.counts, out.scrapes, self.channel.encode(), out.picks)
        keys = [k.encode() for k in (self.replicas, self.inflight_prefix + replica_id, self.stream)]
        return keys, args


def as_text(value: bytes | str) -> str:
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
        pod, _, adapter = as_text(key).partition("/")
        if adapter:
            out.setdefault(pod, {})[adapter] = int(requests)
    return out


def parse_totals(flat: list[Any]) -> dict[str, tuple[int, int]]:
    """The script's summed counts (pod, requests, tokens, ...) -> pod -> (requests, tokens)."""
    it = iter(flat)
    return {pod.decode(): (requests, tokens) for pod, requests, tokens in zip(it, it, it, strict=False)}


def memory_decision(hashes: Sequence[int], per: float, prompt_tokens: float, output: float) -> dict[str, Any]:
    """A KV-memory routing as it travels beside the prefix hashes on the decision stream: a map,
    which a replica that predates it reads as no hashes (it learns nothing from it)."""
    return {"cp": list(hashes), "per": per, "p": prompt_tokens, "o": output}


def learn_decisions(
    blobs: list[bytes], known: Container[str], index: PrefixIndex, memory: SessionMemory | None
) -> tuple[int, int]:
    """Teach the prefix index and the KV memory the other replicas' routing decisions (stream
    entries) for the pods in `known`: (decisions learned, entries that are not ours)."""
    learned = bad = 0
    for blob in blobs:
        try:
            for address, hashes in msgpack.unpackb(blob):
                if not isinstance(address, str) or address not in known:
                    continue
                if not isinstance(hashes, dict):
                    index.learn(address, [h for h in hashes if isinstance(h, int)])
                elif memory is not None:
                    cps = tuple(h for h in hashes["cp"] if isinstance(h, int))
                    memory.learn(address, cps, float(hashes["per"]), float(hashes["p"]), float(hashes["o"]))
                learned += 1
        except _NOT_OURS:  # not ours: skip the entry
            bad += 1
    return learned, bad


def apply_scrapes(
    blobs: list[bytes],
    now: tuple[float, float],
    known: Container[str],
    apply: Callable[[str, Metrics, float], None],
) -> tuple[int, int]:
    """Hand the other replicas' scrapes (stream entries, oldest first) of the pods in `known` to
    `apply`, on this replica's clocks `now` (wall, monotonic): (applied, entries not ours)."""
    applied = bad = 0
    for blob in blobs:
        try:
            decoded = [decode_scrape(entry, *now) for entry in msgpack.unpackb(blob)]
        except _NOT_OURS:
            bad += 1
            continue
        for address, metrics, sent_at in decoded:
            if address in known:
                apply(address, metrics, sent_at)
                applied += 1
    return applied, bad
