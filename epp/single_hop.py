"""Single-hop mode: one EPP process for every pool, one ext_proc stream per request.

The two-hop shape (BBR reads the model and sets the header Envoy routes on, then the pool's own
EPP picks the pod) is what a Gateway API implementation needs, since it chooses the pool. A
standalone Envoy need not pay two Python round trips for it: here one stream reads the body once,
resolves the model exactly as BBR does (`gateway.model_routing`: adapters, weighted rewrites),
hands the decoded body to that pool's context (its own Pool, scheduler, scraper, telemetry,
admin port: an `EppApp` without a gRPC server of its own) and answers with the model headers
and the destination together; Envoy clears its route cache and the pool's `-picked` route
sends the request to the chosen pod. The body is re-serialised only when a rewrite changed
the model. The response side (in-flight held to the response's end, retries moving the slot,
the decision header) is the pool's `EppProcessor`, unchanged.

`python -m epp.single_hop --config gateway.yaml --port 9002 [--metrics-port POOL=PORT ...]
[--inference-model-rewrites NAMESPACE]`
"""

from __future__ import annotations

import argparse
import asyncio
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from epp.app import EppApp, SharedRuntime
from epp.requestcontrol.parse import ParsedBody, ParseHints, parse_body
from epp.requestcontrol.processor import SPAN_NAME, EppProcessor
from epp.workers.processes import (
    WorkerFront,
    add_workers_argument,
    resolve_workers,
    start_worker_front,
    worker_options,
)
from extproc.errors import ErrorResponse, unavailable
from extproc.headers import ROUTING_HEADERS
from extproc.server import (
    GrpcService,
    TlsFiles,
    start_grpc_service,
    tls_from_arguments,
    wait_for_shutdown_signal,
)
from extproc.stream import ExtProcServicer, RequestRoute
from gateway.config import GatewayConfig
from gateway.config_store import ConfigStore, FileWatcher
from gateway.kube.llmd_api import add_api_group_argument
from gateway.model_routing import ModelRouter, RoutedModel, encode_body
from gateway.service_cli import add_event_loop_argument, follow_config_resource, run_service, service_parser
from gateway.supervise import spawn
from gateway.tracing import Attributes, AttributeValue, Tracing

log = logging.getLogger(__name__)


class SingleHopProcessor:
    """One stream: route by model, then delegate to the chosen pool's `EppProcessor`."""

    def __init__(self, epp: SingleHopEpp) -> None:
        self._epp = epp
        self.max_body_bytes = epp.store.current().bbr.max_body_bytes
        self._pool: EppProcessor | None = None  # set once the request reached a pool
        self._routed: RoutedModel | None = None

    async def on_request(self, headers: dict[str, str], body: bytes) -> RequestRoute | ErrorResponse:
        return await self.on_parsed(headers, parse_body(headers, body, self._epp.parse_hints()))

    async def on_prepared(
        self, headers: dict[str, str], body: bytes, prepared: Any
    ) -> RequestRoute | ErrorResponse:
        """`on_request` with the parse done by an ext_proc worker (extproc/remote.py)."""
        return await self.on_parsed(headers, ParsedBody.from_wire(prepared, body))

    async def on_parsed(self, headers: dict[str, str], parsed: ParsedBody) -> RequestRoute | ErrorResponse:
        """The decision for a parsed request (parsed here, or by an ext_proc worker, epp/requestcontrol/parse.py)."""
        if not parsed.raw:
            # Nothing to route on (GET on a served path): Envoy re-routes and answers its JSON 404.
            return RequestRoute(clear_route_cache=True)
        span = self._epp.tracing.begin(SPAN_NAME, headers)  # None unless tracing is on
        outcome = await self._route(headers, parsed)
        return self._epp.tracing.finish_route(span, outcome, lambda: self._span_attributes(outcome))

    async def _route(self, headers: dict[str, str], parsed: ParsedBody) -> RequestRoute | ErrorResponse:
        if parsed.error is not None:
            return parsed.error
        assert parsed.fields is not None
        routed = self._epp.router.resolve_model(self._epp.store.current(), parsed.fields.model)
        if isinstance(routed, ErrorResponse):
            return routed
        self._routed = routed
        app = self._epp.apps.get(routed.route.pool)
        if app is None:
            return unavailable(f"pool '{routed.route.pool}' is not served by this EPP yet", "pool_not_served")
        self._pool = EppProcessor(app.ctx)
        picked = await self._pool.schedule(headers, parsed, routed.route, routed.model)
        if isinstance(picked, ErrorResponse):
            return picked
        set_headers = {**routed.headers(), **picked.set_headers}
        body = picked.body  # the pool's own rewrite (a /v1/responses id naming the pod) has the model
        if body is None and routed.body_changed:
            body = encode_body({**parsed.data(), "model": routed.model})
        return RequestRoute(
            set_headers=set_headers,
            # Envoy's strip filter removed them already; never trust a client's copy anyway.
            remove_headers=tuple(h for h in headers if h in ROUTING_HEADERS and h not in set_headers),
            metadata=picked.metadata,
            clear_route_cache=True,
            body=body,
        )

    def _span_attributes(self, outcome: RequestRoute | ErrorResponse) -> Attributes:
        """BBR's and the EPP's span attributes in one span: the model asked for and routed,
        then the pool's decision (or the refusal)."""
        attrs: dict[str, AttributeValue] = {}
        if self._routed is not None:
            note = self._routed.note()
            attrs.update({f"gateway.{k}": v for k, v in note.items() if k != "requested"})
        if self._pool is not None:
            attrs.update(self._pool.span_attributes(outcome))
        elif isinstance(outcome, ErrorResponse):
            attrs.update(
                {
                    "gateway.outcome": outcome.code,
                    "http.response.status_code": outcome.status,
                    "gateway.refusal_reason": outcome.message,
                }
            )
        if self._routed is not None:
            attrs["gen_ai.request.model"] = self._routed.requested
        return attrs

    @property
    def answers_response_headers(self) -> bool:
        return self._pool is not None and self._pool.answers_response_headers

    def on_response_headers(self, headers: dict[str, str]) -> dict[str, str] | None:
        return self._pool.on_response_headers(headers) if self._pool is not None else None

    def on_response_body(self, chunk: bytes, end_of_stream: bool) -> None:
        if self._pool is not None:
            self._pool.on_response_body(chunk, end_of_stream)

    def on_close(self, completed: bool) -> None:
        if self._pool is not None:
            self._pool.on_close(completed)


