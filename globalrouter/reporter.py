"""Cluster reporter: reads the local EPPs' state and streams heartbeats to the global routers.

    python -m globalrouter.reporter --cluster east-a --region us-east-1 --cost-per-1k-tokens 0.2 \
        --epp-admin http://127.0.0.1:9090 [--epp-admin ...] --router 127.0.0.1:9100 [--router ...]

Every `--interval` (0.5 s) it GETs each EPP's `/debug/pool` (per-pod metrics and in-flight
counts) and `/metrics` (routed and failed request counters, for the recent error rate),
aggregates them per model and sends one `ClusterHeartbeat` on a bidirectional stream to each
router replica. An unreachable EPP makes its models report zero ready pods; an unreachable
router is retried with backoff without holding up the others.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import logging
import time
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import grpc
import httpx
from prometheus_client.parser import text_string_to_metric_families

from gateway.supervise import spawn
from globalrouter.api.v1 import cluster_report_pb2 as rpb
from globalrouter.api.v1 import cluster_report_pb2_grpc as rpb_grpc

log = logging.getLogger("globalrouter.reporter")

ERROR_WINDOW_S = 5.0  # error rate over about this much history
MIN_EVENTS_FOR_ERROR_RATE = 5  # fewer routed requests than this: report 0, not noise


@dataclass
class _EppSource:
    url: str
    known_models: set[str] = field(default_factory=set)
    counters: deque[tuple[float, float, float]] = field(default_factory=deque)  # (t, routed, errors)


def _counter_totals(text: str) -> tuple[float, float]:
    routed = errors = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "inference_objective_request_total":
                routed += sample.value
            elif sample.name == "inference_objective_request_error_total":
                errors += sample.value
    return routed, errors


def _error_rate(source: _EppSource, now: float, routed: float, errors: float) -> float:
    source.counters.append((now, routed, errors))
    while len(source.counters) > 2 and now - source.counters[1][0] >= ERROR_WINDOW_S:
        source.counters.popleft()
    _, routed0, errors0 = source.counters[0]
    d_routed, d_errors = routed - routed0, errors - errors0
    if d_routed < 0 or d_errors < 0:  # the EPP restarted: start over
        source.counters.clear()
        source.counters.append((now, routed, errors))
        return 0.0
    if d_routed + d_errors < MIN_EVENTS_FOR_ERROR_RATE:
        return 0.0
    return min(1.0, d_errors / max(1.0, d_routed))


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def _known(metrics: list[dict[str, Any]], key: str) -> list[float]:
    """The values pods reported for `key`; an EPP publishes null for an unknown field."""
    return [float(v) for m in metrics if (v := m.get(key)) is not None]


def model_reports(pool: dict[str, Any], error_rate: float, slots_per_pod: int) -> list[rpb.ModelReport]:
    """Aggregate one EPP's `/debug/pool` per model name (base models and adapters)."""
    by_model: dict[str, list[dict[str, Any]]] = {}
    for ep in pool.get("endpoints", []):
        for name in [*ep.get("models", []), *ep.get("adapters", [])]:
            by_model.setdefault(name, []).append(ep)
    out = []
    for name, eps in sorted(by_model.items()):
        ready = [e for e in eps if e.get("healthy") and e.get("metrics")]
        metrics = [e["metrics"] for e in ready]
        ttfts = [float(e["ttft_ewma_s"]) for e in ready if e.get("ttft_ewma_s")]
        tpots = [float(e["tpot_ewma_s"]) for e in ready if e.get("tpot_ewma_s")]
        out.append(
            rpb.ModelReport(
                model=name,
                ready_pods=len(ready),
                total_pods=len(eps),
                avg_kv_usage=_mean(_known(metrics, "kv_usage")),
                avg_queue=_mean(_known(metrics, "waiting")),
                running=sum(_known(metrics, "running")),
                inflight_requests=sum(int(e.get("inflight_requests", 0)) for e in eps),
                error_rate=error_rate,
                capacity=len(ready) * slots_per_pod,
                ttft_s=_mean(ttfts),
                tpot_s=_mean(tpots),
            )
        )
    return out


