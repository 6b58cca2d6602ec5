"""Open-loop async load generator for OpenAI-compatible streaming endpoints.

Requests leave at their scheduled times whether or not earlier ones finished (open loop), so
a slow router shows up as latency, not as a lower offered rate. A concurrency cap bounds the
number of in-flight requests to keep a 2-core client from thrashing; a request held back by
the cap records the delay as `lag_s`, which the report shows, so a saturated generator is
visible instead of silently turning the run into a closed loop.

Per request: lag vs schedule, TTFT (first SSE chunk carrying non-empty content), inter-token
latencies, end-to-end time, output tokens (from the usage chunk, else counted chunks), HTTP
status or error, and the serving pod from the `x-modelsim-pod` response header.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import ssl
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import aiohttp
import httpx

from bench.harness.workloads import TraceRequest

POD_HEADER = "x-modelsim-pod"
# Set by bench.harness.oracle on the response: seconds it spent probing the pods for this request.
PROBE_HEADER = "x-bench-probe-s"


@dataclass
class RequestResult:
    index: int
    tag: str
    scheduled_s: float  # from the trace
    sent_s: float = 0.0  # actual send time, seconds after the run start
    lag_s: float = 0.0  # sent_s - scheduled_s: generator overhead plus concurrency-cap wait
    ttft_s: float | None = None
    e2e_s: float | None = None
    itl_s: list[float] = field(default_factory=list)
    output_tokens: int = 0
    content_chunks: int = 0
    status: int = 0  # HTTP status; 0 when no response arrived
    error: str | None = None
    pod: str | None = None
    probe_s: float | None = None  # oracle probe time (PROBE_HEADER); see without_probe_time
    slo_ttft_s: float | None = None  # the request's own TTFT objective (TraceRequest.slo_ttft_s)

    @property
    def ok(self) -> bool:
        return self.error is None and self.status == 200

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RequestResult:
        return cls(**data)


@dataclass
class LoadGenConfig:
    base_url: str
    http2: bool = False
    verify: bool | str = False  # False: TLS verification off; a path: CA bundle file
    concurrency: int = 256  # in-flight cap
    max_requests: int | None = None  # send at most this many trace entries
    max_wall_s: float | None = None  # stop sending (and cancel in-flight) after this
    timeout_s: float = 300.0  # per request
    headers: dict[str, str] = field(default_factory=dict)
    path: str | None = None  # default: chat completions when the body has messages, else completions


@dataclass
class RunResult:
    results: list[RequestResult]
    started_at: float  # wall clock (time.time()) at the run start
    wall_s: float  # from the run start to the last completion
    not_sent: int = 0  # trace entries cut by max_requests / max_wall_s


def _content_of(event: dict[str, Any]) -> str:
    choices = event.get("choices") or []
    if not choices:
        return ""
    choice = choices[0]
    delta = choice.get("delta")
    if isinstance(delta, dict):
        return delta.get("content") or ""
    return choice.get("text") or ""


def _seconds(value: str | None) -> float | None:
    try:
        return None if value is None else max(0.0, float(value))
    except ValueError:
        return None


class SseReader:
    """Fills a result from SSE bytes as they arrive; one instance per request.

    Lines are split here from raw chunks (several events often arrive in one read); every event
    of a chunk gets the chunk's arrival time, which is when the client could have seen it.
    """

    def __init__(self, result: RequestResult, start: float) -> None:
        self.result = result
        self.start = self.last = start
        self.usage_tokens: int | None = None
        self.done = False
        self._tail = b""

    def feed(self, chunk: bytes) -> None:
        lines = (self._tail + chunk).split(b"\n")
        self._tail = lines.pop()
        now = time.perf_counter()
        for line in lines:
            if self.done:
                return
            self._line(line, now)

    def _line(self, line: bytes, now: float) -> None:
        if not line.startswith(b"data:"):
            return
        result = self.result
        data = line[5:].strip()
        if data == b"[DONE]":
            self.done = True
            return
        try:
            event = json.loads(data)
        except ValueError:
            result.error = f"bad SSE data: {data[:100].decode(errors='replace')}"
            self.done = True
            return
        if not isinstance(event, dict):
            result.error = f"bad SSE data: {data[:100].decode(errors='replace')}"
            self.done = True
            return
        if "error" in event:
            result.error = f"stream error: {str(event['error'])[:200]}"
            self.done = True
            return
        if _content_of(event):
            if result.ttft_s is None:
                result.ttft_s = now - self.start
            else:
                result.itl_s.append(now - self.last)
            self.last = now
            result.content_chunks += 1
        usage = event.get("usage")
        if isinstance(usage, dict) and usage.get("completion_tokens") is not None:
            self.usage_tokens = int(usage["completion_tokens"])

    def finish(self) -> None:
        if self._tail and not self.done:
            self._line(self._tail, time.perf_counter())
        result = self.result
        if result.error is not None:
            return
        result.e2e_s = time.perf_counter() - self.start
        result.output_tokens = self.usage_tokens if self.usage_tokens is not None else result.content_chunks
        if result.ttft_s is None:
            result.error = "no content in stream"


Client = aiohttp.ClientSession | httpx.AsyncClient


async def send_one(
    client: Client, config: LoadGenConfig, req: TraceRequest, result: RequestResult, t0: float
) -> None:
    """Send one streaming request and fill `result`; never raises (errors land in result.error)."""
    start = time.perf_counter()
    result.sent_s = start - t0
    result.lag_s = result.sent_s - result.scheduled_s
    headers = {**config.headers, **req.headers}
    path = config.path or ("/v1/chat/completions" if "messages" in req.body else "/v1/completions")
    reader = SseReader(result, start)
    try:
        if isinstance(client, aiohttp.ClientSession):
            await _send_aiohttp(client, path, req.body, headers, reader)
        else:
            await _send_httpx(client, path, req.body, headers, reader)
    except asyncio.CancelledError:
        result.error = "cancelled at wall-time limit"
        raise
    except (TimeoutError, httpx.TimeoutException):
        result.error = f"timeout after {config.timeout_s:g}s"
    except aiohttp.ClientConnectorError as exc:  # the name the error counts have always used
        result.error = f"ConnectError: {exc}"[:300]
    except (aiohttp.ClientError, httpx.HTTPError) as exc:
        result.error = f"{type(exc).__name__}: {exc}"[:300]


def _response_started(result: RequestResult, status: int, headers: Mapping[str, str]) -> bool:
    """Record the status and the gateway's response headers; True for a 200 (a stream follows)."""
    result.status = status
    result.pod = headers.get(POD_HEADER)
    result.probe_s = _seconds(headers.get(PROBE_HEADER))
    return status == 200


