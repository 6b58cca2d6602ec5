"""vLLM KV-cache events: one ZMQ subscriber per pod, feeding the index (the batches' wire
decoding is epp/datalayer/kv_event_batches.py).

The subscriber keeps the index exact across the stream's failure modes:

- gap (seq jumps): replay from the last seen seq + 1 through the ROUTER socket; if the
  replay cannot cover it (no replay socket, timeout, buffer too short) the pod is resynced:
  its entries dropped, marked approximate until fresh events arrive;
- restart (seq goes back, or the connection dropped and came back): the engine's cache is
  gone, so its entries are dropped and the stream is read again from seq 0;
- removal: the task is cancelled, its sockets closed and its entries dropped by the owner.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import zmq
import zmq.asyncio
from prometheus_client import CollectorRegistry, Counter, Gauge
from zmq.utils.monitor import parse_monitor_message

from epp.datalayer.endpoint_records import Endpoint
from epp.datalayer.kv_event_batches import EventBatch, KVEventError, apply_batch, decode_batch
from epp.datalayer.kv_index import KVIndex
from gateway.pool_config import KvEventsConfig
from gateway.supervise import spawn

log = logging.getLogger(__name__)

END_SEQ = -1
REPLAY_TIMEOUT_S = 2.0


# Called with (pod, batch) for every batch applied to the index.
BatchHook = Callable[[str, EventBatch], None]


# ---- metrics -------------------------------------------------------------------------------
class KVEventMetrics:
    """Prometheus series of the subscribers and the index, on the EPP's registry."""

    def __init__(self, registry: CollectorRegistry | None = None, index: KVIndex | None = None) -> None:
        r = registry
        if index is not None:
            Gauge(
                "gateway_kv_index_blocks", "(pod, block) entries in the precise KV index", registry=r
            ).set_function(index.size)
            Gauge("gateway_kv_index_max_blocks", "Bound of the precise KV index", registry=r).set_function(
                lambda: index.max_blocks
            )
            Gauge(
                "gateway_kv_index_host_blocks",
                "(pod, block) entries of the host-memory tier (KV events with medium CPU)",
                registry=r,
            ).set_function(index.host_size)
        self.batches = Counter("gateway_kv_event_batches", "KV event batches applied", ["pod"], registry=r)
        self.events = Counter("gateway_kv_events", "KV events applied", ["pod"], registry=r)
        self.gaps = Counter("gateway_kv_event_gaps", "Sequence gaps seen", ["pod"], registry=r)
        self.resyncs = Counter(
            "gateway_kv_event_resyncs",
            "Pod entries dropped because the stream could not be made whole, by reason",
            ["pod", "reason"],
            registry=r,
        )
        self.errors = Counter(
            "gateway_kv_event_decode_errors", "Payloads that are not KV event batches", ["pod"], registry=r
        )
        self.lag = Gauge(
            "gateway_kv_event_lag_seconds",
            "Wall time between a batch's engine timestamp and its application to the index",
            ["pod"],
            registry=r,
        )
        self.precise = Gauge(
            "gateway_kv_index_precise",
            "1 when the pod's KV state is event-fed and whole",
            ["pod"],
            registry=r,
        )

    def forget(self, pod: str) -> None:
        for metric in (self.batches, self.events, self.gaps, self.errors, self.lag, self.precise):
            with contextlib.suppress(KeyError):
                metric.remove(pod)
        for reason in ("start", "gap", "restart", "disconnect", "bad_batch"):
            with contextlib.suppress(KeyError):
                self.resyncs.remove(pod, reason)


# ---- the subscriber ------------------------------------------------------------------------
def _host(address: str) -> str:
    return address.rpartition(":")[0] or address


def model_from_topic(topic: bytes) -> str | None:
    """vLLM's documented topic form ``kv@<pod ip>@<model>`` names the model."""
    parts = topic.decode(errors="replace").split("@", 2)
    return parts[2] if len(parts) == 3 and parts[0] == "kv" and parts[2] else None


