"""The scrape loop: one asyncio task per pod polling its Prometheus `/metrics`.

Each pod has its own cadence (default 50 ms) so a slow pod never delays the others. A
failed scrape (timeout, refused, garbage) counts against the pod; after a few in a row it is
reported unhealthy and the scheduler stops choosing it until a scrape succeeds again. The
interval backs off on failure so a dead pod costs little.

Observed speed comes for free from the server's own latency histograms: the change of
`_sum / _count` between scrapes is the mean TTFT and inter-token latency of the requests that
finished meanwhile. That is what lets the scheduler tell an H100 from an A10G without any
per-chunk response events through Envoy (which cost a gRPC round trip per SSE chunk).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass

import httpx

from epp.engines import MetricsParseError, find_samples, parse_metrics
from epp.pool import Endpoint, Pool

log = logging.getLogger(__name__)

# Histograms whose mean over a scrape interval gives per-pod speed, per dialect.
SPEED_HISTOGRAMS: dict[str, tuple[str, str]] = {
    "vllm": ("vllm:time_to_first_token_seconds", "vllm:inter_token_latency_seconds"),
    "sglang": ("sglang:time_to_first_token_seconds", "sglang:inter_token_latency_seconds"),
}
MAX_BACKOFF_S = 2.0


@dataclass
class _Totals:
    sum: float
    count: float


def _histogram_totals(text: str, name: str) -> _Totals | None:
    total_sum = sum(s.value for s in find_samples(text, name + "_sum"))
    total_count = sum(s.value for s in find_samples(text, name + "_count"))
    if total_count == 0 and total_sum == 0:
        return None
    return _Totals(total_sum, total_count)


class SpeedTracker:
    """Turns cumulative histogram totals into the mean of the latest interval."""

    def __init__(self) -> None:
        self._last: dict[str, _Totals] = {}

    def mean_since_last(self, key: str, totals: _Totals | None) -> float | None:
        if totals is None:
            return None
        previous = self._last.get(key)
        self._last[key] = totals
        if previous is None or totals.count < previous.count:  # first sight or server restart
            return None
        d_count = totals.count - previous.count
        if d_count <= 0:
            return None
        return max(0.0, (totals.sum - previous.sum) / d_count)


class Scraper:
    def __init__(
        self,
        pool: Pool,
        *,
        interval_s: float = 0.05,
        timeout_s: float = 0.5,
        client: httpx.AsyncClient | None = None,
    ) -> None:
        self.pool = pool
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self._client = client or httpx.AsyncClient(
            timeout=timeout_s, limits=httpx.Limits(max_connections=256, max_keepalive_connections=256)
        )
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self.scrapes = 0
        self.failures = 0

    def sync(self) -> None:
        """Start a loop for every endpoint in the pool, stop loops of endpoints that left."""
        current = {ep.address: ep for ep in self.pool.endpoints()}
        for address in list(self._tasks):
            if address not in current:
                self._tasks.pop(address).cancel()
        for address, ep in current.items():
            if address not in self._tasks:
                self._tasks[address] = asyncio.create_task(self._loop(ep), name=f"scrape {address}")

    async def stop(self) -> None:
        for task in self._tasks.values():
            task.cancel()
        for task in self._tasks.values():
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()
        await self._client.aclose()

    async def scrape_once(self, ep: Endpoint, speed: SpeedTracker) -> bool:
        url = ep.metrics_url or f"http://{ep.address}/metrics"
        try:
            response = await self._client.get(url, timeout=self.timeout_s)
            response.raise_for_status()
            text = response.text
            metrics = parse_metrics(text, ep.engine, time.monotonic())
        except (httpx.HTTPError, MetricsParseError, ValueError) as exc:
            self.failures += 1
            self.pool.record_scrape_failure(ep.address)
            log.debug("scrape of %s failed: %s", ep.address, exc)
            return False
        self.scrapes += 1
        self.pool.record_metrics(ep.address, metrics)
        names = SPEED_HISTOGRAMS.get(ep.engine)
        if names:
            ttft = speed.mean_since_last("ttft", _histogram_totals(text, names[0]))
            tpot = speed.mean_since_last("tpot", _histogram_totals(text, names[1]))
            if ttft is not None or tpot is not None:
                self.pool.observe_speed(ep.address, ttft=ttft, tpot=tpot)
        return True

    async def _loop(self, ep: Endpoint) -> None:
        speed = SpeedTracker()
        delay = self.interval_s
        while True:
            started = time.monotonic()
            ok = await self.scrape_once(ep, speed)
            delay = self.interval_s if ok else min(MAX_BACKOFF_S, max(delay * 2, self.interval_s))
            await asyncio.sleep(max(0.0, delay - (time.monotonic() - started)))
