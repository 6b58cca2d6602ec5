"""Envoy bootstraps shaped like the ones Envoy Gateway and kgateway generate for an
HTTPRoute whose backend is an InferencePool, so our EPP can be run behind each.

Test-only: the product renders its own bootstrap (gateway/envoy/bootstrap.py); these exist to
show that our EPP also works behind the ext_proc configuration other gateways generate. Built
from gateway/envoy/blocks.py and validated against the real protos like ours.

Sources read (through the code search tools; nothing copied, the shapes are re-expressed):

- Envoy Gateway, whose InferencePool support is the Envoy AI Gateway extension server
  (envoyproxy/ai-gateway at c217da8a, 2026-08-21): internal/extensionserver/inferencepool.go
  (`buildHTTPFilterForInferencePool`, `buildExtProcClusterForInferencePoolEndpointPicker`),
  post_cluster_modify.go (`handleInferencePoolCluster`), post_route_modify.go and
  post_translate_modify.go (`patchListenerWithInferencePoolFilters`,
  `patchVirtualHostWithInferencePool`). Envoy Gateway itself (envoyproxy/gateway at d32f282)
  only hands InferencePool backends to that extension server.
- kgateway (kgateway-dev/kgateway v2, InferencePool v1alpha2):
  internal/kgateway/extensions2/plugins/inferenceextension/endpointpicker/plugin.go
  (`ApplyForBackend`, `HttpFilters`, `buildExtProcCluster`) and backends.go
  (`processPoolBackendObjIR`).

What each renders, and so what these shapes render:

| | Envoy Gateway (AI Gateway) | kgateway |
|---|---|---|
| ext_proc filters | one per pool, before the router, disabled on every other route | one shared filter early in the chain, pointed at the pool by a per-route override |
| processing mode | headers SEND, request and response bodies FULL_DUPLEX_STREAMED, trailers SEND | the same |
| message timeout | 300 s | 5 s (gRPC timeout 10 s on the override) |
| failure mode | `failure_mode_allow: false` whatever the pool says | per-route `failure_mode_allow` = pool is FailOpen |
| metadata | none: the destination is read from the header | forwards `envoy.lb.subset_hint`, receives `envoy.lb`; a header_to_metadata filter copies the header into `envoy.lb` |
| pool cluster | ORIGINAL_DST, `use_http_header` on `x-gateway-destination-endpoint`, HTTP/1.1 | STATIC list of the pool's endpoints with `envoy.lb` host metadata, subset LB on `x-gateway-destination-endpoint`, fallback ANY_ENDPOINT |
| route | `auto_host_rewrite: false` | `metadata_match` `envoy.lb.subset_hint` lists the pool's endpoints |
| EPP cluster | STRICT_DNS Service name, LEAST_REQUEST, TLS without verification, HTTP/2 | the same |
| several pools on one rule | refused ("at most one inferencepool ... per route rule") | one backend per weighted cluster |

Local substitutions: the EPP's Service DNS name becomes its loopback address (a STATIC
cluster, same TLS and HTTP/2 settings); the HTTPRoute's path match rewrites to `/` so the
model server sees its own path (HTTPRoute `URLRewrite` `ReplacePrefixMatch`). For kgateway's
weighted rules the per-backend settings go on each `weighted_clusters` entry (its
RouteBackendContext); the stored plugin version sets a single cluster, so that is our reading.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from envoy.extensions.filters.http.header_to_metadata.v3 import header_to_metadata_pb2  # noqa: F401
from envoy_data_plane.envoy.config.cluster.v3 import (
    CircuitBreakers,
    CircuitBreakersThresholds,
    Cluster,
    ClusterDiscoveryType,
    ClusterLbPolicy,
    ClusterLbSubsetConfig,
    ClusterLbSubsetConfigLbSubsetFallbackPolicy,
    ClusterLbSubsetConfigLbSubsetSelector,
    ClusterOriginalDstLbConfig,
)
from envoy_data_plane.envoy.config.core.v3 import (
    GrpcService,
    GrpcServiceEnvoyGrpc,
    Http1ProtocolOptions,
    Http2ProtocolOptions,
    Metadata,
    TransportSocket,
)
from envoy_data_plane.envoy.config.endpoint.v3 import (
    ClusterLoadAssignment,
    Endpoint,
    LbEndpoint,
    LocalityLbEndpoints,
)
from envoy_data_plane.envoy.config.route.v3 import (
    Route,
    RouteAction,
    RouteConfiguration,
    RouteMatch,
    VirtualHost,
    WeightedCluster,
    WeightedClusterClusterWeight,
)
from envoy_data_plane.envoy.extensions.filters.http.ext_proc.v3 import (
    ExternalProcessor,
    ExtProcOverrides,
    ExtProcPerRoute,
    MetadataOptions,
    MetadataOptionsMetadataNamespaces,
    ProcessingMode,
)
from envoy_data_plane.envoy.extensions.filters.http.header_to_metadata.v3 import (
    Config as HeaderToMetadata,
)
from envoy_data_plane.envoy.extensions.filters.http.header_to_metadata.v3 import (
    ConfigKeyValuePair,
    ConfigRule,
    ConfigValueType,
)
from envoy_data_plane.envoy.extensions.filters.network.http_connection_manager.v3 import (
    HttpConnectionManager,
    HttpConnectionManagerCodecType,
    HttpFilter,
)
from envoy_data_plane.envoy.extensions.transport_sockets.tls.v3 import (
    CertificateValidationContext,
    CommonTlsContext,
    UpstreamTlsContext,
)
from envoy_data_plane.envoy.extensions.upstreams.http.v3 import (
    HttpProtocolOptions,
    HttpProtocolOptionsExplicitHttpConfig,
)
from envoy_data_plane.google.protobuf import Any as AnyMessage
from envoy_data_plane.google.protobuf import Struct

from gateway.envoy.blocks import (
    TLS_SOCKET,
    BodyMode,
    bootstrap,
    http_filter,
    https_listener,
    pack,
    processing_mode,
    router_filter,
    seconds,
    socket,
    split_host_port,
)

DESTINATION = "x-gateway-destination-endpoint"
Shape = Literal["envoy-gateway", "kgateway"]
SHAPES: tuple[Shape, ...] = ("envoy-gateway", "kgateway")


@dataclass(frozen=True, slots=True)
class InferencePoolBackend:
    """What a controller knows about one InferencePool: its endpoints (pods x targetPorts),
    its EPP and its failure mode."""

    name: str
    endpoints: tuple[str, ...]  # ip:port
    epp: tuple[str, int]
    fail_open: bool = False
    namespace: str = "default"


@dataclass(frozen=True, slots=True)
class Rule:
    """One HTTPRoute rule: a path prefix and its weighted InferencePool backendRefs."""

    path_prefix: str  # "/name/" : matched, then rewritten to "/"
    backends: tuple[tuple[str, int], ...]  # (pool name, weight)


@dataclass(frozen=True, slots=True)
class Gateway:
    listen_port: int
    admin_port: int
    rules: tuple[Rule, ...]
    pools: Mapping[str, InferencePoolBackend]


def render(shape: Shape, gw: Gateway) -> dict[str, Any]:
    if shape == "envoy-gateway":
        return _envoy_gateway(gw)
    return _kgateway(gw)


# -- shared pieces -------------------------------------------------------------------------


def _full_duplex_mode() -> ProcessingMode:
    return processing_mode(
        request_headers=True,
        request_body=BodyMode.FULL_DUPLEX_STREAMED,
        request_trailers=True,
        response_headers=True,
        response_body=BodyMode.FULL_DUPLEX_STREAMED,
        response_trailers=True,
    )


def _http_version(version: Literal[1, 2]) -> dict[str, AnyMessage]:
    if version == 1:
        explicit = HttpProtocolOptionsExplicitHttpConfig(http_protocol_options=Http1ProtocolOptions())
    else:
        explicit = HttpProtocolOptionsExplicitHttpConfig(http2_protocol_options=Http2ProtocolOptions())
    return {
        "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": pack(
            HttpProtocolOptions(explicit_http_config=explicit)
        )
    }


def _epp_cluster(name: str, host: str, port: int) -> Cluster:
    """Both: the EPP behind TLS that does not verify the certificate, HTTP/2, least request."""
    tls = UpstreamTlsContext(
        common_tls_context=CommonTlsContext(validation_context=CertificateValidationContext())
    )
    return Cluster(
        name=name,
        type=ClusterDiscoveryType.STATIC,  # STRICT_DNS on the EPP Service's name in a cluster
        connect_timeout=seconds(10),
        lb_policy=ClusterLbPolicy.LEAST_REQUEST,
        load_assignment=ClusterLoadAssignment(
            cluster_name=name,
            endpoints=[
                LocalityLbEndpoints(lb_endpoints=[LbEndpoint(endpoint=Endpoint(address=socket(host, port)))])
            ],
        ),
        transport_socket=TransportSocket(name=TLS_SOCKET, typed_config=pack(tls)),
        typed_extension_protocol_options=_http_version(2),
    )


def _epp_grpc(cluster: str, pool: InferencePoolBackend, timeout_s: float | None = None) -> GrpcService:
    return GrpcService(
        envoy_grpc=GrpcServiceEnvoyGrpc(
            cluster_name=cluster, authority=f"{pool.name}-epp.{pool.namespace}.svc:9002"
        ),
        timeout=None if timeout_s is None else seconds(timeout_s),
    )


def _hcm(name: str, routes: list[Route], filters: list[HttpFilter]) -> HttpConnectionManager:
    return HttpConnectionManager(
        stat_prefix=name,
        codec_type=HttpConnectionManagerCodecType.AUTO,
        route_config=RouteConfiguration(
            name=name, virtual_hosts=[VirtualHost(name=name, domains=["*"], routes=routes)]
        ),
        http_filters=[*filters, router_filter()],
    )


def _finish(gw: Gateway, name: str, hcm: HttpConnectionManager, clusters: list[Cluster]) -> dict[str, Any]:
    listener = https_listener("127.0.0.1", gw.listen_port, None, None, 4 * 1024 * 1024, hcm)
    return bootstrap(gw.admin_port, [listener], clusters)


# -- Envoy Gateway + Envoy AI Gateway extension server --------------------------------------


def _eg_filter_name(pool: InferencePoolBackend) -> str:
    return f"envoy.filters.http.ext_proc/endpointpicker/{pool.name}_{pool.namespace}_ext_proc"


def _eg_epp_cluster_name(pool: InferencePoolBackend) -> str:
    return f"envoy.clusters.endpointpicker_{pool.name}_{pool.namespace}_ext_proc"


def _envoy_gateway(gw: Gateway) -> dict[str, Any]:
    filters: list[HttpFilter] = []
    clusters: list[Cluster] = []
    routes: list[Route] = []
    for pool in gw.pools.values():
        config = ExternalProcessor(
            grpc_service=_epp_grpc(_eg_epp_cluster_name(pool), pool),
            processing_mode=_full_duplex_mode(),
            allow_mode_override=False,
            message_timeout=seconds(300),
            failure_mode_allow=False,  # the translator ignores the pool's failureMode
        )
        filters.append(http_filter(_eg_filter_name(pool), config))
        clusters.append(_epp_cluster(_eg_epp_cluster_name(pool), *pool.epp))
    for index, rule in enumerate(gw.rules):
        if len(rule.backends) != 1:
            raise ValueError(
                "Envoy AI Gateway refuses a rule with several InferencePools "
                "('at most one inferencepool can be referenced per route rule')"
            )
        pool = gw.pools[rule.backends[0][0]]
        cluster = f"httproute/default/route/rule/{index}"
        clusters.append(
            Cluster(
                name=cluster,
                type=ClusterDiscoveryType.ORIGINAL_DST,
                lb_policy=ClusterLbPolicy.CLUSTER_PROVIDED,
                connect_timeout=seconds(10),
                original_dst_lb_config=ClusterOriginalDstLbConfig(
                    use_http_header=True, http_header_name=DESTINATION
                ),
                typed_extension_protocol_options=_http_version(1),
            )
        )
        routes.append(
            Route(
                match=RouteMatch(prefix=rule.path_prefix),
                route=RouteAction(
                    cluster=cluster, prefix_rewrite="/", auto_host_rewrite=False, timeout=seconds(0)
                ),
                typed_per_filter_config={
                    _eg_filter_name(other): pack(ExtProcPerRoute(disabled=True))
                    for other in gw.pools.values()
                    if other.name != pool.name
                },
            )
        )
    return _finish(gw, "envoy-gateway", _hcm("envoy-gateway", routes, filters), clusters)


# -- kgateway ---------------------------------------------------------------------------------

_KG_FILTER = "inference-pool-endpoint-picker"  # kgateway's wellknown.InfPoolTransformationFilterName


def _kg_epp_cluster_name(pool: InferencePoolBackend) -> str:
    return f"endpointpicker_{pool.name}_{pool.namespace}_ext_proc"


def _kg_pool_cluster_name(pool: InferencePoolBackend) -> str:
    return f"endpoint-picker_{pool.name}_{pool.namespace}"


def _kg_pool_cluster(pool: InferencePoolBackend) -> Cluster:
    name = _kg_pool_cluster_name(pool)
    hosts = [
        LbEndpoint(
            endpoint=Endpoint(address=socket(*split_host_port(address))),
            load_balancing_weight=1,
            metadata=Metadata(filter_metadata={"envoy.lb": Struct.from_dict({DESTINATION: address})}),
        )
        for address in pool.endpoints
    ]
    return Cluster(
        name=name,
        type=ClusterDiscoveryType.STATIC,
        lb_policy=ClusterLbPolicy.ROUND_ROBIN,
        connect_timeout=seconds(5),
        lb_subset_config=ClusterLbSubsetConfig(
            subset_selectors=[ClusterLbSubsetConfigLbSubsetSelector(keys=[DESTINATION])],
            fallback_policy=ClusterLbSubsetConfigLbSubsetFallbackPolicy.ANY_ENDPOINT,
        ),
        ignore_health_on_host_removal=True,
        load_assignment=ClusterLoadAssignment(
            cluster_name=name, endpoints=[LocalityLbEndpoints(lb_endpoints=hosts)]
        ),
        circuit_breakers=CircuitBreakers(
            thresholds=[
                CircuitBreakersThresholds(
                    max_connections=40000, max_pending_requests=40000, max_requests=40000
                )
            ]
        ),
        typed_extension_protocol_options=_http_version(1),
    )


def _kg_subset_hint(pool: InferencePoolBackend) -> Metadata:
    """What kgateway's ApplyForBackend matches for one InferencePool backend."""
    hint = Struct.from_dict({f"{DESTINATION}-subset": list(pool.endpoints)})
    return Metadata(filter_metadata={"envoy.lb.subset_hint": hint})


