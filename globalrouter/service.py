"""The gRPC services of a router replica, on one port: ext_proc (two roles) and ClusterReports.

Envoy's two filters reach the same ExternalProcessor service; the observer filter identifies
itself with the `x-global-role: observer` initial metadata (set in its grpc_service config).
The router role drives the shared `extproc.stream.ExtProcStream` with a `GlobalProcessor`.
"""

from __future__ import annotations

import logging
import math
from collections.abc import AsyncIterator, Callable

import grpc
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

from extproc.stream import ExtProcServicer
from globalrouter.api.v1 import cluster_report_pb2 as rpb
from globalrouter.api.v1 import cluster_report_pb2_grpc as rpb_grpc
from globalrouter.members import MemberBook, ModelLoad
from globalrouter.observer import observe
from globalrouter.processor import GlobalProcessor, RouterContext
from globalrouter.telemetry import Telemetry

log = logging.getLogger(__name__)

ROLE_METADATA = "x-global-role"


class GlobalExtProcServicer:
    def __init__(self, ctx: RouterContext) -> None:
        self._ctx = ctx
        self._router = ExtProcServicer(lambda: GlobalProcessor(ctx), name="global router")
        self.active_streams = 0

    async def Process(
        self, request_iterator: AsyncIterator[pb.ProcessingRequest], context: grpc.aio.ServicerContext
    ) -> None:
        role = dict(context.invocation_metadata() or ()).get(ROLE_METADATA, "router")
        self.active_streams += 1
        try:
            if role == "observer":
                async for response in observe(self._ctx, request_iterator):
                    await context.write(response)
            else:  # the shared stream state machine, as in BBR and the EPP (reads `context`)
                await self._router.Process(request_iterator, context)
        finally:
            self.active_streams -= 1


def _finite(value: float, low: float = 0.0, high: float = math.inf) -> float:
    """Clamp a reported figure; NaN and negatives from a confused reporter become `low`."""
    if not math.isfinite(value) and value != math.inf:
        return low
    return min(high, max(low, value))


def model_loads(reports: list[rpb.ModelReport]) -> list[ModelLoad]:
    return [
        ModelLoad(
            model=r.model,
            ready_pods=r.ready_pods,
            avg_kv_usage=_finite(r.avg_kv_usage, 0.0, 1.0),
            avg_queue=_finite(r.avg_queue, 0.0, 1e6),
            running=_finite(r.running, 0.0, 1e6),
            inflight_requests=r.inflight_requests,
            error_rate=_finite(r.error_rate, 0.0, 1.0),
            capacity=r.capacity,
            ttft_s=_finite(r.ttft_s, 0.0, 3600.0),
            tpot_s=_finite(r.tpot_s, 0.0, 60.0),
        )
        for r in reports
        if r.model
    ]


class ClusterReportsServicer(rpb_grpc.ClusterReportsServicer):
    def __init__(
        self, book: MemberBook, telemetry: Telemetry, router_id: str, clock: Callable[[], float]
    ) -> None:
        self._book = book
        self._telemetry = telemetry
        self._router_id = router_id
        self._clock = clock

    async def Report(
        self, request_iterator: AsyncIterator[rpb.ClusterHeartbeat], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[rpb.HeartbeatAck]:
        warned = False
        async for hb in request_iterator:
            if not hb.cluster:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "heartbeat without a cluster name")
            known = self._book.heartbeat(
                hb.cluster,
                self._clock(),
                region=hb.region,
                cost_per_1k_tokens=_finite(hb.cost_per_1k_tokens, 0.0, 1e9),
                draining=hb.draining,
                models=model_loads(list(hb.models)),
            )
            if known:
                self._telemetry.heartbeats.labels(hb.cluster).inc()
            elif not warned:
                log.warning("heartbeat from unknown cluster %r (not in members)", hb.cluster)
                warned = True
            yield rpb.HeartbeatAck(sequence=hb.sequence, router_id=self._router_id, known_cluster=known)