class SingleHopEpp:
    """Every pool of the config in one process behind one ext_proc server. A reload that adds a
    pool starts its context (a free metrics port; requests for it get a 503 until it runs),
    reloads of existing pools apply as in a per-pool EPP."""

    def __init__(
        self,
        config_path: str | Path,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        metrics_ports: Mapping[str, int] | None = None,
        tls: TlsFiles | None = None,
        workers: int | str | None = None,
        worker_options: dict[str, str] | None = None,
    ) -> None:
        """`workers`: ext_proc worker processes (epp/workers/processes.py; None: the most any pool's
        `epp.workers` asks for)."""
        self.store = ConfigStore.from_file(config_path, GatewayConfig)
        config = self.store.current()
        self.tracing = Tracing.from_config(config.tracing, "inference-gateway-epp")  # read once
        self.store.subscribe(self.tracing.warn_on_change(config.tracing))
        ports = dict(metrics_ports or {})
        unknown = set(ports) - {p.name for p in config.pools}
        if unknown:
            raise ValueError(f"--metrics-port names no pool of the config: {', '.join(sorted(unknown))}")
        shared = self._shared = SharedRuntime(self.store, self.tracing)
        self._config_path = config_path
        self._starting: set[str] = set()
        self.apps = {
            pool.name: EppApp(
                config_path, pool.name, host=host, metrics_port=ports.get(pool.name, 0), shared=shared
            )
            for pool in config.pools
        }
        self.router = ModelRouter()
        self._hints: tuple[GatewayConfig, frozenset[str], ParseHints] | None = None
        self.servicer = ExtProcServicer(lambda: SingleHopProcessor(self), name="epp-single-hop")
        self.store.subscribe(self._on_config)
        self._watcher = FileWatcher(self.store, config_path)
        self._host, self._port, self._tls = host, port, tls
        self._tasks: list[asyncio.Task[None]] = []
        self.grpc: GrpcService | None = None
        self.port = 0
        self.worker_count = (
            resolve_workers(workers) if workers else max(resolve_workers(p.epp.workers) for p in config.pools)
        )
        self._worker_options = worker_options
        self.workers: WorkerFront | None = None

    def _on_config(self, config: GatewayConfig) -> None:
        for name in sorted({p.name for p in config.pools} - set(self.apps) - self._starting):
            self._starting.add(name)
            self._tasks.append(asyncio.get_running_loop().create_task(self._add_pool(name)))

    async def _add_pool(self, name: str) -> None:
        """A pool added by a reload: served once its context runs (scraper, metrics port)."""
        try:
            app = EppApp(self._config_path, name, host=self._host, shared=self._shared)
            await app.start()
        except Exception:
            log.exception("pool %s added by a reload could not start; restart the EPP to serve it", name)
            return
        finally:
            self._starting.discard(name)
        self.apps[name] = app
        if self.workers is not None:  # their parse hashes its models' prompts too
            self.workers.push_settings()
        log.info("pool %s added by a reload: served (metrics port %d)", name, app.metrics_port)

    def parse_hints(self) -> ParseHints:
        """What a parse reads (epp/requestcontrol/parse.py): the routes of the pools served now."""
        config, pools = self.store.current(), frozenset(self.apps)
        if self._hints is None or self._hints[0] is not config or self._hints[1] != pools:
            index = next((getattr(a.scheduler, "prefix_index", None) for a in self.apps.values()), None)
            self._hints = (config, pools, ParseHints.for_pools(config, pools, index))
        return self._hints[2]

    def _worker_settings(self) -> dict[str, Any]:
        return {
            "max_body_bytes": self.store.current().bbr.max_body_bytes,
            "parse": self.parse_hints().to_wire(),
        }

    @property
    def metrics_ports(self) -> dict[str, int]:
        return {name: app.metrics_port for name, app in self.apps.items()}

    async def start(self) -> None:
        for app in self.apps.values():
            await app.start()
        if self.worker_count > 1:
            self.workers = await start_worker_front(
                self.worker_count,
                lambda: SingleHopProcessor(self),
                self._worker_settings,
                self.store.subscribe,
                host=self._host,
                port=self._port,
                tls=self._tls,
                options=self._worker_options,
            )
            self.port = self.workers.port
            for app in self.apps.values():
                app.workers_debug = self.workers.debug
        else:
            self.grpc = await start_grpc_service(
                self.servicer, host=self._host, port=self._port, tls=self._tls
            )
            self.port = self.grpc.port
        self._tasks.append(spawn("config-file", f"config watch {self._watcher.path}", self._watcher.run))

    async def stop(self, grace_s: float = 1.0) -> None:
        for task in self._tasks:
            task.cancel()
        if self.grpc is not None:
            await self.grpc.drain_and_stop(grace_s)
        if self.workers is not None:  # each drains its streams, then its link's end releases the rest
            await self.workers.stop(grace_s)
        for app in self.apps.values():
            await app.stop(grace_s)
        self.tracing.shutdown()


