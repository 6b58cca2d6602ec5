"""What the xDS server (gateway/xds.py) sends Envoy: the very configuration the static bootstrap
renderer makes (gateway/envoy/bootstrap.py), cut into xDS resources: the same envoy-data-plane
messages, sent as their wire bytes in the protobuf `Any`s grpcio's ADS service needs.

Why the same renderer: one source of truth for both shapes, so a static bootstrap and a running
Envoy fed over xDS serve the same routes, clusters and filters. The listener's inline route
table becomes an RDS resource, so the usual change (a model or adapter added, removed or moved,
i.e. route match lists) replaces the route table alone: Envoy swaps it atomically and requests
in flight keep the routes they matched. A pool added or removed also changes the clusters
(CDS); a listener setting (JWT, limits) changes the listener, which Envoy updates in place,
draining the old connections' requests to their end.

Which EPP serves a pool comes from the configuration (`pools[].epp`), so a pool added to it
brings its EPP cluster along; in single-hop mode every pool, added ones too, maps to the one EPP.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import betterproto2
from envoy_data_plane.envoy.config.bootstrap.v3 import (
    Bootstrap,
    BootstrapDynamicResources,
    BootstrapStaticResources,
)
from envoy_data_plane.envoy.config.core.v3 import (
    AggregatedConfigSource,
    ApiConfigSource,
    ApiConfigSourceApiType,
    ApiVersion,
    ConfigSource,
    GrpcService,
    GrpcServiceEnvoyGrpc,
    Node,
)
from envoy_data_plane.envoy.config.route.v3 import RouteConfiguration
from envoy_data_plane.envoy.extensions.filters.network.http_connection_manager.v3 import (
    HttpConnectionManager,
    Rds,
)
from google.protobuf import any_pb2

from gateway.config import GatewayConfig
from gateway.envoy.blocks import admin, pack, validated
from gateway.envoy.bootstrap import render_resources
from gateway.envoy.clusters import ext_proc_cluster
from gateway.envoy.topology import ExtProcTls, Topology

LISTENER = "type.googleapis.com/envoy.config.listener.v3.Listener"
CLUSTER = "type.googleapis.com/envoy.config.cluster.v3.Cluster"
ROUTE = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration"
# The ADS order: clusters before the listeners and routes that name them.
TYPE_ORDER = (CLUSTER, LISTENER, ROUTE)
XDS_CLUSTER = "xds"
NODE_ID = "inference-gateway"  # the node id and cluster Envoy names itself by


def _ads() -> ConfigSource:
    return ConfigSource(ads=AggregatedConfigSource(), resource_api_version=ApiVersion.V3)


@dataclass(frozen=True, slots=True)
class Resources:
    """One type's resources as Envoy receives them, and their version (a content hash)."""

    version: str
    resources: tuple[any_pb2.Any, ...]


def topology_for(config: GatewayConfig, topo: Topology) -> Topology:
    """`topo` for the pools of `config`: each pool's EPP from its `epp` address when the pool
    names one (`epp.host` or `epp.port` given), else the topology's entry for the pool (a
    deployment's Service name, rendered beside its bootstrap), else the default address; the
    one EPP in single-hop mode. Pools named ORIGINAL_DST that the config no longer has are
    dropped."""
    names = {pool.name for pool in config.pools}
    if topo.single_hop:
        (one,) = set(topo.epps.values())
        epps = dict.fromkeys(sorted(names), one)
    else:
        epps = {
            pool.name: topo.epps[pool.name]
            if pool.name in topo.epps and not {"host", "port"} & pool.epp.model_fields_set
            else (pool.epp.host, pool.epp.port)
            for pool in config.pools
        }
    return dataclasses.replace(topo, epps=epps, original_dst_pools=topo.original_dst_pools & names)