class KVEventSubscriber:
    """Subscribes to one pod's KV events and keeps its part of `index` exact."""

    def __init__(
        self,
        pod: str,
        model: str,
        index: KVIndex,
        port: int,
        replay_port: int | None = None,
        *,
        metrics: KVEventMetrics | None = None,
        context: zmq.asyncio.Context | None = None,
        replay_timeout_s: float = REPLAY_TIMEOUT_S,
        clock: Callable[[], float] = time.time,
        on_batch: BatchHook | None = None,
        on_restart: Callable[[str], None] | None = None,
    ) -> None:
        self.pod = pod
        self.on_batch = on_batch
        # The engine is a new process (seq went back) or may be (the connection came back).
        self.on_restart = on_restart
        self.index = index
        self.index.add_pod(pod, model)
        host = _host(pod)
        self.endpoint = f"tcp://{host}:{port}"
        self.replay_endpoint = f"tcp://{host}:{replay_port}" if replay_port else None
        self.metrics = metrics
        self._ctx = context or zmq.asyncio.Context.instance()
        self.replay_timeout_s = replay_timeout_s
        self._clock = clock
        self.last_seq: int | None = None  # last applied
        self._last_live: int | None = None  # last seq received on the PUB stream
        self.last_ts: float | None = None
        self.batches = 0
        self.resyncs = 0
        self._fresh_after_drop = False

    # -- state ----------------------------------------------------------------------------
    def _set_precise(self, precise: bool) -> None:
        self.index.set_precise(self.pod, precise)
        if self.metrics:
            self.metrics.precise.labels(self.pod).set(1 if precise else 0)

    def _drop(self, reason: str) -> None:
        """Forget this pod's blocks; approximate until the stream is whole again."""
        self.index.clear_pod(self.pod)
        self.resyncs += 1
        self._set_precise(False)
        if self.metrics:
            self.metrics.resyncs.labels(self.pod, reason).inc()
        log.info("KV index for %s resynced (%s)", self.pod, reason)

    def _apply(self, seq: int, payload: bytes, topic: bytes | None = None) -> None:
        try:
            batch = decode_batch(payload)
            used = apply_batch(self.index, self.pod, batch)
        except (KVEventError, OverflowError, TypeError) as exc:
            if self.metrics:
                self.metrics.errors.labels(self.pod).inc()
            log.warning("KV events from %s: bad batch seq %d: %s", self.pod, seq, exc)
            used, batch = 0, None
            # Whatever it held (removals too) is lost: resync rather than keep stale blocks.
            self._drop("bad_batch")
            self._fresh_after_drop = True
        self.last_seq = seq
        self.batches += 1
        if batch is not None:
            self.last_ts = batch.ts
            if seq == 0 or self._fresh_after_drop:
                # The whole stream from the engine's start, or fresh events after a resync.
                self._fresh_after_drop = False
                self._set_precise(True)
            if self.metrics:
                self.metrics.batches.labels(self.pod).inc()
                self.metrics.events.labels(self.pod).inc(used)
                self.metrics.lag.labels(self.pod).set(max(0.0, self._clock() - batch.ts))
            if self.on_batch is not None:
                self.on_batch(self.pod, batch)
        if topic:
            model = model_from_topic(topic)
            state = self.index.pod(self.pod)
            if model and state is not None and state.model != model:
                self.index.add_pod(self.pod, model)

    # -- replay ---------------------------------------------------------------------------
    async def _replay(self, start: int) -> int | None:
        """Apply buffered batches from ``start``; the first seq the publisher still had, or
        None when replay is unavailable or timed out."""
        if self.replay_endpoint is None:
            return None
        sock = self._ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.IPV6, 1)  # pods may have IPv6 addresses
        first: int | None = None
        try:
            # One deadline for the whole exchange: a DEALER send waits for a peer, so a pod
            # whose replay port is closed must not stall the subscriber.
            async with asyncio.timeout(self.replay_timeout_s):
                sock.connect(self.replay_endpoint)
                await sock.send_multipart((b"", start.to_bytes(8, "big")))
                while True:
                    frames = await sock.recv_multipart()
                    # (b"", topic, seq, payload) from vLLM 0.34 (make check-engines), or
                    # (b"", seq, payload) from older releases.
                    if len(frames) == 4:
                        _, topic, seq_bytes, payload = frames
                    elif len(frames) == 3:
                        (_, seq_bytes, payload), topic = frames, b""
                    else:
                        continue
                    if len(seq_bytes) != 8:
                        continue
                    seq = int.from_bytes(seq_bytes, "big", signed=True)
                    if seq == END_SEQ:
                        return first if first is not None else start
                    if first is None:
                        first = seq
                        if seq > start:
                            return seq  # the buffer no longer reaches back to start
                    if self.last_seq is None or seq > self.last_seq:
                        self._apply(seq, payload, topic)
        except TimeoutError:
            log.warning("KV event replay from %s timed out", self.replay_endpoint)
            return None
        finally:
            sock.close(linger=0)

    async def _catch_up(self, start: int, reason: str) -> None:
        """Make the stream whole from ``start`` or resync; always ends with a usable state."""
        first = await self._replay(start)
        if first == start:
            if start == 0:
                self._set_precise(True)
            return
        # Replay could not cover the missing range: what the index holds for this pod may
        # be wrong (missed removals), so drop it; fresh events make it precise again.
        self._drop(reason)
        self._fresh_after_drop = True
        if first is not None:  # the buffer's tail is still worth having
            await self._replay(first)

    # -- the loop -------------------------------------------------------------------------
    async def run(self) -> None:
        """Subscribe until cancelled; supervised by the owner (a crash restarts it)."""
        sub = self._ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.IPV6, 1)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.setsockopt(zmq.RECONNECT_IVL, 100)
        sub.setsockopt(zmq.RECONNECT_IVL_MAX, 2000)
        monitor = sub.get_monitor_socket(zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED)
        self._fresh_after_drop = False
        # A restarted task knows nothing of what it missed: start from a clean slate.
        self.index.clear_pod(self.pod)
        self.last_seq = self._last_live = None
        self._set_precise(False)
        try:
            sub.connect(self.endpoint)
            poller = zmq.asyncio.Poller()
            poller.register(sub, zmq.POLLIN)
            poller.register(monitor, zmq.POLLIN)
            connected_once = False
            while True:
                ready = dict(await poller.poll())
                if monitor in ready:
                    event = parse_monitor_message(await monitor.recv_multipart())
                    if event["event"] == zmq.EVENT_CONNECTED:
                        if connected_once and self.last_seq is not None:
                            # Same process after a blip, or a restarted one: cannot tell, so
                            # read the stream again from 0 (precise again if the buffer has it).
                            self._drop("disconnect")
                            self.last_seq = self._last_live = None
                            if self.on_restart is not None:
                                self.on_restart(self.pod)  # the replay from 0 re-feeds it
                        connected_once = True
                        if self.last_seq is None:
                            await self._catch_up(0, "start")
                if sub in ready:
                    await self._on_live(await sub.recv_multipart())
        finally:
            sub.disable_monitor()
            monitor.close(linger=0)
            sub.close(linger=0)

    async def _on_live(self, frames: list[bytes]) -> None:
        if len(frames) != 3 or len(frames[1]) != 8:
            if self.metrics:
                self.metrics.errors.labels(self.pod).inc()
            return
        topic, seq_bytes, payload = frames
        seq = int.from_bytes(seq_bytes, "big")
        if self._last_live is not None and seq <= self._last_live:
            # The live stream of one process only goes up: this is a new process.
            self._drop("restart")
            self.last_seq = None
            if self.on_restart is not None:
                self.on_restart(self.pod)
        self._last_live = seq
        if self.last_seq is not None and seq <= self.last_seq:
            return  # already applied through replay
        expected = 0 if self.last_seq is None else self.last_seq + 1
        if seq != expected:
            if self.metrics:
                self.metrics.gaps.labels(self.pod).inc()
            await self._catch_up(expected, "gap")
            if self.last_seq is not None and seq <= self.last_seq:
                return
        self._apply(seq, payload, topic)