def parse_metrics_ports(values: list[str]) -> dict[str, int]:
    out = {}
    for value in values:
        pool, sep, port = value.partition("=")
        if not sep or not pool or not port.isdigit():
            raise ValueError(f"--metrics-port takes POOL=PORT, not {value!r}")
        out[pool] = int(port)
    return out


async def serve(args: argparse.Namespace) -> None:
    epp = SingleHopEpp(
        args.config,
        host=args.host,
        port=args.port,
        metrics_ports=args.metrics_port,
        tls=tls_from_arguments(args),
        workers=args.workers,
        worker_options=worker_options(args),
    )
    await epp.start()
    resource = await follow_config_resource(epp.store, args.config_resource)
    rewrites = None
    if args.inference_model_rewrites:
        from gateway.kube.model_rewrite_source import follow_model_rewrites  # loads the kubernetes client

        rewrites = await follow_model_rewrites(
            epp.router, epp.store.current, args.inference_model_rewrites, group=args.llm_d_api_group
        )
    ports = ", ".join(f"{name} {port}" for name, port in epp.metrics_ports.items())
    log.info("single-hop epp listening on %s:%d (metrics: %s)", args.host, epp.port, ports)
    await wait_for_shutdown_signal()
    for follower in (resource, rewrites):
        if follower is not None:
            await follower.stop()
    await epp.stop(args.drain_seconds)


def main() -> None:
    parser = service_parser(
        "epp-single-hop",
        "Endpoint Picker for every pool, routing by model (Envoy ext_proc)",
        default_port=9002,
    )
    parser.add_argument(
        "--metrics-port",
        action="append",
        default=[],
        metavar="POOL=PORT",
        help="a pool's /metrics and /debug/pool port (repeatable; a pool without one gets a free port)",
    )
    parser.add_argument(
        "--inference-model-rewrites",
        metavar="NAMESPACE",
        help="follow the InferenceModelRewrite resources of this namespace, as BBR does",
    )
    add_workers_argument(parser, "the most any pool's epp.workers asks for")
    add_api_group_argument(parser)
    add_event_loop_argument(parser)
    args = parser.parse_args()
    try:
        args.metrics_port = parse_metrics_ports(args.metrics_port)
    except ValueError as exc:
        parser.error(str(exc))
    run_service(serve, args)


if __name__ == "__main__":
    main()
