"""Assemble one global-router replica: gRPC (ext_proc + ClusterReports + health), admin HTTP."""

from __future__ import annotations

import dataclasses
import socket
import time
from typing import Any

from aiohttp import web
from prometheus_client import generate_latest

from extproc.server import GrpcService, TlsFiles, check_port_free, start_grpc_service
from gateway.admin_http import start_admin_http
from globalrouter.api.v1 import cluster_report_pb2 as rpb
from globalrouter.api.v1 import cluster_report_pb2_grpc as rpb_grpc
from globalrouter.config import RouterConfig
from globalrouter.members import MemberBook
from globalrouter.policy import estimate_ttft
from globalrouter.processor import RouterContext
from globalrouter.ratelimit import RateLimiter
from globalrouter.service import ClusterReportsServicer, GlobalExtProcServicer
from globalrouter.telemetry import Telemetry


class GlobalRouterApp:
    def __init__(
        self,
        config: RouterConfig,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        admin_port: int = 0,
        router_id: str | None = None,
        tls: TlsFiles | None = None,
    ) -> None:
        self.config = config
        self.router_id = router_id or f"{socket.gethostname()}-{port}"
        clock = time.monotonic
        self.book = MemberBook(config, started_at=clock())
        self.telemetry = Telemetry(self.book, clock)
        limiter = RateLimiter(config.rate_limits) if config.rate_limits.enabled else None
        self.ctx = RouterContext(config, self.book, limiter, self.telemetry, clock=clock)
        self.extproc = GlobalExtProcServicer(self.ctx)
        self.reports = ClusterReportsServicer(self.book, self.telemetry, self.router_id, clock)
        self._host, self._port, self._admin_port, self._tls = host, port, admin_port, tls
        self.port = 0
        self.admin_port = 0
        self._grpc: GrpcService | None = None
        self._admin: web.AppRunner | None = None

    async def start(self) -> None:
        check_port_free(self._host, self._admin_port, "--admin-port")  # before anything starts
        heartbeats = (
            rpb_grpc.add_ClusterReportsServicer_to_server,
            self.reports,
            rpb.DESCRIPTOR.services_by_name["ClusterReports"].full_name,
        )
        self._grpc = await start_grpc_service(
            self.extproc, host=self._host, port=self._port, tls=self._tls, extra_services=[heartbeats]
        )
        self.port = self._grpc.port
        self._admin, self.admin_port = await start_admin_http(
            self._host,
            self._admin_port,
            metrics=lambda: generate_latest(self.telemetry.registry),
            views={"/debug/members": self.members_json},
            port_flag="--admin-port",
        )

    def members_json(self) -> dict[str, Any]:
        now = self.ctx.clock()
        out = []
        for s in self.book.members.values():
            out.append(
                {
                    "name": s.name,
                    "address": s.member.address,
                    "region": s.region,
                    "cost_per_1k_tokens": s.cost_per_1k_tokens,
                    "available": self.book.available(s, now),
                    "heartbeat_age_s": None if s.last_heartbeat is None else round(now - s.last_heartbeat, 3),
                    "ramp": round(self.book.ramp(s, now), 3),
                    "ejected_for_s": round(max(0.0, s.ejected_until - now), 3),
                    "ejections": s.ejections,
                    "draining": s.draining,
                    "recent_routes": self.book.recent_routed(s, now),
                    "observed_ttft_s": s.observed_ttft_s,
                    "routed": s.routed,
                    "failures": s.failures,
                    "models": {
                        name: {
                            **dataclasses.asdict(load),
                            "estimated_ttft_s": round(
                                estimate_ttft(
                                    load, self.book.recent_routed(s, now), self.config, s.observed_ttft_s
                                ),
                                4,
                            ),
                        }
                        for name, load in s.models.items()
                    },
                }
            )
        return {"router_id": self.router_id, "members": out}

    async def stop(self, grace_s: float = 1.0) -> None:
        if self._grpc is not None:
            await self._grpc.drain_and_stop(grace_s)
        if self._admin is not None:
            await self._admin.cleanup()
        if self.ctx.limiter is not None:
            await self.ctx.limiter.close()
