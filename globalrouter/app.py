"""Assemble one global-router replica: gRPC (ext_proc + ClusterReports + health), admin HTTP."""

from __future__ import annotations

import dataclasses
import socket
import time
from typing import Any

import grpc
from aiohttp import web
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ext_grpc
from grpc_health.v1 import _async as health_async
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from extproc.server import TlsFiles
from globalrouter.api import cluster_report_pb2_grpc as rpb_grpc
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
        self._server: grpc.aio.Server | None = None
        self._health: health_async.HealthServicer | None = None
        self._admin: web.AppRunner | None = None

    async def start(self) -> None:
        server = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", 8 * 1024 * 1024),
                ("grpc.max_send_message_length", 8 * 1024 * 1024),
            ]
        )
        ext_grpc.add_ExternalProcessorServicer_to_server(self.extproc, server)  # type: ignore[arg-type]
        rpb_grpc.add_ClusterReportsServicer_to_server(self.reports, server)
        self._health = health_async.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self._health, server)
        address = f"{self._host}:{self._port}" if ":" not in self._host else f"[{self._host}]:{self._port}"
        if self._tls:
            self.port = server.add_secure_port(address, self._tls.credentials())
        else:
            self.port = server.add_insecure_port(address)
        await server.start()
        self._server = server
        for service in ("", "envoy.service.ext_proc.v3.ExternalProcessor", "gateway.v1.ClusterReports"):
            await self._health.set(service, health_pb2.HealthCheckResponse.SERVING)
        self._admin, self.admin_port = await self._start_admin()

    async def _start_admin(self) -> tuple[web.AppRunner, int]:
        async def metrics(_: web.Request) -> web.Response:
            body = generate_latest(self.telemetry.registry)
            return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

        async def members(_: web.Request) -> web.Response:
            return web.json_response(self.members_json())

        async def healthz(_: web.Request) -> web.Response:
            return web.Response(text="ok")

        app = web.Application()
        app.router.add_get("/metrics", metrics)
        app.router.add_get("/debug/members", members)
        app.router.add_get("/healthz", healthz)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, self._host, self._admin_port)
        await site.start()
        return runner, site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

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
        if self._health is not None:
            await self._health.enter_graceful_shutdown()
        if self._server is not None:
            await self._server.stop(grace_s)
        if self._admin is not None:
            await self._admin.cleanup()
        if self.ctx.limiter is not None:
            await self.ctx.limiter.close()
