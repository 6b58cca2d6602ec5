"""Endpoints of one pool and their live state.

Two layers: immutable records (`Endpoint`, `Metrics`, `EndpointState`, `PoolSnapshot`) that
scheduling reads, and `Pool`, the one mutable owner that the edges (discovery, scraper,
ext_proc servicer) update. One asyncio loop per process owns a `Pool`: no locks.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

# Weight of the newest sample in the smoothed per-pod speed figures.
SPEED_EWMA_ALPHA = 0.2


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One model-server pod as discovery sees it."""

    address: str  # "ip:port", exactly what goes into x-gateway-destination-endpoint
    models: frozenset[str]  # base models served
    adapters: frozenset[str] = frozenset()  # LoRA adapters it can load
    engine: str = "vllm"  # metric dialect: vllm | sglang | tgi | trtllm
    labels: Mapping[str, str] = field(default_factory=dict)
    metrics_url: str | None = None  # defaults to http://{address}/metrics

    def serves(self, model: str, adapter: str | None) -> bool:
        if model not in self.models:
            return False
        return adapter is None or not self.adapters or adapter in self.adapters


@dataclass(frozen=True, slots=True)
class Metrics:
    """What one scrape of a pod says, normalised across engine dialects."""

    waiting: float = 0.0
    running: float = 0.0
    kv_usage: float = 0.0  # 0..1
    running_adapters: frozenset[str] = frozenset()
    waiting_adapters: frozenset[str] = frozenset()
    max_lora: int = 0
    block_size: int | None = None  # tokens per KV block, when the server reports it
    num_gpu_blocks: int | None = None
    scraped_at: float = 0.0  # time.monotonic() of the scrape


@dataclass(frozen=True, slots=True)
class EndpointState:
    """One pod as the scheduler sees it at one instant."""

    endpoint: Endpoint
    metrics: Metrics | None  # None until the first successful scrape
    metrics_age: float  # seconds since the last successful scrape (inf if never)
    inflight_requests: int = 0  # routed by this EPP and not finished
    inflight_tokens: int = 0  # their estimated prompt+output tokens
    ttft_ewma: float | None = None  # smoothed observed time to first byte, seconds
    tpot_ewma: float | None = None  # smoothed observed time per output token, seconds
    healthy: bool = True  # False after repeated scrape failures

    @property
    def address(self) -> str:
        return self.endpoint.address


@dataclass(frozen=True, slots=True)
class PoolSnapshot:
    """Immutable view of the whole pool for one scheduling decision."""

    endpoints: tuple[EndpointState, ...]
    taken_at: float

    def by_address(self) -> dict[str, EndpointState]:
        return {e.address: e for e in self.endpoints}


@dataclass(slots=True)
class _Live:
    endpoint: Endpoint
    metrics: Metrics | None = None
    inflight_requests: int = 0
    inflight_tokens: int = 0
    ttft_ewma: float | None = None
    tpot_ewma: float | None = None
    failures: int = 0


def _ewma(old: float | None, sample: float) -> float:
    return sample if old is None else old + SPEED_EWMA_ALPHA * (sample - old)


class Pool:
    """The mutable state of one pool: endpoints, scraped metrics, in-flight accounting."""

    def __init__(self, endpoints: Iterable[Endpoint] = (), *, unhealthy_after: int = 3) -> None:
        self._live: dict[str, _Live] = {}
        self._unhealthy_after = unhealthy_after
        self.set_endpoints(endpoints)

    # -- discovery edge -------------------------------------------------------------
    def set_endpoints(self, endpoints: Iterable[Endpoint]) -> None:
        """Replace the endpoint set, keeping state (metrics, in-flight) of pods that stay."""
        fresh: dict[str, _Live] = {}
        for ep in endpoints:
            old = self._live.get(ep.address)
            if old is None:
                fresh[ep.address] = _Live(ep)
            else:
                old.endpoint = ep
                fresh[ep.address] = old
        self._live = fresh

    def endpoints(self) -> list[Endpoint]:
        return [live.endpoint for live in self._live.values()]

    def __contains__(self, address: object) -> bool:
        return address in self._live

    # -- scraper edge ---------------------------------------------------------------
    def record_metrics(self, address: str, metrics: Metrics) -> None:
        live = self._live.get(address)
        if live is not None:
            live.metrics = metrics
            live.failures = 0

    def record_scrape_failure(self, address: str) -> None:
        live = self._live.get(address)
        if live is not None:
            live.failures += 1

    # -- request accounting edge ----------------------------------------------------
    def on_routed(self, address: str, tokens: int) -> None:
        live = self._live.get(address)
        if live is not None:
            live.inflight_requests += 1
            live.inflight_tokens += tokens

    def on_finished(self, address: str, tokens: int) -> None:
        """Undo `on_routed`; callers guarantee exactly one call per routed request."""
        live = self._live.get(address)
        if live is not None:
            live.inflight_requests = max(0, live.inflight_requests - 1)
            live.inflight_tokens = max(0, live.inflight_tokens - tokens)

    def observe_speed(self, address: str, *, ttft: float | None = None, tpot: float | None = None) -> None:
        live = self._live.get(address)
        if live is None:
            return
        if ttft is not None:
            live.ttft_ewma = _ewma(live.ttft_ewma, ttft)
        if tpot is not None:
            live.tpot_ewma = _ewma(live.tpot_ewma, tpot)

    def inflight_total(self) -> int:
        return sum(live.inflight_requests for live in self._live.values())

    # -- scheduling edge ------------------------------------------------------------
    def snapshot(self, now: float | None = None) -> PoolSnapshot:
        now = time.monotonic() if now is None else now
        states = tuple(
            EndpointState(
                endpoint=live.endpoint,
                metrics=live.metrics,
                metrics_age=(now - live.metrics.scraped_at) if live.metrics else float("inf"),
                inflight_requests=live.inflight_requests,
                inflight_tokens=live.inflight_tokens,
                ttft_ewma=live.ttft_ewma,
                tpot_ewma=live.tpot_ewma,
                healthy=live.failures < self._unhealthy_after,
            )
            for live in self._live.values()
        )
        return PoolSnapshot(endpoints=states, taken_at=now)


def with_metrics(state: EndpointState, **changes: object) -> EndpointState:
    """Copy of a state with some metric fields changed (tests, oracle, what-if scoring)."""
    base = state.metrics or Metrics()
    return replace(state, metrics=replace(base, **changes))  # type: ignore[arg-type]
