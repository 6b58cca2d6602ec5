"""Assemble one EPP: config store, pool, discovery, scheduler, gRPC and admin servers."""

from __future__ import annotations

import asyncio
from pathlib import Path

from epp.admin import start_admin_server
from epp.context import EppContext
from epp.discovery.static import static_endpoints
from epp.pool import Pool
from epp.processor import EppProcessor
from epp.scheduling.base import RoundRobinScheduler, Scheduler
from epp.telemetry import Telemetry
from extproc.server import GrpcService, TlsFiles, start_grpc_service
from extproc.stream import ExtProcServicer
from gateway.config import GatewayConfig, load_config
from gateway.config_store import ConfigStore


def build_scheduler(config: GatewayConfig) -> Scheduler:
    return RoundRobinScheduler()


class EppApp:
    def __init__(
        self,
        config_path: str | Path,
        pool_name: str,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        metrics_port: int = 0,
        tls: TlsFiles | None = None,
    ) -> None:
        self._tls = tls
        self.store: ConfigStore[GatewayConfig] = ConfigStore(config_path, loader=load_config)
        config = self.store.current()
        config.pool(pool_name)  # KeyError early if the pool is unknown
        self.pool_name = pool_name
        self.pool = Pool(static_endpoints(config, pool_name))
        self.telemetry = Telemetry(pool_name)
        self.telemetry.attach_pool(self.pool.snapshot)
        self.ctx = EppContext(
            pool_name, self.pool, build_scheduler(config), self.store.current, self.telemetry
        )
        self.servicer = ExtProcServicer(lambda: EppProcessor(self.ctx), name=f"epp-{pool_name}")
        self.store.subscribe(self._on_config)
        self._host, self._port, self._metrics_port = host, port, metrics_port
        self._tasks: list[asyncio.Task[None]] = []
        self.grpc: GrpcService | None = None
        self.port = 0
        self.metrics_port = 0

    def _on_config(self, config: GatewayConfig) -> None:
        self.pool.set_endpoints(static_endpoints(config, self.pool_name))
        self.ctx.scheduler = build_scheduler(config)

    async def start(self) -> None:
        self.grpc = await start_grpc_service(self.servicer, host=self._host, port=self._port, tls=self._tls)
        self.port = self.grpc.port
        self._admin, self.metrics_port = await start_admin_server(
            self._host, self._metrics_port, self.telemetry, self.pool.snapshot
        )
        self._tasks.append(asyncio.create_task(self.store.watch()))

    async def stop(self, grace_s: float = 1.0) -> None:
        for task in self._tasks:
            task.cancel()
        if self.grpc:
            await self.grpc.drain_and_stop(grace_s)
        await self._admin.cleanup()
