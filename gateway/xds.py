"""`python -m gateway.xds --config gateway.yaml --topology topology.json --port 18000`: serve
Envoy its configuration over xDS (ADS, state of the world), following the gateway config.

Why: a static bootstrap is rendered once, so a model, adapter or pool added to the config was
known to BBR and the EPPs within a second but unknown to Envoy's routes until a restart. Here
the same hot-reload path as the services (ConfigStore, file or InferenceGatewayConfig) renders
the resources again (gateway/envoy/xds_resources.py) and pushes the types whose content changed, in
ADS order (clusters, listeners, routes). Envoy applies each push without a restart and without
touching requests in flight. A config the renderer cannot serve is refused by the config store
itself (`ConfigStore.add_check`: the same verdict as a schema error), so the last good
resources stay; a push Envoy rejects (NACK) is logged with Envoy's reason.

In a cluster (`--config-resource NAMESPACE/NAME`) it follows the InferenceGatewayConfig and
writes each verdict into the resource's status. It serves nothing before the resource's first
list was handled (up to `--resource-wait-seconds`): a restarted xDS server must not hand Envoy
the mounted file's older configuration for a moment. While it is gone, Envoy keeps the last
configuration it received and serves on; it reconnects and gets the current one.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
from envoy.service.discovery.v3 import ads_pb2_grpc, discovery_pb2
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from extproc.server import GrpcService, TlsFiles, tls_from_arguments, wait_for_shutdown_signal
from gateway.config import ConfigError, GatewayConfig
from gateway.config_store import ConfigStore, FileWatcher
from gateway.envoy.topology import Topology
from gateway.envoy.xds_resources import TYPE_ORDER, Resources, snapshot, topology_from_json
from gateway.service_cli import follow_config_resource, run_service, service_parser
from gateway.supervise import spawn

log = logging.getLogger("xds")


class AdsServer(ads_pb2_grpc.AggregatedDiscoveryServiceServicer):
    """The resources in force, sent on every ADS stream for the types its Envoy subscribed to."""

    def __init__(self, topo: Topology, config: GatewayConfig) -> None:
        self._topo = topo
        self._resources = snapshot(config, topo)  # a bad config at start is fatal
        self._streams: set[asyncio.Event] = set()
        self._nonce = 0
        self._checked: tuple[GatewayConfig, dict[str, Resources]] | None = None  # check's rendering

    @property
    def resources(self) -> dict[str, Resources]:
        """What Envoy is given now, by type URL."""
        return self._resources

    def check(self, config: GatewayConfig) -> None:
        """The config store's check (ConfigStore.add_check): ConfigError when Envoy cannot be
        given `config` (e.g. a FailOpen pool in single-hop). The rendering is kept for
        `on_config`, which follows at once."""
        try:
            self._checked = (config, snapshot(config, self._topo))
        except ValueError as exc:
            raise ConfigError(f"Envoy cannot be given this configuration: {exc}") from None

    def on_config(self, config: GatewayConfig) -> None:
        checked, self._checked = self._checked, None
        if checked is not None and checked[0] is config:
            fresh = checked[1]
        else:
            try:
                fresh = snapshot(config, self._topo)
            except ValueError as exc:
                log.error("config not served to Envoy, keeping the last good resources: %s", exc)
                return
        changed = [t.rsplit(".", 1)[-1] for t in TYPE_ORDER if fresh[t].version != self._resources[t].version]
        self._resources = fresh
        log.info("config rendered for Envoy: %s", ", ".join(changed) or "no change")
        for wake in self._streams:
            wake.set()

    async def StreamAggregatedResources(  # the gRPC method's name
        self,
        request_iterator: AsyncIterator[discovery_pb2.DiscoveryRequest],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[discovery_pb2.DiscoveryResponse]:
        sent: dict[str, str] = {}  # type URL subscribed -> version last sent ("" none yet)
        wake = asyncio.Event()
        self._streams.add(wake)
        reader = asyncio.ensure_future(self._read(request_iterator, sent, wake))
        try:
            while not reader.done():
                await wake.wait()
                wake.clear()
                resources = self._resources
                for type_url in TYPE_ORDER:
                    if type_url in sent and sent[type_url] != resources[type_url].version:
                        sent[type_url] = resources[type_url].version
                        yield self._response(type_url, resources[type_url])
        finally:
            self._streams.discard(wake)
            reader.cancel()

    async def _read(
        self,
        requests: AsyncIterator[discovery_pb2.DiscoveryRequest],
        sent: dict[str, str],
        wake: asyncio.Event,
    ) -> None:
        """Subscriptions, ACKs and NACKs: a type is answered when Envoy subscribes to it or
        changes the names it asks for (SotW: a new name set wants the resources again), then on
        every change of content."""
        names: dict[str, list[str]] = {}
        try:
            async for request in requests:
                if request.HasField("error_detail"):
                    log.error(
                        "Envoy rejected %s version %s: %s",
                        request.type_url,
                        sent.get(request.type_url),
                        request.error_detail.message,
                    )
                asked = sorted(request.resource_names)
                if request.type_url not in sent or names.get(request.type_url) != asked:
                    names[request.type_url] = asked
                    sent[request.type_url] = ""
                    wake.set()
        finally:
            wake.set()  # the stream ended: let the writer return

    def _response(self, type_url: str, resources: Resources) -> discovery_pb2.DiscoveryResponse:
        self._nonce += 1
        return discovery_pb2.DiscoveryResponse(
            version_info=resources.version,
            type_url=type_url,
            resources=list(resources.resources),
            nonce=str(self._nonce),
        )


async def start_xds_server(servicer: AdsServer, *, host: str, port: int, tls: TlsFiles | None) -> GrpcService:
    """ADS and gRPC health on one port (health for the launcher's readiness wait)."""
    server = grpc.aio.server()
    ads_pb2_grpc.add_AggregatedDiscoveryServiceServicer_to_server(servicer, server)
    checks = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(checks, server)
    address = f"{host}:{port}" if ":" not in host else f"[{host}]:{port}"
    bound = server.add_secure_port(address, tls.credentials()) if tls else server.add_insecure_port(address)
    await server.start()
    await checks.set("", health_pb2.HealthCheckResponse.SERVING)
    return GrpcService(server, checks, bound)


async def serve(args: argparse.Namespace) -> None:
    store = ConfigStore.from_file(args.config, GatewayConfig)
    ads = AdsServer(args.topology, store.current())
    store.add_check(ads.check)
    store.subscribe(ads.on_config)
    resource = await follow_config_resource(store, args.config_resource, write_status=True)
    if resource is not None and not await resource.wait_synced(args.resource_wait_seconds):
        log.warning(
            "%s not listed within %.0f s; serving %s until it is",
            resource.source, args.resource_wait_seconds, args.config,
        )  # fmt: skip
    service = await start_xds_server(ads, host=args.host, port=args.port, tls=tls_from_arguments(args))
    watcher = spawn("config-file", f"config watch {args.config}", FileWatcher(store, args.config).run)
    log.info("xds listening on %s:%d", args.host, service.port)
    await wait_for_shutdown_signal()
    watcher.cancel()
    if resource is not None:
        await resource.stop()
    await service.drain_and_stop(args.drain_seconds)


def _topology_file(value: str) -> Topology:
    """`--topology`: read and checked while parsing, so a bad file is a usage error."""
    try:
        return topology_from_json(Path(value).read_text())
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise argparse.ArgumentTypeError(f"{value}: not a topology file ({exc})") from None


def main() -> None:
    parser = service_parser(
        "gateway.xds", "xDS (ADS) server feeding Envoy the gateway config", default_port=18000
    )
    parser.add_argument(
        "--topology",
        type=_topology_file,
        required=True,
        help="where the listener, BBR and certificates are (JSON, gateway.envoy.xds_resources.topology_to_json)",
    )
    parser.add_argument(
        "--resource-wait-seconds",
        type=float,
        default=30.0,
        help="with --config-resource: how long to wait for its first list before serving --config",
    )
    run_service(serve, parser.parse_args())


if __name__ == "__main__":
    main()