def _http_error(status: int, body: bytes) -> str:
    return f"HTTP {status}: {body.decode(errors='replace')[:200]}"


async def _send_aiohttp(
    client: aiohttp.ClientSession,
    path: str,
    body: dict[str, Any],
    headers: dict[str, str],
    reader: SseReader,
) -> None:
    result = reader.result
    async with client.post(path, json=body, headers=headers) as resp:
        if not _response_started(result, resp.status, resp.headers):
            result.error = _http_error(resp.status, await resp.read())
            return
        async for chunk in resp.content.iter_any():
            reader.feed(chunk)
            if reader.done:
                break
    reader.finish()


async def _send_httpx(
    client: httpx.AsyncClient, path: str, body: dict[str, Any], headers: dict[str, str], reader: SseReader
) -> None:
    result = reader.result
    async with client.stream("POST", path, json=body, headers=headers) as resp:
        if not _response_started(result, resp.status_code, resp.headers):
            result.error = _http_error(resp.status_code, await resp.aread())
            return
        async for chunk in resp.aiter_raw():
            reader.feed(chunk)
            if reader.done:
                break
    reader.finish()


def _ssl_context(config: LoadGenConfig) -> ssl.SSLContext | None:
    """None: verification off; else a context trusting the configured CA bundle."""
    if not isinstance(config.verify, str):
        return None
    try:
        return ssl.create_default_context(cafile=config.verify)
    except (OSError, ssl.SSLError) as exc:
        raise ValueError(f"CA file {config.verify!r} unusable: {exc}") from exc


