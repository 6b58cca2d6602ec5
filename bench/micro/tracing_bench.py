"""Microbenchmark: what tracing costs one request in BBR and in the EPP, off and on.

    python -m bench.micro.tracing_bench [--repeat N] [--pods 16]

Each call is one stream's request decision (a new processor, `on_request`, `on_close`), driven
without an event loop (the decision never awaits). "no tracing code" calls the decision
without the tracing wrapper, i.e. the request path before tracing existed; "off" is the
default; "on" records a span into the SDK's batch processor, whose exporter here discards
(export runs on the processor's thread; the figure is the request path's share); "on,
unsampled" is a ratio-0 sampler: the span is not recorded but traceparent is still passed on.
Figures are this thread's CPU time per request, best of N interleaved rounds (a shared machine
disturbs CPU time far less than wall time); the batch processor's export thread is not counted.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

from bbr.router import BodyRouter
from bbr.service import BbrProcessor
from epp.datalayer.endpoint_records import Endpoint, Metrics
from epp.datalayer.pool import Pool
from epp.requestcontrol.context import EppContext
from epp.requestcontrol.processor import EppProcessor
from epp.requestcontrol.telemetry import Telemetry
from epp.scheduling.weighted import WeightedScheduler
from gateway.config import GatewayConfig, parse_config
from gateway.tracing import Tracing


class _Discard(SpanExporter):
    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return SpanExportResult.SUCCESS


def _tracing(ratio: float) -> Tracing:
    """Negative ratio: tracing off (the default)."""
    if ratio < 0:
        return Tracing()
    provider = TracerProvider(sampler=ParentBased(TraceIdRatioBased(ratio)))
    provider.add_span_processor(BatchSpanProcessor(_Discard()))
    return Tracing(provider)


def _run(coro: Coroutine[Any, Any, Any]) -> Any:
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value
    raise RuntimeError("the decision awaited")


def _config() -> GatewayConfig:
    return parse_config({"pools": [{"name": "llama", "models": [{"name": "llama", "adapters": ["sql"]}]}]})


def _context(config: GatewayConfig, pods: int, tracing: Tracing) -> EppContext:
    pool = Pool([Endpoint(f"10.0.0.{i}:8000", frozenset({"llama"})) for i in range(pods)])
    for i, ep in enumerate(pool.endpoints()):
        pool.record_metrics(
            ep.address, Metrics(waiting=i % 4, kv_usage=0.1 * (i % 7), scraped_at=time.monotonic() + 3600)
        )  # fresh for the whole run
    ctx = EppContext(
        "llama", pool, WeightedScheduler(config.scheduler_profiles()), lambda: config, Telemetry("llama")
    )
    ctx.tracing = tracing
    return ctx


async def _bbr_untraced(router: BodyRouter, headers: dict[str, str], body: bytes) -> object:
    return router.route(headers, body)  # BbrProcessor.on_request as it was before tracing


async def _epp_untraced(proc: EppProcessor, headers: dict[str, str], body: bytes) -> object:
    return proc._decide(headers, body)  # EppProcessor.on_request as it was, minus the GET check


def bbr_call(
    config: GatewayConfig, tracing: Tracing | None, headers: dict[str, str], body: bytes
) -> Callable[[], None]:
    router = BodyRouter(lambda: config)
    if tracing is None:
        return lambda: _run(_bbr_untraced(router, headers, body))
    proc = BbrProcessor(router, lambda: config, tracing)
    return lambda: _run(proc.on_request(headers, body))


def epp_call(
    config: GatewayConfig, pods: int, tracing: Tracing | None, headers: dict[str, str], body: bytes
) -> Callable[[], None]:
    ctx = _context(config, pods, tracing or Tracing())

    def call() -> None:
        proc = EppProcessor(ctx)  # one per stream, as the servicer makes them
        _run(_epp_untraced(proc, headers, body) if tracing is None else proc.on_request(headers, body))
        proc.on_close(True)

    return call


def interleaved_cpu_us(calls: list[Callable[[], None]], repeat: int, rounds: int) -> list[float]:
    """Per-call CPU time of this thread (time.thread_time_ns), best round of each case, the
    cases taking turns within every round so that machine load drifts over all of them alike."""
    best = [float("inf")] * len(calls)
    for _ in range(rounds):
        for i, call in enumerate(calls):
            start = time.thread_time_ns()
            for _ in range(repeat):
                call()
            best[i] = min(best[i], (time.thread_time_ns() - start) / repeat / 1000)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=500)
    parser.add_argument("--pods", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    config = _config()
    prompt = "You are a helpful assistant. " * 40  # ~1.2 KB, 18 prefix blocks
    body = json.dumps({"model": "llama", "messages": [{"role": "user", "content": prompt}]}).encode()
    sampled = {"x-gateway-model-name": "llama", "traceparent": f"00-{'4b' * 16}-{'0f' * 8}-01"}
    plain = {"x-gateway-model-name": "llama"}  # the ratio-0 case: no sampled parent to follow
    cases: list[tuple[str, float | None, dict[str, str]]] = [
        ("no tracing code", None, sampled),
        ("off", -1.0, sampled),
        ("on", 1.0, sampled),
        ("on, unsampled", 0.0, plain),
    ]
    print(f"{'service':>8} {'tracing':>16} {'us/request':>11} {'vs no tracing code':>19}")
    for service in ("bbr", "epp"):
        tracings = [None if ratio is None else _tracing(ratio) for _, ratio, _ in cases]
        calls = [
            bbr_call(config, t, h, body) if service == "bbr" else epp_call(config, args.pods, t, h, body)
            for t, (_, _, h) in zip(tracings, cases, strict=True)
        ]
        costs = interleaved_cpu_us(calls, args.repeat, args.rounds)
        for (label, ratio, _), cost in zip(cases, costs, strict=True):
            delta = "" if ratio is None else f"{cost - costs[0]:+.2f} us"
            print(f"{service:>8} {label:>16} {cost:>11.2f} {delta:>19}")
        for t in tracings:
            if t is not None:
                t.shutdown()


if __name__ == "__main__":
    main()