# ---- one subscriber per pod ----------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class _Target:
    port: int
    replay_port: int | None
    model: str


class KVEventSubscribers:
    """Keeps one supervised subscriber task per discovered pod that publishes KV events."""

    def __init__(
        self,
        index: KVIndex,
        metrics: KVEventMetrics | None = None,
        *,
        context: zmq.asyncio.Context | None = None,
        replay_timeout_s: float = REPLAY_TIMEOUT_S,
        on_batch: BatchHook | None = None,
        on_restart: Callable[[str], None] | None = None,
    ) -> None:
        """`on_batch`: also given every applied batch (adapter residency reads its LoRA ids);
        `on_restart`: given a pod whose engine restarted, or may have (a reconnect), before
        its stream is read again from seq 0."""
        self.index = index
        self.metrics = metrics
        self.on_batch = on_batch
        self.on_restart = on_restart
        self._ctx = context
        self._replay_timeout_s = replay_timeout_s
        self._subs: dict[str, tuple[_Target, KVEventSubscriber, asyncio.Task[None]]] = {}
        self._without: list[str] = []  # pods of the pool that publish no events

    @staticmethod
    def targets(endpoints: Iterable[Endpoint], pool: KvEventsConfig | None) -> dict[str, _Target]:
        """Pods to subscribe to: a port from the endpoint (annotation) or the pool's kvEvents."""
        out: dict[str, _Target] = {}
        for ep in endpoints:
            port = ep.kv_events_port or (pool.port if pool else None)
            if not port:
                continue
            replay = ep.kv_replay_port or (pool.replay_port if pool else None)
            out[ep.address] = _Target(port, replay, min(ep.models) if ep.models else "")
        return out

    def _precise_lost(self, address: str, _exc: BaseException) -> None:
        self.index.set_precise(address, False)

    def sync(self, endpoints: Iterable[Endpoint], pool: KvEventsConfig | None) -> None:
        """Start subscribers for new pods, stop (and forget) those of removed ones.

        RuntimeError without a running loop (the owner syncs again once started)."""
        endpoints = list(endpoints)
        wanted = self.targets(endpoints, pool)
        self._without = sorted(ep.address for ep in endpoints if ep.address not in wanted)
        for address in [a for a, (t, _, _) in self._subs.items() if wanted.get(a) != t]:
            self._remove(address)
        if any(a not in self._subs for a in wanted):
            asyncio.get_running_loop()
        for address, target in wanted.items():
            if address in self._subs:
                continue
            sub = KVEventSubscriber(
                address,
                target.model,
                self.index,
                target.port,
                target.replay_port,
                metrics=self.metrics,
                context=self._ctx,
                replay_timeout_s=self._replay_timeout_s,
                on_batch=self.on_batch,
                on_restart=self.on_restart,
            )
            task = spawn(
                "kv-events",
                f"kv events {address}",
                sub.run,
                on_failure=functools.partial(self._precise_lost, address),
            )
            self._subs[address] = (target, sub, task)

    def _remove(self, address: str) -> None:
        _, _, task = self._subs.pop(address)
        task.cancel()  # the subscriber's finally closes its sockets
        self.index.remove_pod(address)
        if self.metrics:
            self.metrics.forget(address)

    def subscriber(self, address: str) -> KVEventSubscriber | None:
        entry = self._subs.get(address)
        return entry[1] if entry else None

    async def stop(self) -> None:
        tasks = [task for _, _, task in self._subs.values()]
        for address in list(self._subs):
            self._remove(address)
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def debug(self) -> dict[str, Any]:
        """For /debug/pool: which pods have precise state, which fall back to the approximate."""
        pods: dict[str, Any] = {}
        now = time.time()
        for address, (target, sub, task) in self._subs.items():
            state = self.index.pod(address)
            pods[address] = {
                "endpoint": sub.endpoint,
                "replay_endpoint": sub.replay_endpoint,
                "model": state.model if state else target.model,
                "precise": bool(state and state.precise),
                "blocks": len(state.engine_keys) if state else 0,
                "unanchored_blocks": state.unanchored if state else 0,
                "last_seq": sub.last_seq,
                "lag_s": None if sub.last_ts is None else round(max(0.0, now - sub.last_ts), 4),
                "resyncs": sub.resyncs,
                "running": not task.done(),
            }
        return {
            "index_blocks": self.index.size(),
            "index_max_blocks": self.index.max_blocks,
            "precise": sorted(a for a, p in pods.items() if p["precise"]),
            "approximate": sorted(a for a, p in pods.items() if not p["precise"]),
            "no_events": list(self._without),  # these use the routing-history prefix index only
            "pods": pods,
        }
