"""Assemble one EPP: config store, pool, discovery, the feeds (epp/datalayer/feeds.py: scraper,
KV events, tokenizers, shared state), scheduler, gRPC and admin servers.

A configuration reload rebuilds the scheduler (keeping the learned prefix index) and, for
static pools, the endpoint set; in-flight accounting lives in the Pool and is never reset.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from epp.admin import pool_debug, start_admin_server
from epp.datalayer.discovery.objectives import ObjectivePriorities
from epp.datalayer.discovery.static import static_endpoints
from epp.datalayer.endpoint_records import Endpoint
from epp.datalayer.feeds import PoolFeeds
from epp.datalayer.kv_index import KVIndex
from epp.datalayer.pool import Pool
from epp.requestcontrol import conformance_mode
from epp.requestcontrol.context import EppContext
from epp.requestcontrol.flow_control import FlowController
from epp.requestcontrol.header_policy import HeaderPolicy
from epp.requestcontrol.processor import EppProcessor
from epp.requestcontrol.scale_from_zero import EmptyPoolHold
from epp.requestcontrol.telemetry import Telemetry
from epp.scheduling.weighted import build_scheduler
from epp.workers.processes import WorkerFront, resolve_workers, start_worker_front
from extproc.server import (
    GrpcService,
    StartupError,
    TlsFiles,
    check_port_free,
    start_grpc_service,
    start_health_server,
)
from extproc.stream import ExtProcServicer
from gateway.config import GatewayConfig
from gateway.config_store import ConfigStore, FileWatcher
from gateway.pool_config import PoolConfig
from gateway.supervise import spawn
from gateway.tracing import Tracing

if TYPE_CHECKING:
    from epp.datalayer.discovery.kubernetes import InferencePoolDiscovery

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class KubernetesPool:
    """The InferencePool this EPP follows (the reference EPP's `--pool-*` flags)."""

    namespace: str
    pool_name: str
    group: str = "inference.networking.k8s.io"
    version: str = "v1"

    def discovery(
        self, pool: PoolConfig, on_change: Callable[[list[Endpoint]], None]
    ) -> InferencePoolDiscovery:
        """The discovery following this InferencePool's pods (epp/datalayer/discovery/kubernetes.py,
        imported here: it loads the kubernetes client); the pool's config gives the defaults."""
        from epp.datalayer.discovery.kubernetes import InferencePoolDiscovery

        return InferencePoolDiscovery(
            namespace=self.namespace,
            pool_name=self.pool_name,
            pool_group=self.group,
            pool_version=self.version,
            on_change=on_change,
            engine=pool.engine,
            default_models=[m.name for m in pool.models],
            default_adapters=[a for m in pool.models for a in m.adapters],
        )


@dataclass(frozen=True, slots=True)
class SharedRuntime:
    """What the pools of one multi-pool EPP process share."""

    store: ConfigStore[GatewayConfig]
    tracing: Tracing


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
        health_port: int | None = None,
        kubernetes: KubernetesPool | None = None,
        conformance_test_mode: bool = False,
        shared: SharedRuntime | None = None,
        workers: int | str | None = None,
        worker_options: dict[str, str] | None = None,
    ) -> None:
        """`health_port`: also serve the gRPC health service alone there (the reference EPP's
        9003); `kubernetes`: discover the pool from this InferencePool whatever the config
        says (`--pool-name`); `conformance_test_mode`: see epp/requestcontrol/conformance_mode.py; `shared`: one
        pool of a process serving several (epp/single_hop.py), which owns the config store,
        tracing and the gRPC server, so this app starts no ext_proc server of its own;
        `workers`: ext_proc worker processes (epp/workers/processes.py; None: the pool's `epp.workers`),
        `worker_options` their --log-level / --event-loop / --drain-seconds."""
        self._shared = shared
        config, pool_config = self._load_config(config_path, pool_name)
        self._build_state(config, pool_config)
        self._build_context(config, conformance_test_mode)
        self._build_feeds(config)
        self._build_serving(pool_config, workers, worker_options, kubernetes, health_port)
        self._apply(config)
        self.store.subscribe(self._on_config)
        self._tls = tls
        self._host, self._port, self._metrics_port = host, port, metrics_port
        self._tasks: list[asyncio.Task[None]] = []
        self.grpc: GrpcService | None = None
        self.port = 0
        self.metrics_port = 0

    def _load_config(self, config_path: str | Path, pool_name: str) -> tuple[GatewayConfig, PoolConfig]:
        """The config store (the process's, when it serves several pools) and this pool's section."""
        shared = self._shared
        self.store = shared.store if shared else ConfigStore.from_file(config_path, GatewayConfig)
        self._watcher = FileWatcher(self.store, config_path) if shared is None else None
        config = self.store.current()
        if pool_name not in {p.name for p in config.pools}:
            names = ", ".join(p.name for p in config.pools)
            raise StartupError(
                f"pool {pool_name!r} is not in {config_path} (pools: {names}): pass --pool with one"
            )
        return config, config.pool(pool_name)

    def _build_state(self, config: GatewayConfig, pool_config: PoolConfig) -> None:
        """The pool, its metrics, the indexes and the scheduler, the flow-control queue."""
        pool_name = pool_config.name
        self.pool_name = pool_name
        self.pool = Pool()
        self.telemetry = Telemetry(pool_name)
        self._thresholds = config.scheduler_profiles()[config.default_profile].thresholds
        self.telemetry.attach_pool(self.pool.snapshot, lambda: self._thresholds)
        # Precise prefix state from the pods' own KV events (pools with kvEvents / annotations).
        kv = pool_config.kv_events
        self.kv_index = KVIndex(kv.max_blocks if kv else KVIndex().max_blocks)
        self.scheduler = build_scheduler(config, kv_index=self.kv_index, pool_name=pool_name)
        self.telemetry.attach_prefix_index(self.scheduler.prefix_index)
        self.flow = FlowController(self.telemetry.registry, config.flow_control)
        self.empty_pool = EmptyPoolHold(self.telemetry.registry, pool_name)
        self.pool.capacity_hook = self._capacity_changed

    def _build_context(self, config: GatewayConfig, conformance_test_mode: bool) -> None:
        """What every stream's processor reads (`EppContext`), tracing included."""
        pool_name, shared = self.pool_name, self._shared
        self.ctx = EppContext(
            pool_name,
            self.pool,
            self.scheduler,
            self.store.current,
            self.telemetry,
            flow=self.flow,
            conformance_test_mode=conformance_test_mode,
            empty_pool=self.empty_pool,
        )
        if shared is not None:
            self.ctx.tracing = shared.tracing
        else:
            self.ctx.tracing = Tracing.from_config(config.tracing, "inference-gateway-epp")  # read once
            self.store.subscribe(self.ctx.tracing.warn_on_change(config.tracing))
        if conformance_test_mode:
            log.warning(conformance_mode.WARNING, conformance_mode.SELECTION_HEADER)
            self.telemetry.conformance_test_mode()

    def _build_feeds(self, config: GatewayConfig) -> None:
        """What feeds the pool's state (epp/datalayer/feeds.py); the feeds' objects are this
        app's attributes too (tests and the virtual-time harness read them)."""
        scheduler = self.scheduler
        self.feeds = PoolFeeds(
            self.pool,
            self.pool_name,
            config,
            self.kv_index,
            self.telemetry.registry,
            self.telemetry,
            residency=lambda: self.scheduler.residency,
            prefix_index=scheduler.prefix_index,  # kept across reloads (build_scheduler)
            memory=scheduler.memory,  # and so is the KV memory
        )
        self.scraper, self.kv_events = self.feeds.scraper, self.feeds.kv_events
        self.tokenizers, self.shared_state = self.feeds.tokenizers, self.feeds.shared_state
        self.ctx.tokenizers = self.tokenizers

    def _build_serving(
        self,
        pool_config: PoolConfig,
        workers: int | str | None,
        worker_options: dict[str, str] | None,
        kubernetes: KubernetesPool | None,
        health_port: int | None,
    ) -> None:
        """The ext_proc servicer, its workers, discovery's source and the followed objectives."""
        pool_name, shared = self.pool_name, self._shared
        self.servicer = ExtProcServicer(lambda: EppProcessor(self.ctx), name=f"epp-{pool_name}")
        # More than one worker: they serve the streams, this process decides (epp/workers/processes.py).
        self.worker_count = 1 if shared is not None else resolve_workers(workers or pool_config.epp.workers)
        self._worker_options = worker_options or {}
        self._workers_setting = pool_config.epp.workers  # read at start, like sharedState
        self.workers: WorkerFront | None = None
        # /debug/pool's "workers": this app's own, or (single-hop) those of the process serving it.
        self.workers_debug: Callable[[], dict[str, Any]] | None = None
        self._kubernetes = kubernetes or (
            KubernetesPool(pool_config.kubernetes.namespace, pool_config.kubernetes.pool_name)
            if pool_config.kubernetes is not None
            else None
        )
        self._health_port = health_port
        self.health: GrpcService | None = None
        self.health_port = 0
        self._discovery: Any = None
        # InferenceObjectives (llm-d API), when followed (`objectives.follow`): request priorities.
        self.objectives = ObjectivePriorities(pool_name, self._objectives_changed)

    def _apply(self, config: GatewayConfig) -> None:
        """Derive everything per-request code reads from a validated config."""
        self.ctx.header_policy = HeaderPolicy.from_config(config, self.objectives.priorities(config))
        self._thresholds = config.scheduler_profiles()[config.default_profile].thresholds
        self.flow.configure(config.flow_control)
        pool = config.pool(self.pool_name)
        self.ctx.fallback_endpoints = pool.fallback_endpoints
        self.feeds.configure(config)
        if self._kubernetes is None:
            self.set_endpoints(static_endpoints(config, self.pool_name))

    def _on_config(self, config: GatewayConfig) -> None:
        try:
            config.pool(self.pool_name)
        except KeyError:  # a valid file (the verdict, logged by the store, is everyone's)
            log.warning(
                "the applied config has no pool %r: this EPP keeps its last settings for it until stopped",
                self.pool_name,
            )
            return
        if config.shared_state != self.feeds.shared_config:
            log.warning("sharedState changed: it is read at start; restart the EPP to apply it")
        if config.pool(self.pool_name).epp.workers != self._workers_setting and self._shared is None:
            log.warning("epp.workers changed: it is read at start; restart the EPP to apply it")
        self.scheduler = build_scheduler(config, self.scheduler, pool_name=self.pool_name)
        self.ctx.scheduler = self.scheduler
        self._apply(config)

    def _objectives_changed(self) -> None:
        config = self.store.current()
        self.ctx.header_policy = HeaderPolicy.from_config(config, self.objectives.priorities(config))

    def set_endpoints(self, endpoints: list[Endpoint]) -> None:
        """The one entry point for discovery (static or Kubernetes) to change the pool; pool-wide
        settings fill what a pod does not say itself."""
        capacity = self.store.current().pool(self.pool_name).kv_capacity_tokens
        if capacity is not None:
            endpoints = [
                ep if ep.kv_capacity_tokens is not None else replace(ep, kv_capacity_tokens=capacity)
                for ep in endpoints
            ]
        self.pool.set_endpoints(endpoints)
        self.scheduler.retain([ep.address for ep in endpoints])
        self.ctx.ranks.retain(
            {ep.address: ep.data_parallel_size for ep in endpoints if ep.data_parallel_size > 1}
        )
        try:
            self.feeds.sync(self.store.current())
        except RuntimeError:  # no running loop yet: start() syncs
            pass

    def _capacity_changed(self) -> None:
        """A scrape came in or a request finished (Pool.capacity_hook): the queue and the
        requests waiting for a first ready pod look again."""
        self.flow.signal()
        self.empty_pool.signal()

    async def start(self) -> None:
        # Every port checked before anything starts: a half-started EPP cannot exit cleanly.
        if self._shared is None:
            check_port_free(self._host, self._port, "--port")
        check_port_free(self._host, self._metrics_port, "--metrics-port")
        if self._health_port is not None:
            check_port_free(self._host, self._health_port, "--grpc-health-port")
        if self._kubernetes is not None:
            pool = self.store.current().pool(self.pool_name)
            self._discovery = self._kubernetes.discovery(pool, self.set_endpoints)
            await self._discovery.start()
        self.feeds.sync(self.store.current())
        if self.worker_count > 1:
            await self._start_workers()
        elif self._shared is None:
            self.grpc = await start_grpc_service(
                self.servicer, host=self._host, port=self._port, tls=self._tls
            )
            self.port = self.grpc.port
        if self._health_port is not None:  # after discovery's first list: ready means synced
            self.health = await start_health_server(self._host, self._health_port)
            self.health_port = self.health.port
        self._admin, self.metrics_port = await start_admin_server(
            self._host,
            self._metrics_port,
            self.telemetry,
            self.pool.snapshot,
            extra=lambda: pool_debug(self),
        )
        if self.shared_state is not None:
            self.shared_state.start()
        if self._watcher is not None:
            self._tasks.append(spawn("config-file", f"config watch {self._watcher.path}", self._watcher.run))

    async def _start_workers(self) -> None:
        self.workers = await start_worker_front(
            self.worker_count,
            lambda: EppProcessor(self.ctx),
            lambda: {
                "max_body_bytes": self.store.current().bbr.max_body_bytes,
                "parse": self.ctx.parse_hints().to_wire(),  # the workers parse (epp/requestcontrol/parse.py)
            },
            self.store.subscribe,
            host=self._host,
            port=self._port,
            tls=self._tls,
            options=self._worker_options,
        )
        self.port = self.workers.port
        self.workers_debug = self.workers.debug

    async def stop(self, grace_s: float = 1.0) -> None:
        for task in self._tasks:
            task.cancel()
        if self.health is not None:
            await self.health.health.enter_graceful_shutdown()
        if self.grpc:
            await self.grpc.drain_and_stop(grace_s)
        if self.workers is not None:  # each drains its streams, then its link's end releases the rest
            await self.workers.stop(grace_s)
        if self.health is not None:
            await self.health.server.stop(0)
        if self._discovery is not None:
            await self._discovery.stop()
        await self.objectives.stop()
        if self.shared_state is not None:  # after the drain: the last streams' slots are released
            await self.shared_state.stop()
        await self.scraper.stop()
        await self.flow.stop()
        await self.kv_events.stop()
        await self._admin.cleanup()
        if self._shared is None:
            self.ctx.tracing.shutdown()