def _kg_override(pool: InferencePoolBackend) -> dict[str, AnyMessage]:
    """The per-route ext_proc settings ApplyForBackend adds for one InferencePool backend."""
    override = ExtProcOverrides(
        failure_mode_allow=pool.fail_open,
        grpc_service=_epp_grpc(_kg_epp_cluster_name(pool), pool, timeout_s=10),
    )
    return {_KG_FILTER: pack(ExtProcPerRoute(overrides=override))}


def _kgateway(gw: Gateway) -> dict[str, Any]:
    placeholder = InferencePoolBackend(
        "placeholder-pool", (), ("127.0.0.1", 9002), namespace="placeholder-namespace"
    )
    picker = ExternalProcessor(
        grpc_service=_epp_grpc(_kg_epp_cluster_name(placeholder), placeholder),
        processing_mode=_full_duplex_mode(),
        message_timeout=seconds(5),
        failure_mode_allow=False,
        metadata_options=MetadataOptions(
            forwarding_namespaces=MetadataOptionsMetadataNamespaces(untyped=["envoy.lb.subset_hint"]),
            receiving_namespaces=MetadataOptionsMetadataNamespaces(untyped=["envoy.lb"]),
        ),
    )
    header_to_metadata = HeaderToMetadata(
        request_rules=[
            ConfigRule(
                header=DESTINATION,
                on_header_present=ConfigKeyValuePair(
                    metadata_namespace="envoy.lb", key=DESTINATION, type=ConfigValueType.STRING
                ),
                remove=False,
            )
        ]
    )
    filters = [
        http_filter(_KG_FILTER, picker),
        http_filter("envoy.filters.http.header_to_metadata", header_to_metadata),
    ]
    clusters = [_kg_pool_cluster(p) for p in gw.pools.values()]
    clusters += [_epp_cluster(_kg_epp_cluster_name(p), *p.epp) for p in gw.pools.values()]
    routes = []
    for rule in gw.rules:
        action = RouteAction(prefix_rewrite="/", timeout=seconds(0))
        route = Route(match=RouteMatch(prefix=rule.path_prefix), route=action)
        if len(rule.backends) == 1:
            pool = gw.pools[rule.backends[0][0]]
            action.cluster = _kg_pool_cluster_name(pool)
            action.metadata_match = _kg_subset_hint(pool)
            route.typed_per_filter_config = _kg_override(pool)
        else:
            action.weighted_clusters = WeightedCluster(
                clusters=[
                    WeightedClusterClusterWeight(
                        name=_kg_pool_cluster_name(gw.pools[name]),
                        weight=weight,
                        metadata_match=_kg_subset_hint(gw.pools[name]),
                        typed_per_filter_config=_kg_override(gw.pools[name]),
                    )
                    for name, weight in rule.backends
                ]
            )
        routes.append(route)
    return _finish(gw, "kgateway", _hcm("kgateway", routes, filters), clusters)
