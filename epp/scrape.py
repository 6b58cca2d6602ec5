"""The scrape loop: one asyncio task per pod polling its Prometheus `/metrics`.

Each pod has its own cadence (default 50 ms) so a slow pod never delays the others. A
failed scrape (timeout, refused, garbage) counts against the pod; after a few in a row it is
reported unhealthy and the scheduler stops choosing it until a scrape succeeds again. The
interval backs off on failure so a dead pod costs little.

Observed speed comes for free from the server's own latency histograms: the change of
`_sum / _count` between scrapes is the mean TTFT and inter-token latency of the requests that
finished meanwhile. That is what lets the scheduler tell an H100 from an A10G without any
per-chunk response events through Envoy (which cost a gRPC round trip per SSE chunk).

Each pod's loop runs under `gateway.supervise`: an exception the loop does not expect
(anything but a failed or unparsable scrape) is logged with its traceback, counted, marks
the pod unhealthy and restarts the loop after a backoff, so a scrape task never dies
silently and the pod is never stuck looking healthy. Values the parser rejects (NaN, Inf,
negative, out of range) are counted per pod, field and reason, and logged at most once per
`REJECTION_LOG_INTERVAL_S` per pod, field and reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import math
import time
from dataclasses import dataclass

import httpx

from epp.engines import MetricsParseError, Rejection, find_samples, parse_metrics
from epp.pool import Endpoint, Pool, count_problem
from epp.telemetry import Telemetry
from gateway.supervise import Backoff, spawn

log = logging.getLogger(__name__)

# Histograms whose mean over a scrape interval gives per-pod speed, per dialect.
SPEED_HISTOGRAMS: dict[str, tuple[str, str]] = {
    "vllm": ("vllm:time_to_first_token_seconds", "vllm:inter_token_latency_seconds"),
    "sglang": ("sglang:time_to_first_token_seconds", "sglang:inter_token_latency_seconds"),
}
MAX_BACKOFF_S = 2.0
# Restarts of a crashed scrape loop: quick at first, never slower than this.
RESTART_BACKOFF = Backoff(initial_s=0.1, max_s=5.0)
REJECTION_LOG_INTERVAL_S = 60.0


@dataclass
class _Totals:
    sum: float
    count: float


def _histogram_totals(text: str, name: str, field: str, rejected: list[Rejection]) -> _Totals | None:
    """Cumulative sum and count over the histogram's series; None when absent or not sane."""
    try:
        sums = [s.value for s in find_samples(text, name + "_sum")]
        counts = [s.value for s in find_samples(text, name + "_count")]
    except MetricsParseError as exc:
        rejected.append(Rejection(field, "malformed", str(exc)[:64]))
        return None
    for value in (*sums, *counts):
        problem = count_problem(value)
        if problem:
            rejected.append(Rejection(field, problem, str(value)))
            return None
    total_sum, total_count = math.fsum(sums), math.fsum(counts)  # each <= MAX_COUNT: no overflow
    if total_count == 0 and total_sum == 0:
        return None
    return _Totals(total_sum, total_count)


class RejectionReporter:
    """Counts rejected values per pod/field/reason and logs each kind at a bounded rate."""

    def __init__(self, telemetry: Telemetry | None, interval_s: float = REJECTION_LOG_INTERVAL_S) -> None:
        self._telemetry = telemetry
        self._interval_s = interval_s
        self._last_log: dict[tuple[str, str, str], tuple[float, int]] = {}  # -> (logged at, suppressed)
        self.total = 0

    def report(self, address: str, rejected: list[Rejection], now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        for r in rejected:
            self.total += 1
            if self._telemetry is not None:
                self._telemetry.value_rejected(address, r.field, r.reason)
            key = (address, r.field, r.reason)
            last = self._last_log.get(key)
            if last is None or now - last[0] >= self._interval_s:
                more = f" ({last[1]} more since the last report)" if last and last[1] else ""
                log.warning(
                    "pod %s: %s value %s rejected (%s), treated as unknown%s",
                    address, r.field, r.value, r.reason, more,
                )  # fmt: skip
                self._last_log[key] = (now, 0)
            else:
                self._last_log[key] = (last[0], last[1] + 1)

    def forget(self, address: str) -> None:
        for key in [k for k in self._last_log if k[0] == address]:
            del self._last_log[key]
        if self._telemetry is not None:
            self._telemetry.forget_endpoint(address)


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
        telemetry: Telemetry | None = None,
        restart_backoff: Backoff = RESTART_BACKOFF,
    ) -> None:
        self.pool = pool
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self._client = client or httpx.AsyncClient(
            timeout=timeout_s, limits=httpx.Limits(max_connections=256, max_keepalive_connections=256)
        )
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._restart_backoff = restart_backoff
        self.rejections = RejectionReporter(telemetry)
        self.scrapes = 0
        self.failures = 0

    def sync(self) -> None:
        """Start a loop for every endpoint in the pool, stop loops of endpoints that left."""
        current = {ep.address: ep for ep in self.pool.endpoints()}
        for address in list(self._tasks):
            if address not in current:
                self._tasks.pop(address).cancel()
                self.rejections.forget(address)
        for address, ep in current.items():
            if address not in self._tasks:
                self._tasks[address] = spawn(
                    "scrape",
                    f"scrape {address}",
                    functools.partial(self._loop, ep),
                    on_failure=functools.partial(self._crashed, address),
                    backoff=self._restart_backoff,
                )

    def _crashed(self, address: str, _exc: BaseException) -> None:
        """A crashed loop says nothing about the pod's metrics: distrust them until it recovers."""
        self.pool.mark_unhealthy(address)

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
            rejected: list[Rejection] = []
            try:
                metrics = parse_metrics(text, ep.engine, time.monotonic(), rejected=rejected)
            finally:
                if rejected:
                    self.rejections.report(ep.address, rejected)
        except (httpx.HTTPError, httpx.InvalidURL, MetricsParseError, ValueError) as exc:
            self.failures += 1
            self.pool.record_scrape_failure(ep.address)
            log.debug("scrape of %s failed: %s", ep.address, exc)
            return False
        self.scrapes += 1
        self.pool.record_metrics(ep.address, metrics)
        names = SPEED_HISTOGRAMS.get(ep.engine)
        if names:
            rejected = []
            ttft = speed.mean_since_last("ttft", _histogram_totals(text, names[0], "ttft", rejected))
            tpot = speed.mean_since_last("tpot", _histogram_totals(text, names[1], "tpot", rejected))
            if rejected:
                self.rejections.report(ep.address, rejected)
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
