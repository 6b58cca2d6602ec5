"""KV-cache events published the way vLLM publishes them (``--kv-events-config``).

Wire format (vLLM ``vllm/distributed/kv_events.py``, as of the map-encoded events):

- a ZMQ PUB socket sends multipart ``(topic, seq as 8-byte big-endian, payload)``, one
  message per engine step that changed the prefix cache; ``seq`` counts from 0 per process;
- ``payload`` is a msgpack map ``{"ts": float, "events": [...], "data_parallel_rank": int}``;
  each event is a map tagged by ``"type"`` (``BlockStored``, ``BlockRemoved``,
  ``AllBlocksCleared``) whose fields follow vLLM's struct order, defaulted fields omitted;
- an optional ROUTER socket replays the last ``buffer_steps`` batches: a client sends the
  start seq (8 bytes big-endian) and gets ``(seq, payload)`` frames, then ``(-1, b"")``.

The encoder is plain ``msgpack`` (not msgspec), so the msgspec-built fixtures of the tests
check it independently. Only loopback or explicitly configured endpoints are bound.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any

import msgpack
import zmq
import zmq.asyncio

log = logging.getLogger(__name__)

END_SEQ = (-1).to_bytes(8, "big", signed=True)
MEDIUM_GPU = "GPU"


class KVEventsConfigError(ValueError):
    """The ``--kv-events-config`` JSON is invalid."""


@dataclass(frozen=True)
class KVEventsConfig:
    """vLLM's ``KVEventsConfig`` fields; ``publisher`` defaults to zmq when events are on."""

    enable_kv_cache_events: bool = False
    publisher: str | None = None
    endpoint: str = "tcp://*:5557"
    replay_endpoint: str | None = None
    buffer_steps: int = 10_000
    hwm: int = 100_000
    max_queue_size: int = 100_000
    topic: str = ""

    @classmethod
    def parse(cls, raw: str | dict[str, Any] | None) -> KVEventsConfig | None:
        """The config from JSON text or a mapping; None when events are off."""
        if raw is None:
            return None
        if isinstance(raw, str):
            try:
                raw = json.loads(raw)
            except json.JSONDecodeError as exc:
                raise KVEventsConfigError(f"kv-events-config is not JSON: {exc.msg}") from None
        if not isinstance(raw, dict):
            raise KVEventsConfigError("kv-events-config must be a JSON object")
        known = {f.name for f in fields(cls)}
        unknown = set(raw) - known
        if unknown:
            raise KVEventsConfigError(f"kv-events-config: unknown fields {sorted(unknown)}")
        try:
            cfg = cls(**raw)
        except TypeError as exc:
            raise KVEventsConfigError(f"kv-events-config: {exc}") from None
        for name in ("buffer_steps", "hwm", "max_queue_size"):
            value = getattr(cfg, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise KVEventsConfigError(f"kv-events-config: {name} must be an integer >= 1")
        for name in ("endpoint", "topic"):
            if not isinstance(getattr(cfg, name), str):
                raise KVEventsConfigError(f"kv-events-config: {name} must be a string")
        if cfg.replay_endpoint is not None and not isinstance(cfg.replay_endpoint, str):
            raise KVEventsConfigError("kv-events-config: replay_endpoint must be a string")
        publisher = cfg.publisher or ("zmq" if cfg.enable_kv_cache_events else "null")
        if publisher not in ("zmq", "null"):
            raise KVEventsConfigError(f"kv-events-config: unknown publisher {publisher!r}")
        if not cfg.enable_kv_cache_events or publisher == "null":
            return None
        return cfg

    def offset(self, rank: int) -> KVEventsConfig:
        """Ports shifted by ``rank``, as vLLM does per data-parallel rank (here: per replica)."""
        if rank == 0:
            return self
        return KVEventsConfig(
            **{
                **{f.name: getattr(self, f.name) for f in fields(self)},
                "endpoint": offset_endpoint(self.endpoint, rank),
                "replay_endpoint": offset_endpoint(self.replay_endpoint, rank),
            }
        )


def offset_endpoint(endpoint: str | None, rank: int) -> str | None:
    """``tcp://host:5557`` -> ``tcp://host:5557+rank``; a port 0 / ``*`` stays ephemeral."""
    if not endpoint or rank == 0 or not endpoint.startswith("tcp://"):
        return endpoint
    base, _, port = endpoint.rpartition(":")
    if not port.isdigit() or int(port) == 0:
        return endpoint
    return f"{base}:{int(port) + rank}"


def _bind_address(endpoint: str) -> str:
    """A ``tcp://host:0`` endpoint becomes ZMQ's ephemeral-port form ``tcp://host:*``."""
    if endpoint.startswith("tcp://") and endpoint.endswith(":0"):
        return endpoint[:-2] + ":*"
    return endpoint


async def _bind(sock: zmq.Socket, endpoint: str, attempts: int = 40) -> None:
    """Bind, retrying briefly: ZMQ closes sockets in its I/O thread, so the port of a socket
    closed a moment ago (a restarted engine) may still be taken."""
    for attempt in range(attempts):
        try:
            sock.bind(endpoint)
            return
        except zmq.ZMQError as exc:
            if exc.errno != zmq.EADDRINUSE or attempt == attempts - 1:
                sock.close(linger=0)
                raise
            await asyncio.sleep(0.05)


def _bound_port(sock: zmq.Socket) -> int:
    last = sock.getsockopt(zmq.LAST_ENDPOINT)
    text = last.decode() if isinstance(last, bytes) else str(last)
    return int(text.rpartition(":")[2]) if text.startswith("tcp://") else 0


# ---- events as vLLM's structs encode them (map form, tag under "type") ---------------------
def block_stored(
    hashes: Sequence[int],
    parent: int | None,
    token_ids: Sequence[int],
    block_size: int,
    lora_name: str | None,
) -> dict[str, Any]:
    """A ``BlockStored``: fields in vLLM's order; ``lora_id`` (deprecated) is None here."""
    return {
        "type": "BlockStored",
        "block_hashes": list(hashes),
        "parent_block_hash": parent,
        "token_ids": list(token_ids),
        "block_size": block_size,
        "lora_id": None,
        "medium": MEDIUM_GPU,
        "lora_name": lora_name,
        "extra_keys": [(lora_name,) if lora_name else None for _ in hashes],
        "group_idx": 0,
    }


def block_removed(hashes: Sequence[int]) -> dict[str, Any]:
    return {"type": "BlockRemoved", "block_hashes": list(hashes), "medium": MEDIUM_GPU, "group_idx": 0}


def all_blocks_cleared() -> dict[str, Any]:
    return {"type": "AllBlocksCleared"}


def encode_batch(ts: float, events: Sequence[dict[str, Any]], data_parallel_rank: int = 0) -> bytes:
    return msgpack.packb({"ts": ts, "events": list(events), "data_parallel_rank": data_parallel_rank})


class KVEventPublisher:
    """One engine's PUB socket, replay ROUTER socket and bounded replay buffer.

    ``publish`` is synchronous and never blocks (ZMQ drops at the high-water mark, as in
    vLLM); the replay socket is served by one asyncio task. Ports chosen at the first
    ``start`` are kept, so a restarted engine publishes on the same ports with seq from 0.
    """

    def __init__(self, config: KVEventsConfig, data_parallel_rank: int = 0) -> None:
        self.config = config
        self.rank = data_parallel_rank
        self._ctx = zmq.asyncio.Context.instance()
        self._pub: zmq.asyncio.Socket | None = None
        self._replay: zmq.asyncio.Socket | None = None
        self._task: asyncio.Task[None] | None = None
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=config.buffer_steps)
        self._topic = config.topic.encode()
        self.seq = 0
        self.port = 0
        self.replay_port = 0
        self.dropped = 0

    async def start(self) -> None:
        """Bind the sockets (again, after ``close``) and start serving replay requests."""
        self._buffer.clear()
        self.seq = 0
        pub = self._ctx.socket(zmq.PUB)
        pub.setsockopt(zmq.LINGER, 0)
        pub.set_hwm(self.config.hwm)
        await _bind(pub, self._endpoint(self.config.endpoint, self.port))
        self._pub, self.port = pub, _bound_port(pub)
        if self.config.replay_endpoint is not None:
            replay = self._ctx.socket(zmq.ROUTER)
            replay.setsockopt(zmq.LINGER, 0)
            await _bind(replay, self._endpoint(self.config.replay_endpoint, self.replay_port))
            self._replay, self.replay_port = replay, _bound_port(replay)
            self._task = asyncio.get_running_loop().create_task(self._serve_replay(), name="kv-replay")

    @staticmethod
    def _endpoint(endpoint: str, kept_port: int) -> str:
        if kept_port and endpoint.startswith("tcp://"):
            return f"{endpoint.rpartition(':')[0]}:{kept_port}"
        return _bind_address(endpoint)

    def publish(self, events: Sequence[dict[str, Any]]) -> None:
        if self._pub is None or not events:
            return
        payload = encode_batch(time.time(), events, self.rank)
        seq = self.seq
        self.seq += 1
        self._buffer.append((seq, payload))
        try:
            self._pub.send_multipart((self._topic, seq.to_bytes(8, "big"), payload), flags=zmq.NOBLOCK)
        except zmq.Again:
            self.dropped += 1

    async def _serve_replay(self) -> None:
        assert self._replay is not None
        sock = self._replay
        while True:
            frames = await sock.recv_multipart()
            try:
                if len(frames) != 3 or len(frames[2]) != 8:
                    log.warning("invalid KV-event replay request (%d frames)", len(frames))
                    continue
                client, _, start = frames
                start_seq = int.from_bytes(start, "big")
                for seq, payload in list(self._buffer):
                    if seq >= start_seq:
                        # vLLM 0.34's reply: (topic, seq, payload) behind the envelope.
                        await sock.send_multipart((client, b"", self._topic, seq.to_bytes(8, "big"), payload))
                await sock.send_multipart((client, b"", b"", END_SEQ, b""))
            except Exception as exc:  # one bad request or vanished client must not stop the service
                log.warning("KV-event replay failed: %s", exc, exc_info=exc)

    def close(self) -> None:
        """Close both sockets now (subscribers see the disconnect, as when vLLM exits)."""
        if self._task is not None:
            self._task.cancel()
            self._task = None
        for sock in (self._pub, self._replay):
            if sock is not None:
                sock.close(linger=0)
        self._pub = self._replay = None