def snapshot(config: GatewayConfig, topo: Topology) -> dict[str, Resources]:
    """Every resource type Envoy subscribes to, rendered from `config` (ValueError when the
    topology cannot serve it, e.g. a FailOpen pool in single-hop mode)."""
    listeners, clusters = render_resources(config, topology_for(config, topo))
    routes: list[RouteConfiguration] = []
    for listener in listeners:
        for chain in listener.filter_chains:
            for net_filter in chain.filters:
                assert net_filter.typed_config is not None
                hcm = net_filter.typed_config.unpack()
                assert isinstance(hcm, HttpConnectionManager) and hcm.route_config is not None
                routes.append(hcm.route_config)
                hcm.route_config = None
                hcm.rds = Rds(route_config_name=routes[-1].name, config_source=_ads())
                net_filter.typed_config = pack(hcm)
    return {
        CLUSTER: _pack(CLUSTER, clusters),
        LISTENER: _pack(LISTENER, listeners),
        ROUTE: _pack(ROUTE, routes),
    }


def _pack(type_url: str, items: Sequence[betterproto2.Message]) -> Resources:
    """The typed messages as the protobuf `Any`s grpcio sends (their wire bytes, as they are)."""
    wire = [bytes(item) for item in items]
    packed = tuple(any_pb2.Any(type_url=type_url, value=value) for value in wire)
    return Resources(hashlib.sha256(b"".join(wire)).hexdigest()[:16], packed)


def xds_bootstrap(admin_port: int, xds: tuple[str, int], tls: ExtProcTls | None) -> dict[str, Any]:
    """Envoy's bootstrap when the xDS server feeds it: admin, the xDS cluster, nothing else.
    Envoy is ready (`/ready`) once the first listeners, clusters and routes arrived."""
    return validated(
        Bootstrap(
            node=Node(id=NODE_ID, cluster=NODE_ID),
            admin=admin(admin_port),
            dynamic_resources=BootstrapDynamicResources(
                ads_config=ApiConfigSource(
                    api_type=ApiConfigSourceApiType.GRPC,
                    transport_api_version=ApiVersion.V3,
                    grpc_services=[GrpcService(envoy_grpc=GrpcServiceEnvoyGrpc(cluster_name=XDS_CLUSTER))],
                    set_node_on_first_message_only=True,
                ),
                lds_config=_ads(),
                cds_config=_ads(),
            ),
            static_resources=BootstrapStaticResources(clusters=[ext_proc_cluster(XDS_CLUSTER, *xds, tls)]),
        )
    )


def topology_to_json(topo: Topology) -> str:
    """The topology for `python -m gateway.xds --topology`: paths as strings, tuples as lists."""

    def plain(value: Any) -> Any:
        if isinstance(value, Path):
            return str(value)
        if isinstance(value, frozenset):
            return sorted(value)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
        if isinstance(value, dict):
            return {k: plain(v) for k, v in value.items()}
        if isinstance(value, (tuple, list)):
            return [plain(v) for v in value]
        return value

    return json.dumps(plain(topo), indent=1)


def topology_from_json(text: str) -> Topology:
    data = json.loads(text)

    def path(value: str | None) -> Path | None:
        return None if value is None else Path(value)

    tls = data.get("extproc_tls")
    return Topology(
        listen_port=data["listen_port"],
        admin_port=data["admin_port"],
        bbr=(data["bbr"][0], data["bbr"][1]) if data.get("bbr") else None,
        epps={pool: (host, port) for pool, (host, port) in data["epps"].items()},
        server_cert=path(data.get("server_cert")),
        server_key=path(data.get("server_key")),
        listen_host=data.get("listen_host", "127.0.0.1"),
        extproc_tls=ExtProcTls(Path(tls["client_cert"]), Path(tls["client_key"]), Path(tls["ca"]))
        if tls
        else None,
        ext_proc_timeout_s=data.get("ext_proc_timeout_s", 10.0),
        connection_buffer_bytes=data.get("connection_buffer_bytes", 4 * 1024 * 1024),
        fallback_endpoints=data.get("fallback_endpoints", {}),
        original_dst_pools=frozenset(data.get("original_dst_pools", ())),
        single_hop=data.get("single_hop", False),
    )