def make_client(config: LoadGenConfig) -> Client:
    """aiohttp for HTTP/1.1 (its C parser and asyncio's TLS cost a fraction of httpx's per SSE
    chunk, and a saturated client delays sends and token reads alike); httpx for HTTP/2."""
    ctx = _ssl_context(config)
    if config.http2:
        limits = httpx.Limits(
            max_connections=config.concurrency, max_keepalive_connections=config.concurrency
        )
        return httpx.AsyncClient(
            base_url=config.base_url,
            http1=False,
            http2=True,
            verify=ctx if ctx is not None else False,
            timeout=httpx.Timeout(config.timeout_s, connect=min(10.0, config.timeout_s)),
            limits=limits,
        )
    connector = aiohttp.TCPConnector(limit=config.concurrency, ssl=ctx if ctx is not None else False)
    # As httpx's Timeout(t): t bounds each read (and connect at most 10 s), not the whole stream.
    timeout = aiohttp.ClientTimeout(
        total=None, connect=min(10.0, config.timeout_s), sock_read=config.timeout_s
    )
    return aiohttp.ClientSession(base_url=config.base_url, connector=connector, timeout=timeout)


async def run_trace(
    trace: Sequence[TraceRequest],
    config: LoadGenConfig,
    on_done: Callable[[RequestResult], None] | None = None,
) -> RunResult:
    """Replay `trace` open-loop against `config.base_url`; returns one result per sent request."""
    if config.concurrency < 1:
        raise ValueError("concurrency must be >= 1")
    entries = list(trace)
    if config.max_requests is not None:
        entries = entries[: config.max_requests]
    sem = asyncio.Semaphore(config.concurrency)
    results: list[RequestResult] = []
    tasks: set[asyncio.Task[None]] = set()
    deadline = config.max_wall_s

    async with make_client(config) as client:
        started_at = time.time()
        t0 = time.perf_counter()

        async def guarded(req: TraceRequest, result: RequestResult) -> None:
            try:
                await send_one(client, config, req, result, t0)
            finally:
                sem.release()
                if on_done is not None:
                    on_done(result)

        not_sent = 0
        for i, req in enumerate(entries):
            delay = req.at_s - (time.perf_counter() - t0)
            if deadline is not None and req.at_s >= deadline:
                not_sent = len(entries) - i
                break
            if delay > 0:
                await asyncio.sleep(delay)
            await sem.acquire()
            if deadline is not None and time.perf_counter() - t0 >= deadline:
                sem.release()
                not_sent = len(entries) - i
                break
            result = RequestResult(index=i, tag=req.tag, scheduled_s=req.at_s, slo_ttft_s=req.slo_ttft_s)
            results.append(result)
            task = asyncio.create_task(guarded(req, result))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        if tasks:
            remaining = None if deadline is None else max(0.0, deadline - (time.perf_counter() - t0))
            _, pending = await asyncio.wait(set(tasks), timeout=remaining)
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.gather(*pending, return_exceptions=True)
        wall = time.perf_counter() - t0
    return RunResult(results=results, started_at=started_at, wall_s=wall, not_sent=not_sent)


def without_probe_time(results: Sequence[RequestResult]) -> list[RequestResult]:
    """TTFT and E2E minus the time the picker spent probing pods (the oracle's HTTP round
    trips, which a picker reading state in process would not pay); probe_s stays recorded, so
    the measured figure is ttft_s + probe_s."""

    def minus(value: float | None, probe: float) -> float | None:
        return None if value is None else max(0.0, value - probe)

    return [
        r
        if not r.probe_s
        else dataclasses.replace(r, ttft_s=minus(r.ttft_s, r.probe_s), e2e_s=minus(r.e2e_s, r.probe_s))
        for r in results
    ]


def to_wall_clock(trace: Sequence[TraceRequest], time_scale: float) -> list[TraceRequest]:
    """A trace written in simulated seconds, rescheduled for a fleet running `time_scale` x real time."""
    if time_scale <= 0:
        raise ValueError("time_scale must be > 0")
    return [TraceRequest(r.at_s / time_scale, r.body, r.headers, r.tag) for r in trace]


def to_simulated(results: Sequence[RequestResult], time_scale: float) -> list[RequestResult]:
    """Results measured in wall seconds, expressed in simulated seconds (wall x time_scale)."""
    if time_scale <= 0:
        raise ValueError("time_scale must be > 0")

    def scale(value: float | None) -> float | None:
        return None if value is None else value * time_scale

    return [
        dataclasses.replace(
            r,
            scheduled_s=r.scheduled_s * time_scale,
            sent_s=r.sent_s * time_scale,
            lag_s=r.lag_s * time_scale,
            ttft_s=scale(r.ttft_s),
            e2e_s=scale(r.e2e_s),
            itl_s=[gap * time_scale for gap in r.itl_s],
            probe_s=scale(r.probe_s),
        )
        for r in results
    ]
