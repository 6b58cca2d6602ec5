"""The scrape loop: one asyncio task per pod polling its Prometheus `/metrics`.

Each pod has its own loop so a slow pod never delays the others, and its own `Cadence`:
every `scrape.intervalMs` (50 ms) while it is busy or its metrics change, doubling up to
`scrape.maxIntervalMs` (200 ms) while it is idle and unchanged, each sleep jittered (+-10 %)
and the loops started at random phases so a thousand pods are not scraped in lock-step; a
request routed to an idle pod ends its sleep at once. The GET goes over a kept-alive
connection of `epp/datalayer/metrics_http.py` (httpx cost ~20x more CPU per scrape, see
docs/benchmarks/costs.md) and the page is parsed in one pass over its raw bytes, histogram
`_sum`/`_count` lines included. A failed scrape (timeout, refused, garbage) counts against
the pod; after a few in a row it is reported unhealthy and the scheduler stops choosing it
until a scrape succeeds again. The interval backs off on failure so a dead pod costs little.
Failures are counted per pod (`inference_extension_scrape_failures_total{endpoint,pod}`) and
logged once per change of state (the first failure and its reason, the recovery and how many
failed meanwhile), not once per scrape: a pod on the wrong port says so once, a flapping one
once per flap.

Observed speed comes for free from the server's own latency histograms: the change of
`_sum / _count` between scrapes is the mean TTFT and inter-token latency of the requests that
finished meanwhile (llama.cpp: its generation seconds and tokens counters, `SPEED_SERIES`). About once a second the same pass also reads vLLM's per-request prefill
histograms, from which epp/datalayer/prefill_pace.py learns the pod's prefill pace (predicted-ttft). That is what lets the scheduler tell an H100 from an A10G without any
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
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import NamedTuple, Protocol

from epp.datalayer.endpoint_records import Endpoint, Metrics, count_problem
from epp.datalayer.metric_dialects import Rejection, parse_metrics
from epp.datalayer.metric_lines import MetricsParseError, Sample, collect_samples
from epp.datalayer.metrics_http import HttpError, MetricsHttpClient, split_http_url
from epp.datalayer.pool import Pool
from epp.datalayer.prefill_pace import PrefillTracker, prefill_metric_names, prefill_totals
from gateway.supervise import Backoff, spawn

log = logging.getLogger(__name__)


class ScrapeMetrics(Protocol):
    """What the scrape loop reports to the EPP's Prometheus metrics
    (epp/requestcontrol/telemetry.py `Telemetry`): named here so the data layer imports nothing
    above it."""

    def value_rejected(self, endpoint: str, field: str, reason: str) -> None: ...

    def scrape_failed(self, endpoint: str, pod: str) -> None: ...

    def forget_endpoint(self, endpoint: str) -> None: ...


class RatioSeries(NamedTuple):
    """Two cumulative series whose changes between scrapes give a mean: d sum / d count (a
    histogram's `_sum` and `_count`, or two counters)."""

    sum_name: str
    count_name: str


def histogram(name: str) -> RatioSeries:
    return RatioSeries(name + "_sum", name + "_count")


# Per dialect, the series whose mean over a scrape interval gives per-pod speed: (TTFT, time
# per output token); None where the engine exports nothing for it.
SPEED_SERIES: dict[str, tuple[RatioSeries | None, RatioSeries | None]] = {
    "vllm": (histogram("vllm:time_to_first_token_seconds"), histogram("vllm:inter_token_latency_seconds")),
    "sglang": (
        histogram("sglang:time_to_first_token_seconds"),
        histogram("sglang:inter_token_latency_seconds"),
    ),
    # llama.cpp has no latency histograms. A slot's generation seconds (first to last output
    # token) and its output tokens are added to these counters when the slot finishes, so
    # their changes give the mean inter-token time of the requests finished in the interval.
    "llamacpp": (
        None,
        RatioSeries("llamacpp:tokens_predicted_seconds_total", "llamacpp:tokens_predicted_total"),
    ),
}
MAX_BACKOFF_S = 2.0
# Restarts of a crashed scrape loop: quick at first, never slower than this.
RESTART_BACKOFF = Backoff(initial_s=0.1, max_s=5.0)
REJECTION_LOG_INTERVAL_S = 60.0


@dataclass
class _Totals:
    sum: float
    count: float


def _ratio_totals(
    source: Mapping[str, list[Sample] | None] | str | bytes,
    series: RatioSeries,
    field: str,
    rejected: list[Rejection],
) -> _Totals | None:
    """Cumulative sum and count over the series' samples (from collected samples or a page);
    None when absent or not sane."""
    keys = (series.sum_name, series.count_name)
    if isinstance(source, str | bytes):
        source = collect_samples(source, keys, lenient=keys)
    sums, counts = source.get(keys[0], []), source.get(keys[1], [])
    if sums is None or counts is None:
        rejected.append(Rejection(field, "malformed", series.sum_name))
        return None
    for s in (*sums, *counts):
        problem = count_problem(s.value)
        if problem:
            rejected.append(Rejection(field, problem, str(s.value)))
            return None
    # each <= MAX_COUNT: no overflow
    total_sum, total_count = math.fsum(s.value for s in sums), math.fsum(s.value for s in counts)
    if total_count == 0 and total_sum == 0:
        return None
    return _Totals(total_sum, total_count)


@dataclass(frozen=True, slots=True)
class Cadence:
    """When to scrape a pod next: `fast_s` while it is busy or its metrics change, doubling
    up to `max_s` (the staleness bound) while it is idle and unchanged; every sleep is
    spread by +-`jitter` so that a thousand pods started together drift apart."""

    fast_s: float = 0.05
    max_s: float = 0.2
    jitter: float = 0.1

    def next_interval(self, previous_s: float, busy: bool) -> float:
        """The un-jittered interval after a successful scrape."""
        if busy:
            return self.fast_s
        return min(self.max_s, max(self.fast_s, previous_s * 2.0))

    def jittered(self, interval_s: float, rng: random.Random) -> float:
        return interval_s * (1.0 + self.jitter * (2.0 * rng.random() - 1.0))


def _busy(previous: Metrics | None, metrics: Metrics, inflight: int) -> bool:
    """Work on the pod, or anything the scheduler reads changed since the last scrape."""
    if inflight or metrics.waiting or metrics.running or previous is None:
        return True
    return (
        metrics.waiting != previous.waiting
        or metrics.running != previous.running
        or metrics.kv_usage != previous.kv_usage
        or metrics.running_adapters != previous.running_adapters
        or metrics.waiting_adapters != previous.waiting_adapters
    )


class RejectionReporter:
    """Counts rejected values per pod/field/reason and logs each kind at a bounded rate."""

    def __init__(self, telemetry: ScrapeMetrics | None, interval_s: float = REJECTION_LOG_INTERVAL_S) -> None:
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
    """Turns cumulative histogram totals into the mean of the latest interval (and, through
    `prefill`, the per-request prefill histograms into the interval's prefill pace)."""

    def __init__(self) -> None:
        self._last: dict[str, _Totals] = {}
        self.prefill = PrefillTracker()

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
        max_interval_s: float | None = None,
        jitter: float = 0.1,
        timeout_s: float = 0.5,
        client: MetricsHttpClient | None = None,
        telemetry: ScrapeMetrics | None = None,
        restart_backoff: Backoff = RESTART_BACKOFF,
        rng: random.Random | None = None,
    ) -> None:
        self.pool = pool
        self.cadence = Cadence(interval_s, max(interval_s, max_interval_s or interval_s * 4), jitter)
        self.timeout_s = timeout_s
        self._client = client or MetricsHttpClient(timeout_s)
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._wakers: dict[str, asyncio.Future[None]] = {}
        self._restart_backoff = restart_backoff
        self.rng = rng or random.Random()
        self.rejections = RejectionReporter(telemetry)
        self._telemetry = telemetry
        # Pods whose latest scrape failed -> failures in a row (for the one log line per change).
        self._failing: dict[str, int] = {}
        self.scrapes = 0
        self.failures = 0
        # Called with (address, metrics, monotonic time the scrape was sent) after each good
        # scrape: the page shows the pod at some instant after that (adapter residency).
        self.scraped_hook: Callable[[str, Metrics, float], None] | None = None
        # How many replicas share the scraping of this pool (scrape.shareAcrossReplicas): each
        # good scrape's next interval is that many times the cadence's. None: this one alone.
        self.sharers: Callable[[], int] | None = None
        pool.routed_hook = self.wake

    @property
    def interval_s(self) -> float:
        return self.cadence.fast_s

    def configure(self, interval_s: float, max_interval_s: float, jitter: float, timeout_s: float) -> None:
        """New cadence from a reloaded config; running loops pick it up at their next sleep."""
        self.cadence = Cadence(interval_s, max(interval_s, max_interval_s), jitter)
        self.timeout_s = timeout_s

    def wake(self, address: str) -> None:
        """A request was just routed to `address`: end its idle sleep, scrape it now."""
        waker = self._wakers.get(address)
        if waker is not None and not waker.done():
            waker.set_result(None)

    def sync(self) -> None:
        """Start a loop for every endpoint in the pool, stop loops of endpoints that left."""
        current = {ep.address: ep for ep in self.pool.endpoints()}
        for address in list(self._tasks):
            if address not in current:
                self._tasks.pop(address).cancel()
                self._failing.pop(address, None)
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

    async def scrape_once(self, ep: Endpoint, speed: SpeedTracker) -> Metrics | None:
        """Scrape and record one pod; its new metrics, or None when the scrape failed."""
        sent_at = self.pool.clock()
        try:
            host, port, path = _target(ep.address, ep.metrics_url)
            page = await self._client.get(host, port, path, self.timeout_s)
            metrics = self.record_page(ep, page, speed, sent_at)
        except (HttpError, MetricsParseError, ValueError) as exc:
            self._scrape_failed(ep, exc)
            return None
        failed = self._failing.pop(ep.address, 0)
        if failed:
            log.info("pod %s: scraped again after %d failed scrape(s)", _pod_label(ep), failed)
        return metrics

    def _scrape_failed(self, ep: Endpoint, exc: Exception) -> None:
        """Count the failure against the pod; log it only when the pod turns from scraped to failing."""
        self.failures += 1
        self.pool.record_scrape_failure(ep.address)
        if self._telemetry is not None:
            self._telemetry.scrape_failed(ep.address, ep.name or "")
        failed = self._failing.get(ep.address, 0)
        self._failing[ep.address] = failed + 1
        if failed:
            log.debug("scrape of %s failed again: %s", ep.address, exc)
            return
        url = ep.metrics_url or f"http://{ep.address}/metrics"
        log.warning(
            "pod %s: scrape of %s failed: %s (it leaves routing after %d failures in a row; "
            "logged again when it recovers)",
            _pod_label(ep), url, exc, self.pool.unhealthy_after,
        )  # fmt: skip

    def record_page(self, ep: Endpoint, page: str | bytes, speed: SpeedTracker, sent_at: float) -> Metrics:
        """Parse one fetched metrics page and record it in the pool: gauges, speeds, prefill pace.
        Synchronous and I/O-free, so the virtual-time benchmark (bench/vtime/) feeds the pods'
        rendered pages through this same path; raises MetricsParseError on a bad page."""
        ttft_series, tpot_series = SPEED_SERIES.get(ep.engine, (None, None))
        clock = self.pool.clock
        read_prefill = speed.prefill.due(clock())
        also = _also_names(ep.engine, read_prefill)
        found: dict[str, list[Sample] | None] = {}
        rejected: list[Rejection] = []
        try:
            metrics = parse_metrics(
                page,
                ep.engine,
                clock(),
                kv_capacity_tokens=ep.kv_capacity_tokens,
                rejected=rejected,
                also=also,
                also_found=found,
            )
        finally:
            if rejected:
                self.rejections.report(ep.address, rejected)
        self.scrapes += 1
        rejected = []
        ttft_totals = _ratio_totals(found, ttft_series, "ttft", rejected) if ttft_series else None
        # The TTFT histogram's count is the pod's first tokens so far: the ledger retires that
        # many pending prefills (epp/datalayer/ledger.py).
        first_tokens = ttft_totals.count if ttft_totals is not None else None
        self.pool.record_metrics(ep.address, metrics, sent_at=sent_at, first_tokens=first_tokens)
        if self.scraped_hook is not None:
            self.scraped_hook(ep.address, metrics, sent_at)
        if ttft_series or tpot_series:
            ttft = speed.mean_since_last("ttft", ttft_totals)
            tpot_totals = _ratio_totals(found, tpot_series, "tpot", rejected) if tpot_series else None
            tpot = speed.mean_since_last("tpot", tpot_totals)
            if rejected:
                self.rejections.report(ep.address, rejected)
            if ttft is not None or tpot is not None:
                self.pool.observe_speed(ep.address, ttft=ttft, tpot=tpot)
            prefill = None
            if read_prefill:
                prefill = speed.prefill.sample(prefill_totals(found, ep.engine), clock())
            if prefill is not None:
                self.pool.observe_prefill(
                    ep.address,
                    tokens_per_s=prefill.tokens_per_s,
                    uncached_fraction=prefill.uncached_fraction,
                    mean_prompt_tokens=prefill.mean_prompt_tokens,
                )
        return metrics

    async def _loop(self, ep: Endpoint) -> None:
        speed = SpeedTracker()
        loop = asyncio.get_running_loop()
        # Start at a random phase: pods synced together must not be scraped in lock-step.
        await self._sleep(ep.address, self.rng.random() * self.cadence.fast_s * self._share(), loop)
        interval = self.cadence.fast_s
        previous: Metrics | None = None
        failure_delay = 0.0
        while True:
            started = loop.time()
            metrics = await self.scrape_once(ep, speed)
            cadence = self.cadence
            if metrics is None:
                failure_delay = min(MAX_BACKOFF_S, max(failure_delay * 2, cadence.fast_s))
                delay, interval = failure_delay, cadence.fast_s
            else:
                failure_delay = 0.0
                delay, interval = self.next_delay(ep.address, interval, previous, metrics)
                previous = metrics
            await self._sleep(ep.address, delay - (loop.time() - started), loop)

    def next_delay(
        self, address: str, interval: float, previous: Metrics | None, metrics: Metrics
    ) -> tuple[float, float]:
        """(the jittered sleep before the pod's next scrape, the un-jittered interval) after a
        good scrape; the live loop and the virtual-time benchmark's scrape events both use it."""
        busy = _busy(previous, metrics, self.pool.inflight(address))
        interval = self.cadence.next_interval(interval, busy)
        return self.cadence.jittered(interval * self._share(), self.rng), interval

    def _share(self) -> int:
        sharers = self.sharers
        return max(1, sharers()) if sharers is not None else 1

    async def _sleep(self, address: str, delay: float, loop: asyncio.AbstractEventLoop) -> None:
        """Sleep `delay`; a sleep longer than the fast interval (an idle pod's) ends at once on
        `wake(address)`."""
        if delay <= 0:
            return
        waker: asyncio.Future[None] = loop.create_future()
        timer = loop.call_later(delay, _resolve, waker)
        if delay > self.cadence.fast_s:
            self._wakers[address] = waker
        try:
            await waker
        finally:
            timer.cancel()
            if self._wakers.get(address) is waker:
                del self._wakers[address]


def _pod_label(ep: Endpoint) -> str:
    return f"{ep.name} ({ep.address})" if ep.name else ep.address


def _resolve(waker: asyncio.Future[None]) -> None:
    if not waker.done():
        waker.set_result(None)


@functools.lru_cache(maxsize=32)
def _also_names(engine: str, prefill: bool) -> tuple[str, ...]:
    """The speed (and, with `prefill`, prefill-pace) series a scrape of `engine` collects
    beside the dialect's gauges."""
    speeds = tuple(name for series in SPEED_SERIES.get(engine, ()) if series for name in series)
    if not prefill:
        return speeds
    return speeds + tuple(n for n in prefill_metric_names(engine) if n not in speeds)


@functools.lru_cache(maxsize=65_536)
def _target(address: str, metrics_url: str | None) -> tuple[str, int, str]:
    """(host, port, path) to GET; ValueError (a failed scrape) for a URL that is not http://."""
    return split_http_url(metrics_url or f"http://{address}/metrics")