class Reporter:
    def __init__(
        self,
        *,
        cluster: str,
        region: str,
        cost_per_1k_tokens: float,
        epp_admin: list[str],
        routers: list[str],
        interval_s: float = 0.5,
        slots_per_pod: int = 8,
        draining: bool = False,
    ) -> None:
        if not cluster:
            raise ValueError("cluster name must not be empty")
        if not epp_admin or not routers:
            raise ValueError("need at least one --epp-admin and one --router")
        if interval_s <= 0 or cost_per_1k_tokens < 0 or slots_per_pod < 1:
            raise ValueError("interval must be > 0, cost >= 0 and slots per pod >= 1")
        self.cluster, self.region, self.cost = cluster, region, cost_per_1k_tokens
        self.sources = [_EppSource(url.rstrip("/")) for url in epp_admin]
        self.routers = routers
        self.interval_s = interval_s
        self.slots_per_pod = slots_per_pod
        self.draining = draining
        self._sequence = 0
        self._queues: dict[str, asyncio.Queue[rpb.ClusterHeartbeat]] = {
            r: asyncio.Queue(maxsize=1) for r in routers
        }
        self.acks: dict[str, int] = dict.fromkeys(routers, 0)

    async def _read_source(self, client: httpx.AsyncClient, source: _EppSource) -> list[rpb.ModelReport]:
        try:
            pool_resp, metrics_resp = await asyncio.gather(
                client.get(f"{source.url}/debug/pool"), client.get(f"{source.url}/metrics")
            )
            pool_resp.raise_for_status()
            metrics_resp.raise_for_status()
            pool = pool_resp.json()
            rate = _error_rate(source, time.monotonic(), *_counter_totals(metrics_resp.text))
        except (httpx.HTTPError, ValueError) as exc:
            log.debug("EPP %s unreachable: %s", source.url, exc)
            return [
                rpb.ModelReport(model=m, ready_pods=0, error_rate=1.0) for m in sorted(source.known_models)
            ]
        reports = model_reports(pool, rate, self.slots_per_pod)
        source.known_models = {r.model for r in reports}
        return reports

    async def build(self, client: httpx.AsyncClient) -> rpb.ClusterHeartbeat:
        per_source = await asyncio.gather(*(self._read_source(client, s) for s in self.sources))
        self._sequence += 1
        return rpb.ClusterHeartbeat(
            cluster=self.cluster,
            region=self.region,
            cost_per_1k_tokens=self.cost,
            sequence=self._sequence,
            sent_unix_ms=int(time.time() * 1000),
            draining=self.draining,
            models=[r for reports in per_source for r in reports],
        )

    async def run(self) -> None:
        senders = [
            spawn("heartbeat-sender", f"heartbeats to {r}", functools.partial(self._send_to, r))
            for r in self.routers
        ]
        try:
            async with httpx.AsyncClient(timeout=max(0.3, self.interval_s * 0.8)) as client:
                while True:
                    started = time.monotonic()
                    heartbeat = await self.build(client)
                    for queue in self._queues.values():
                        if queue.full():  # that router is behind: only the newest state matters
                            queue.get_nowait()
                        queue.put_nowait(heartbeat)
                    await asyncio.sleep(max(0.0, self.interval_s - (time.monotonic() - started)))
        finally:
            for task in senders:
                task.cancel()
            for task in senders:
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    async def _send_to(self, router: str) -> None:
        queue = self._queues[router]
        backoff = 0.1

        async def outgoing() -> AsyncIterator[rpb.ClusterHeartbeat]:
            while True:
                yield await queue.get()

        while True:
            try:
                async with grpc.aio.insecure_channel(router) as channel:
                    stub = rpb_grpc.ClusterReportsStub(channel)
                    async for ack in stub.Report(outgoing()):
                        backoff = 0.1
                        self.acks[router] += 1
                        if not ack.known_cluster:
                            log.warning("router %s does not know cluster %r", router, self.cluster)
            except grpc.aio.AioRpcError as exc:
                log.debug("router %s: %s", router, exc.code())
            await asyncio.sleep(backoff)
            backoff = min(2.0, backoff * 2)


def main() -> None:
    parser = argparse.ArgumentParser(prog="inference-gateway-reporter", description=__doc__.split("\n")[0])
    parser.add_argument("--cluster", required=True)
    parser.add_argument("--region", default="")
    parser.add_argument("--cost-per-1k-tokens", type=float, default=0.0)
    parser.add_argument("--epp-admin", action="append", required=True, help="EPP admin base URL (repeatable)")
    parser.add_argument("--router", action="append", required=True, help="router host:port (repeatable)")
    parser.add_argument("--interval", type=float, default=0.5, help="seconds between heartbeats")
    parser.add_argument(
        "--slots-per-pod", type=int, default=8, help="concurrent requests a pod runs unqueued"
    )
    parser.add_argument("--draining", action="store_true", help="ask routers to send no new traffic")
    parser.add_argument("--log-level", default="INFO")
    args = parser.parse_args()
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        reporter = Reporter(
            cluster=args.cluster,
            region=args.region,
            cost_per_1k_tokens=args.cost_per_1k_tokens,
            epp_admin=args.epp_admin,
            routers=args.router,
            interval_s=args.interval,
            slots_per_pod=args.slots_per_pod,
            draining=args.draining,
        )
    except ValueError as exc:
        raise SystemExit(f"globalrouter.reporter: {exc}") from None
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(reporter.run())


if __name__ == "__main__":
    main()
