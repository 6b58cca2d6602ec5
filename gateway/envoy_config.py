"""Render the Envoy bootstrap from the gateway configuration.

Built from envoy-data-plane's typed messages (gateway/envoy_blocks.py): a misspelt field or a
wrong type fails where the message is constructed (and under mypy), not when Envoy loads the
file. The result is serialised as proto-JSON (`envoy_blocks.plain`: Envoy's field names, proto
field order, default values left out), then parsed by `json_format.ParseDict` into the real
`Bootstrap` of xds-protos, the descriptors Envoy is built from; the integration tests run
`envoy --mode validate` on the result. The xDS server (gateway/xds_resources.py) sends the
very same messages as its resources. One source of truth (the gateway config) feeds the
services, this file and the xDS resources.

Request path per pool (see README):
  strip client x-gateway-* headers -> BBR ext_proc (sets x-gateway-model-name) ->
  route on the model header -> that pool's EPP ext_proc (per-route override) ->
  the pool's cluster, which reads the destination from `envoy.lb` metadata only, so a
  client-sent destination header can never steer traffic.
Single-hop (`Topology.single_hop`, standalone Envoy only): strip -> one EPP ext_proc for every
pool, which sets the model headers and the destination in one reply -> the pool's cluster.

Pools with static endpoints use a STATIC cluster of exactly those pods with the OverrideHost
load-balancing policy: the metadata value is `primary` or `primary,fallback1,fallback2` (ip:port,
comma-separated, best first, IPv6 in brackets); each retry (connect failure, refused stream,
reset or 503 before the response started, `_retry_policy`) takes the next address of the list
(past it, least-request among the other members), within the cluster's retry budget, and only
cluster members can ever be chosen, so even a compromised EPP cannot send traffic outside the
pool. Kubernetes-discovered pools keep ORIGINAL_DST (their pods are not known at render time):
one address, no retry;
`Topology.original_dst_pools` renders a static pool that way too, so the local gateway and
its tests run the very cluster kind Kubernetes deployments use.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from envoy_data_plane.envoy.config.accesslog.v3 import AccessLogFilter, ExtensionFilter
from envoy_data_plane.envoy.config.cluster.v3 import (
    CircuitBreakers,
    CircuitBreakersThresholds,
    CircuitBreakersThresholdsRetryBudget,
    Cluster,
    ClusterDiscoveryType,
    ClusterDnsLookupFamily,
    ClusterLbPolicy,
    ClusterOriginalDstLbConfig,
    LoadBalancingPolicy,
    LoadBalancingPolicyPolicy,
    OutlierDetection,
)
from envoy_data_plane.envoy.config.common.mutation_rules.v3 import HeaderMutation as RequestMutation
from envoy_data_plane.envoy.config.common.mutation_rules.v3 import HeaderMutationRules
from envoy_data_plane.envoy.config.core.v3 import (
    DataSource,
    GrpcService,
    GrpcServiceEnvoyGrpc,
    HealthCheck,
    HealthCheckGrpcHealthCheck,
    HttpProtocolOptions,
    SubstitutionFormatString,
    TransportSocket,
    TypedExtensionConfig,
)
from envoy_data_plane.envoy.config.core.v3 import RetryPolicy as CoreRetryPolicy
from envoy_data_plane.envoy.config.core.v3 import (
    RetryPolicyRetryHostPredicate as CoreRetryPolicyRetryHostPredicate,
)
from envoy_data_plane.envoy.config.listener.v3 import Listener
from envoy_data_plane.envoy.config.route.v3 import (
    DirectResponseAction,
    HeaderMatcher,
    RetryPolicy,
    RetryPolicyRetryHostPredicate,
    Route,
    RouteAction,
    RouteConfiguration,
    RouteMatch,
    VirtualHost,
)
from envoy_data_plane.envoy.extensions.access_loggers.filters.cel.v3 import ExpressionFilter
from envoy_data_plane.envoy.extensions.filters.http.ext_proc.v3 import (
    ExtProcOverrides,
    ExtProcPerRoute,
    MetadataOptions,
    MetadataOptionsMetadataNamespaces,
    ProcessingMode,
)
from envoy_data_plane.envoy.extensions.filters.http.header_mutation.v3 import HeaderMutation, Mutations
from envoy_data_plane.envoy.extensions.filters.http.jwt_authn.v3 import (
    JwtAuthentication,
    JwtClaimToHeader,
    JwtProvider,
    JwtRequirement,
    RequirementRule,
)
from envoy_data_plane.envoy.extensions.filters.network.http_connection_manager.v3 import (
    HttpConnectionManager,
    HttpConnectionManagerCodecType,
    HttpFilter,
    LocalReplyConfig,
    ResponseMapper,
)
from envoy_data_plane.envoy.extensions.load_balancing_policies.least_request.v3 import LeastRequest
from envoy_data_plane.envoy.extensions.load_balancing_policies.override_host.v3 import (
    OverrideHost,
    OverrideHostOverrideHostSource,
)
from envoy_data_plane.envoy.extensions.retry.host.previous_hosts.v3 import PreviousHostsPredicate
from envoy_data_plane.envoy.extensions.transport_sockets.tls.v3 import (
    CertificateValidationContext,
    CommonTlsContext,
    SubjectAltNameMatcher,
    SubjectAltNameMatcherSanType,
    UpstreamTlsContext,
)
from envoy_data_plane.envoy.type.matcher.v3 import RegexMatcher, StringMatcher
from envoy_data_plane.envoy.type.metadata.v3 import MetadataKey, MetadataKeyPathSegment
from envoy_data_plane.envoy.type.v3 import HttpStatus, Percent, StatusCode
from envoy_data_plane.google.protobuf import Struct

from extproc.errors import ANTHROPIC_PATHS, error_payload
from extproc.headers import (
    CLAIM_HEADER,
    DESTINATION_HEADER,
    MODEL_HEADER,
    PREFILLER_HEADERS,
    TENANT_CLAIM_HEADER,
)
from gateway.config import MODELS_PATH, GatewayConfig, PoolConfig, is_ip, replica_addresses
from gateway.envoy_blocks import (
    TLS_SOCKET,
    BodyMode,
    bootstrap,
    ext_processor,
    grpc_cluster,
    header,
    http_filter,
    json_error_route,
    pack,
    processing_mode,
    router_filter,
    seconds,
    static_load_assignment,
    tls_certificate,
    topology_listener,
)

ERROR_DETAILS_PREFIX = "gateway_"  # ImmediateResponse details set by our ext_proc services
EPP_FILTER = "gateway.epp"
BBR_FILTER = "gateway.bbr"


# A picked pod that fails before the response started (connection refused, stream refused or
# reset, 503) moves the request to the next pod of the EPP's ranked list; Envoy cannot retry once
# response headers went to the client, so a started stream is never run twice (docs/scheduling.md,
# "Retries").
RETRY_ON = "connect-failure,refused-stream,reset,retriable-status-codes"
# 503 says "not now" (an overloaded or draining engine); a 500 may be the request's own fault.
RETRIABLE_STATUS_CODES = (503,)
RETRIES = 2
# Concurrent retries a pool cluster allows: this share of its active and pending requests, never
# fewer than the floor (a burst of connect failures at low load). A retry counts from Envoy's
# decision to the retried attempt's response headers: when every pod of a pool fails, the
# retries in flight stay within this share of its requests instead of each being tried 3 times.
RETRY_BUDGET_PERCENT = 20.0
RETRY_BUDGET_MIN_CONCURRENCY = 16


@dataclass(frozen=True, slots=True)
class ExtProcTls:
    """mTLS from Envoy to the ext_proc services: Envoy's client cert and the CA it trusts."""

    client_cert: Path
    client_key: Path
    ca: Path


@dataclass(frozen=True, slots=True)
class Topology:
    """Where everything listens: the part of the bootstrap that is not gateway policy."""

    listen_port: int
    admin_port: int
    bbr: tuple[str, int] | None  # None in single-hop mode
    # pool name -> EPP host, port (an IP or a DNS name); with `pools[].epp.replicas` > 1 and an
    # IP, the replicas listen on port, port + 1, ... (`EppAddress.addresses`).
    epps: Mapping[str, tuple[str, int]]
    server_cert: Path | None  # None: plain HTTP listener (TLS terminated in front, e.g. an NLB)
    server_key: Path | None
    listen_host: str = "127.0.0.1"
    extproc_tls: ExtProcTls | None = None
    ext_proc_timeout_s: float = 10.0
    connection_buffer_bytes: int = 4 * 1024 * 1024
    fallback_endpoints: Mapping[str, list[str]] = field(default_factory=dict)  # FailOpen pools
    # Static pools rendered as ORIGINAL_DST (the Kubernetes cluster kind) instead of OverrideHost.
    original_dst_pools: frozenset[str] = frozenset()
    # Single-hop mode (epp/single_hop.py): no BBR; one EPP serves every pool (each entry of
    # `epps` names it) and one ext_proc stream both routes by model and picks the pod.
    single_hop: bool = False


# Several EPP replicas behind one cluster: a dead replica leaves the rotation at its first
# failed health check (gRPC health, service "") or refused connection, so new ext_proc streams
# go to the live ones; streams it held fail (their requests get the pool's failure mode).
def _replica_health_check() -> HealthCheck:
    return HealthCheck(
        timeout=seconds(1),
        interval=seconds(1),
        no_traffic_interval=seconds(1),
        unhealthy_threshold=1,
        healthy_threshold=1,
        grpc_health_check=HealthCheckGrpcHealthCheck(),
    )


def _replica_outlier_detection() -> OutlierDetection:
    return OutlierDetection(
        split_external_local_origin_errors=True,
        consecutive_local_origin_failure=1,
        interval=seconds(1),
        base_ejection_time=seconds(5),
        max_ejection_percent=100,
    )


# Streams Envoy puts on one connection to an ext_proc service before it opens another. Each
# request holds its EPP stream until the response ends, so the connections grow with the load;
# an EPP with workers (epp/workers/processes.py) shares its port over SO_REUSEPORT and the kernel spreads
# connections, not streams, over the workers. Measured through Envoy (--concurrency 1), 40
# concurrent requests over 2 workers: no limit 40/0 (one connection), 8 -> 32/8, 4 -> 28/12.
EXT_PROC_STREAMS_PER_CONNECTION = 4


def replica_retry_policy(replicas: int) -> CoreRetryPolicy | None:
    """With several EPP replicas, an ext_proc stream that could not reach one (it died and
    Envoy's health check has not seen it yet: connection refused) opens on another: nothing
    reached the dead one, so the request is routed as if it never had been."""
    if replicas < 2:
        return None
    return CoreRetryPolicy(
        retry_on="connect-failure,refused-stream,reset-before-request",
        num_retries=min(replicas - 1, RETRIES),
        retry_host_predicate=[
            CoreRetryPolicyRetryHostPredicate(
                name="envoy.retry_host_predicates.previous_hosts", typed_config=pack(PreviousHostsPredicate())
            )
        ],
        host_selection_retry_max_attempts=3,
    )


def ext_proc_cluster(
    name: str, host: str, port: int, tls: ExtProcTls | None, *, replicas: int = 1
) -> Cluster:
    """An ext_proc service: a fixed IP locally, a Service DNS name in Kubernetes. `replicas`
    > 1: that many endpoints on consecutive ports (IP) or whatever the name resolves to (a
    headless Service), health-checked so that losing one moves new streams to the others."""
    ip = is_ip(host)
    endpoints = replica_addresses(host, port, replicas)
    kind = ClusterDiscoveryType.STATIC if ip else ClusterDiscoveryType.STRICT_DNS
    cluster = grpc_cluster(
        name, endpoints, cluster_type=kind, max_concurrent_streams=EXT_PROC_STREAMS_PER_CONNECTION
    )
    if replicas > 1:
        cluster.health_checks = [_replica_health_check()]
        cluster.outlier_detection = _replica_outlier_detection()
    # Each in-flight request holds one EPP stream until its response ends (see
    # `pool_processing_mode`), so Envoy's default of 1,024 requests per cluster would cap a pool
    # at 1,024 concurrent requests (measured with the limit at 2: the 3rd stream got a 503).
    cluster.circuit_breakers = _circuit_breakers()
    if not ip:
        cluster.dns_lookup_family = ClusterDnsLookupFamily.V4_PREFERRED
    if tls is not None:
        # The service must present a certificate for the very name (or IP) Envoy dials.
        san = SubjectAltNameMatcher(
            san_type=SubjectAltNameMatcherSanType.IP_ADDRESS if ip else SubjectAltNameMatcherSanType.DNS,
            matcher=StringMatcher(exact=host),
        )
        context = UpstreamTlsContext(
            sni="localhost" if ip else host,
            common_tls_context=CommonTlsContext(
                tls_certificates=[tls_certificate(tls.client_cert, tls.client_key)],
                validation_context=CertificateValidationContext(
                    trusted_ca=DataSource(filename=str(tls.ca)), match_typed_subject_alt_names=[san]
                ),
            ),
        )
        cluster.transport_socket = TransportSocket(name=TLS_SOCKET, typed_config=pack(context))
    return cluster


def pool_processing_mode(
    *, response_headers: bool, buffered: bool = False, response_trailers: bool | None = None
) -> ProcessingMode:
    """FULL_DUPLEX_STREAMED (`listener.requestBodyMode: streamed`) or BUFFERED
    (`requestBodyMode: buffered`, and where FailOpen must work, since Envoy ignores
    `failure_mode_allow` for streamed bodies). Buffered bodies are bounded by the listener's
    per-connection buffer (`listener.maxBufferedBodyBytes`): past it Envoy answers 413 itself.

    `response_headers` (the EPP's accounting) also asks for response trailers: Envoy closes
    the ext_proc stream right after the response-headers reply when neither body nor trailers
    are wanted, and an SSE answer's headers come at once, so the in-flight slot would be freed
    at the first token. With trailers wanted, Envoy keeps the stream until the HTTP stream
    ends (last byte, reset or abort). Measured with Envoy 1.40: an HTTP/1.1 answer without
    trailers costs no extra message (none is synthesized), only the stream held open.

    `response_trailers` alone (True, with `response_headers` False) is what the EPP's ledger
    needs: the stream is still held to the response's end, and Envoy neither sends the response
    headers to the EPP nor holds them (and the first bytes behind them) for its reply. The pool
    routes ask for the headers too only where a feature reads them
    (`GatewayConfig.epp_reads_response_headers`).
    """
    return processing_mode(
        request_headers=True,
        request_body=BodyMode.BUFFERED if buffered else BodyMode.FULL_DUPLEX_STREAMED,
        request_trailers=not buffered,
        response_headers=response_headers,
        response_body=BodyMode.NONE,
        response_trailers=response_headers if response_trailers is None else response_trailers,
    )


def _ext_proc_filter(
    name: str, cluster: str, topo: Topology, *, response_headers: bool, buffered: bool, replicas: int = 1
) -> HttpFilter:
    config = ext_processor(
        cluster,
        topo.ext_proc_timeout_s,
        pool_processing_mode(response_headers=response_headers, buffered=buffered),
        retry_policy=replica_retry_policy(replicas),
    )
    config.status_on_error = HttpStatus(code=StatusCode.ServiceUnavailable)
    config.allow_mode_override = False
    config.mutation_rules = HeaderMutationRules(allow_all_routing=True)
    if name == EPP_FILTER:
        config.metadata_options = MetadataOptions(
            receiving_namespaces=MetadataOptionsMetadataNamespaces(untyped=["envoy.lb"])
        )
        # The endpoint that actually served (a retry may have moved it along the ranked list),
        # sent with the response headers: the EPP moves the in-flight slot there.
        config.response_attributes = ["upstream.address"]
    return http_filter(name, config)


def _invalid_request(
    name: str, status: int, message: str, code: str, match: RouteMatch, *, anthropic: bool = False
) -> Route:
    return json_error_route(name, match, status, message, "invalid_request_error", code, anthropic=anthropic)


def _models_list(config: GatewayConfig) -> str:
    data = [
        {"id": name, "object": "model", "owned_by": "inference-gateway", "root": route.base_model}
        for name, route in sorted(config.routes().items())
    ]
    return json.dumps({"object": "list", "data": data})


def _pool_paths(config: GatewayConfig) -> list[str] | None:
    """The paths routed to pools: None for every path (`allowAllPaths`); `/v1/models` never,
    since Envoy answers it from the configuration."""
    if config.listener.allow_all_paths:
        return None
    return [p for p in config.listener.paths if p != MODELS_PATH]


def _path_match(paths: list[str] | None) -> RouteMatch:
    """Any path, or exactly the given ones (Envoy matches the path without its query string)."""
    if paths is None:
        return RouteMatch(prefix="/")
    return RouteMatch(safe_regex=RegexMatcher(regex="|".join(_regex_escape(p) for p in paths)))


def _served_routes(config: GatewayConfig, topo: Topology) -> list[Route]:
    """Everything after `/v1/models`: the pools, then Envoy's own JSON errors.

    With the allow-list (the default) a path outside it, or a method other than POST on an
    inference path, never reaches BBR, an EPP or a pod: the routes answering them have BBR
    disabled here and the EPP disabled on every direct response.
    """
    paths = _pool_paths(config)
    if paths is None:  # allowAllPaths: any path and method goes to the pools
        return [*_pool_routes(config, topo, _path_match(None)), *_no_routes(None)]
    routes: list[Route] = []
    if paths:
        routes += _pool_routes(config, topo, _with_headers(_path_match(paths), _method("POST")))
        routes += _no_routes(paths, _method("POST"))
        messages = _messages_paths(paths)
        if messages:  # Anthropic's paths answer in Anthropic's error shape
            refusal = _method_not_allowed("messages-method-not-allowed", _path_match(messages), "POST", True)
            routes.append(_without_bbr(refusal, topo))
        routes.append(
            _without_bbr(_method_not_allowed("method-not-allowed", _path_match(paths), "POST"), topo)
        )
    not_served = _invalid_request(
        "path-not-served",
        404,
        f"this gateway serves only these paths: {', '.join(config.listener.paths)}",
        "not_found",
        RouteMatch(prefix="/"),
    )
    return [*routes, _without_bbr(not_served, topo)]


def _method(name: str) -> HeaderMatcher:
    return HeaderMatcher(name=":method", string_match=StringMatcher(exact=name))


def _present(name: str) -> HeaderMatcher:
    return HeaderMatcher(name=name, present_match=True)


def _with_headers(match: RouteMatch, *headers: HeaderMatcher) -> RouteMatch:
    """`match` narrowed by more header matchers (all must hold)."""
    return dataclasses.replace(match, headers=[*match.headers, *headers])


def _disabled() -> ExtProcPerRoute:
    return ExtProcPerRoute(disabled=True)


def _without_bbr(route: Route, topo: Topology) -> Route:
    """A route Envoy answers from the request line alone: BBR need not read the body."""
    if not topo.single_hop:
        route.typed_per_filter_config[BBR_FILTER] = pack(_disabled())
    return route


def _method_not_allowed(name: str, match: RouteMatch, allowed: str, anthropic: bool = False) -> Route:
    """A served path with another method: a JSON 405 naming the one it takes (`allow`, RFC 9110)."""
    message = f"this path takes {allowed} only"
    route = _invalid_request(name, 405, message, "method_not_allowed", match, anthropic=anthropic)
    route.response_headers_to_add.append(header("allow", allowed))
    return route


def _messages_paths(paths: list[str] | None) -> list[str]:
    """Anthropic's Messages API paths among the served ones (all of them with `allowAllPaths`)."""
    return [p for p in ANTHROPIC_PATHS if paths is None or p in paths]


def _no_routes(paths: list[str] | None, *headers: HeaderMatcher) -> list[Route]:
    """`_no_route` for the served paths (requests carrying `headers`), Anthropic's paths first
    with its error shape."""
    routes: list[Route] = []
    messages = _messages_paths(paths)
    if messages:
        routes += _no_route(_with_headers(_path_match(messages), *headers), anthropic=True)
    return routes + _no_route(_with_headers(_path_match(paths), *headers))


def _no_route(match: RouteMatch, *, anthropic: bool = False) -> list[Route]:
    """After BBR (or the single-hop EPP) routed, no pool route took the request.

    With a model header, the model is one Envoy's routes do not know (yet: the services
    checked it against a configuration Envoy has not received): a 404 `model_not_found` naming
    it. Envoy substitutes the name into a JSON body, so it is escaped, never spliced. Without
    one (no body to route on) the request named no model at all. `anthropic`: the routes of
    Anthropic's paths (named `no-route-messages...`), in its error shape.
    """
    name = "no-route-messages" if anthropic else "no-route"
    message = f"The model '%REQ({MODEL_HEADER})%' has no route in this gateway"
    error = error_payload(404, message, "model_not_found", anthropic=anthropic, error_type="not_found_error")
    unknown_model = Route(
        name=f"{name}-model",
        match=_with_headers(match, _present(MODEL_HEADER)),
        direct_response=DirectResponseAction(status=404, body_format=_json_body(error)),
    )
    api = "an Anthropic Messages API" if anthropic else "an OpenAI-compatible"
    no_model = f"no route: send {api} JSON request with a 'model' field"
    return [
        unknown_model,
        _invalid_request(name, 404, no_model, "route_not_found", match, anthropic=anthropic),
    ]


def _json_body(payload: dict[str, Any]) -> SubstitutionFormatString:
    """A JSON error body with Envoy's substitutions (%REQ(...)%, ...) in its strings."""
    return SubstitutionFormatString(json_format=Struct.from_dict(payload), content_type="application/json")


def _pool_routes(config: GatewayConfig, topo: Topology, path: RouteMatch) -> list[Route]:
    """Two routes per pool (one in single-hop), matching `path` (paths and method) and the model."""
    routes: list[Route] = []
    for pool in config.pools:
        names = [m.name for m in pool.models] + [a for m in pool.models for a in m.adapters]
        model_match = HeaderMatcher(
            name=MODEL_HEADER,
            string_match=StringMatcher(
                safe_regex=RegexMatcher(regex="|".join(_regex_escape(n) for n in names))
            ),
        )
        # 1) After the EPP chose: route by `envoy.lb` metadata to the chosen pod.
        picked = RouteAction(cluster=f"pool-{pool.name}", timeout=seconds(0), idle_timeout=seconds(300))
        if _override_host(pool, topo):
            picked.retry_policy = _retry_policy()
        routes.append(
            Route(
                name=f"{pool.name}-picked",
                match=_with_headers(path, model_match, _present(DESTINATION_HEADER)),
                route=picked,
                request_headers_to_remove=[
                    CLAIM_HEADER,
                    TENANT_CLAIM_HEADER,
                ],  # the pod needs no client identity
            )
        )
        if topo.single_hop:  # the one EPP already chose, on the entry route (`_single_hop_entry`)
            continue
        # 2) Before the EPP chose: run this pool's EPP. If it fails open, the fallback cluster serves.
        epp_override = ExtProcPerRoute(
            overrides=ExtProcOverrides(
                grpc_service=GrpcService(
                    envoy_grpc=GrpcServiceEnvoyGrpc(cluster_name=f"epp-{pool.name}"),
                    timeout=seconds(topo.ext_proc_timeout_s),
                    retry_policy=replica_retry_policy(pool.epp.replicas),
                ),
                failure_mode_allow=pool.failure_mode == "FailOpen",
                # Response headers + trailers: the EPP holds the request's in-flight slot until
                # the response ends; only pool routes ask for them.
                processing_mode=pool_processing_mode(
                    response_headers=config.epp_reads_response_headers(pool),
                    response_trailers=True,
                    buffered=config.buffers_request_bodies(pool),
                ),
            )
        )
        # Only a FailOpen pool's request that its EPP could not route ever reaches this cluster
        # (otherwise the EPP's reply re-routes it to `-picked`, or fails closed): plain balancing
        # over the pool, where a failed pod is retried on another one, as on the picked route.
        fail_open = pool.failure_mode == "FailOpen"
        pick = RouteAction(
            cluster=f"fallback-{pool.name}" if fail_open else f"pool-{pool.name}",
            timeout=seconds(0),
            idle_timeout=seconds(300),
        )
        if fail_open:
            pick.retry_policy = _retry_policy()
        routes.append(
            Route(
                name=f"{pool.name}-pick",
                match=_with_headers(path, model_match),
                route=pick,
                request_headers_to_remove=[CLAIM_HEADER, TENANT_CLAIM_HEADER],
                typed_per_filter_config={EPP_FILTER: pack(epp_override)},
            )
        )
    return routes


SINGLE_HOP_CLUSTER = "epp"


def _single_hop_entry(route: Route, *, buffered: bool, response_headers: bool) -> None:
    """Single-hop: the routes a request can match before the EPP answers, i.e. where the one EPP
    filter reads its per-route settings (Envoy reads them once, before the EPP's reply clears
    the route cache). That is `no-route` (no model header yet; when the EPP lets a request
    through without a model, no body, this very route answers Envoy's JSON 404), and the pools'
    `-picked` routes, which a client forging the routing headers matches until they are
    stripped. They ask for response trailers (and headers where a feature reads them), as a pool
    route does in two-hop mode, so the EPP holds the in-flight slot until the response ends."""
    mode = pool_processing_mode(response_headers=response_headers, response_trailers=True, buffered=buffered)
    route.typed_per_filter_config = {
        EPP_FILTER: pack(ExtProcPerRoute(overrides=ExtProcOverrides(processing_mode=mode)))
    }


def _single_hop_check(config: GatewayConfig, topo: Topology) -> tuple[str, int, int]:
    """The single-hop EPP's address and replica count (every pool names the same count: each
    replica serves every pool); single-hop cannot fail open per pool (one stream before the
    pool is known), so a FailOpen pool needs the two-hop shape."""
    targets = set(topo.epps.values())
    if len(targets) != 1 or set(topo.epps) != {pool.name for pool in config.pools}:
        raise ValueError("single-hop: every pool must map to the same EPP in Topology.epps")
    counts = {pool.epp.replicas for pool in config.pools}
    if len(counts) != 1:
        raise ValueError(
            "single-hop: every pool's epp.replicas must be the same (each replica serves every pool)"
        )
    failopen = [pool.name for pool in config.pools if pool.failure_mode == "FailOpen"]
    if failopen:
        raise ValueError(f"single-hop mode cannot fail open (pools {', '.join(failopen)}): use two-hop")
    host, port = next(iter(targets))
    return host, port, counts.pop()


def _retry_policy() -> RetryPolicy:
    """Failures before the response started, on the next pod of the EPP's list: Envoy retries
    only until it forwards response headers, so a client never sees two answers, and only while
    the request body still fits its retry buffer (the listener's per-connection buffer)."""
    return RetryPolicy(
        retry_on=RETRY_ON,
        retriable_status_codes=list(RETRIABLE_STATUS_CODES),
        num_retries=RETRIES,
        retry_host_predicate=[
            RetryPolicyRetryHostPredicate(
                name="envoy.retry_host_predicates.previous_hosts", typed_config=pack(PreviousHostsPredicate())
            )
        ],
        host_selection_retry_max_attempts=3,
    )


def _regex_escape(name: str) -> str:
    return re.escape(name)


def _lb_policy(name: str, config: OverrideHost | LeastRequest) -> LoadBalancingPolicy:
    return LoadBalancingPolicy(
        policies=[
            LoadBalancingPolicyPolicy(
                typed_extension_config=TypedExtensionConfig(name=name, typed_config=pack(config))
            )
        ]
    )


def _destination_key() -> MetadataKey:
    """Where the EPP's choice is: `envoy.lb` dynamic metadata, never a request header."""
    return MetadataKey(key="envoy.lb", path=[MetadataKeyPathSegment(key=DESTINATION_HEADER)])


def _override_host_policy() -> LoadBalancingPolicy:
    """Pick the host named by the EPP's metadata; retries walk its ranked list.

    The fallback (least-request over the members) only serves when the listed hosts are all
    used up or none is a member: still never a host outside the pool.
    """
    return _lb_policy(
        "envoy.load_balancing_policies.override_host",
        OverrideHost(
            override_host_sources=[OverrideHostOverrideHostSource(metadata=_destination_key())],
            fallback_policy=_lb_policy("envoy.load_balancing_policies.least_request", LeastRequest()),
        ),
    )


def uses_override_host(pool: PoolConfig) -> bool:
    """Static pools: every pod is known at render time, so the cluster can list them."""
    return bool(pool.endpoints) and pool.kubernetes is None


def _override_host(pool: PoolConfig, topo: Topology) -> bool:
    """OverrideHost unless the topology asks for this pool as ORIGINAL_DST (one address only)."""
    if pool.name not in topo.original_dst_pools:
        return uses_override_host(pool)
    if pool.fallback_endpoints:
        raise ValueError(
            f"pool {pool.name!r}: an ORIGINAL_DST cluster takes one address; set fallbackEndpoints to 0"
        )
    return False


def _circuit_breakers(*, retry_budget: bool = False) -> CircuitBreakers:
    """Envoy's default circuit breakers allow 3 concurrent retries and 1,024 requests per cluster.
    A pod refusing connections under concurrent load needs more than 3 retries at once (measured:
    the 4th got a 503 instead of the fallback pod), and LLM streams are long-lived, so a pool
    easily holds more than 1,024 at once; the EPP's admission is the real limit. Pool clusters
    (`retry_budget`) bound their retries by a share of their load instead of a fixed count."""
    limits = CircuitBreakersThresholds(
        max_connections=100_000, max_pending_requests=100_000, max_requests=100_000, max_retries=1_000
    )
    if retry_budget:  # Envoy then ignores max_retries
        limits.retry_budget = CircuitBreakersThresholdsRetryBudget(
            budget_percent=Percent(value=RETRY_BUDGET_PERCENT),
            min_retry_concurrency=RETRY_BUDGET_MIN_CONCURRENCY,
        )
    return CircuitBreakers(thresholds=[limits])


def _pool_clusters(config: GatewayConfig, topo: Topology) -> list[Cluster]:
    clusters: list[Cluster] = []
    unknown = topo.original_dst_pools - {pool.name for pool in config.pools}
    if unknown:
        raise ValueError(f"original_dst_pools: no such pool: {', '.join(sorted(unknown))}")
    for pool in config.pools:
        name = f"pool-{pool.name}"
        if _override_host(pool, topo):
            cluster = Cluster(
                name=name,
                type=ClusterDiscoveryType.STATIC,
                load_assignment=static_load_assignment(name, [ep.address for ep in pool.endpoints]),
                load_balancing_policy=_override_host_policy(),
            )
        else:
            cluster = Cluster(
                name=name,
                type=ClusterDiscoveryType.ORIGINAL_DST,
                lb_policy=ClusterLbPolicy.CLUSTER_PROVIDED,
                cleanup_interval=seconds(60),
                original_dst_lb_config=ClusterOriginalDstLbConfig(
                    use_http_header=False, metadata_key=_destination_key()
                ),
            )
        cluster.connect_timeout = seconds(2)
        cluster.per_connection_buffer_limit_bytes = topo.connection_buffer_bytes
        cluster.circuit_breakers = _circuit_breakers(retry_budget=True)
        clusters.append(cluster)
        if pool.failure_mode == "FailOpen":
            endpoints = topo.fallback_endpoints.get(pool.name) or [ep.address for ep in pool.endpoints]
            clusters.append(
                Cluster(
                    name=f"fallback-{pool.name}",
                    type=ClusterDiscoveryType.STATIC,
                    lb_policy=ClusterLbPolicy.LEAST_REQUEST,
                    connect_timeout=seconds(2),
                    load_assignment=static_load_assignment(f"fallback-{pool.name}", endpoints),
                    circuit_breakers=_circuit_breakers(retry_budget=True),
                )
            )
    return clusters


# Envoy's own refusals by status: (OpenAI error type, stable code, message prefix).
_LOCAL_ERRORS: dict[int, tuple[str, str, str]] = {
    401: ("authentication_error", "invalid_api_key", "authentication failed"),
    403: ("permission_error", "forbidden", "forbidden"),
    413: ("invalid_request_error", "request_too_large", "request too large"),
    431: ("invalid_request_error", "request_header_fields_too_large", "request headers too large"),
}


def _mapper(expression: str, payload: dict[str, Any]) -> ResponseMapper:
    cel = ExtensionFilter(
        name="envoy.access_loggers.extension_filters.cel",
        typed_config=pack(ExpressionFilter(expression=expression)),
    )
    return ResponseMapper(
        filter=AccessLogFilter(extension_filter=cel), body_format_override=_json_body(payload)
    )


def _local_reply_config() -> LocalReplyConfig:
    """Shape Envoy's own error replies (ext_proc down, upstream reset, no route, auth, limits)
    as JSON: Anthropic's error shape on its Messages API paths, OpenAI's elsewhere.

    Replies our services produced (details prefixed `gateway_`) and our direct responses are
    already JSON and pass through untouched.
    """
    ours = f"!response.code_details.startsWith('{ERROR_DETAILS_PREFIX}') && response.code_details != 'direct_response'"
    messages = "request.url_path in [" + ", ".join(f"'{p}'" for p in ANTHROPIC_PATHS) + "]"
    mappers: list[ResponseMapper] = []
    for anthropic, where in ((True, f"{ours} && {messages}"), (False, ours)):  # first match wins
        mappers += [
            _mapper(
                f"{where} && response.code == {status}",
                error_payload(
                    status,
                    f"{prefix}: %LOCAL_REPLY_BODY% (%RESPONSE_CODE_DETAILS%)",
                    code,
                    anthropic=anthropic,
                    error_type=error_type,
                ),
            )
            for status, (error_type, code, prefix) in _LOCAL_ERRORS.items()
        ]
        mappers.append(
            _mapper(
                where,
                error_payload(
                    500,
                    "the gateway could not complete the request (%RESPONSE_CODE_DETAILS%) %LOCAL_REPLY_BODY%",
                    "%RESPONSE_CODE_DETAILS%",
                    anthropic=anthropic,
                    error_type="server_error",
                ),
            )
        )
    return LocalReplyConfig(mappers=mappers)


def _jwt_filter(config: GatewayConfig) -> list[HttpFilter]:
    """Verify `Authorization: Bearer <JWT>` against the configured JWKS before anything else runs.

    The token is not forwarded upstream: model servers never see client credentials.
    """
    jwt = config.listener.jwt
    if jwt is None:
        return []
    provider = JwtProvider(
        issuer=jwt.issuer,
        audiences=list(jwt.audiences),
        local_jwks=DataSource(inline_string=jwt.jwks),
        forward=False,
    )
    claim = config.listener.trust.jwt_claim
    if claim is not None:  # the EPP trusts the request when this equals the configured value
        provider.claim_to_headers.append(JwtClaimToHeader(header_name=CLAIM_HEADER, claim_name=claim.name))
    tenant_claim = config.flow_control.tenant_claim
    if tenant_claim is not None:  # the EPP's fair-share tenant (epp/requestcontrol/flow_control.py)
        provider.claim_to_headers.append(
            JwtClaimToHeader(header_name=TENANT_CLAIM_HEADER, claim_name=tenant_claim)
        )
    authn = JwtAuthentication(
        providers={"gateway": provider},
        rules=[
            RequirementRule(match=RouteMatch(prefix="/"), requires=JwtRequirement(provider_name="gateway"))
        ],
    )
    return [http_filter("envoy.filters.http.jwt_authn", authn)]


def _routes(config: GatewayConfig, topo: Topology) -> list[Route]:
    routes: list[Route] = []
    if config.listener.allow_all_paths or MODELS_PATH in config.listener.paths:
        routes.append(
            Route(
                name="models-list",
                match=RouteMatch(path=MODELS_PATH, headers=[_method("GET")]),
                direct_response=DirectResponseAction(
                    status=200, body=DataSource(inline_string=_models_list(config))
                ),
                response_headers_to_add=[header("content-type", "application/json")],
            )
        )
        if not config.listener.allow_all_paths:
            routes.append(
                _without_bbr(_method_not_allowed("models-method", RouteMatch(path=MODELS_PATH), "GET"), topo)
            )
    routes.extend(_served_routes(config, topo))
    if topo.single_hop:
        for route in routes:
            if route.name.startswith("no-route") or route.name.endswith("-picked"):
                # Single-hop has no FailOpen pools (`_single_hop_check`): the listener's mode.
                _single_hop_entry(
                    route,
                    buffered=config.listener.request_body_mode == "buffered",
                    response_headers=config.epp_reads_response_headers(),
                )
    # Requests that reach no pool never talk to an EPP. This matters for Envoy's own replies to
    # malformed requests (headers too large -> 431): the EPP filter would hold the reply's headers
    # for an ext_proc round trip while the codec closes the connection, and the client would get
    # an empty reply instead of the JSON 431.
    for route in routes:
        if route.direct_response is not None and EPP_FILTER not in route.typed_per_filter_config:
            route.typed_per_filter_config[EPP_FILTER] = pack(_disabled())
    return routes


def _strip_routing_headers() -> HttpFilter:
    """Client-sent routing and identity headers never reach the routing filters or a pod."""
    removed = (
        DESTINATION_HEADER,
        MODEL_HEADER,
        "x-gateway-base-model-name",
        CLAIM_HEADER,
        TENANT_CLAIM_HEADER,
        *PREFILLER_HEADERS,
    )
    mutations = Mutations(request_mutations=[RequestMutation(remove=h) for h in removed])
    return http_filter("gateway.strip_routing_headers", HeaderMutation(mutations=mutations))


def render_resources(config: GatewayConfig, topo: Topology) -> tuple[list[Listener], list[Cluster]]:
    """The listener (its route table inline) and the clusters: the static bootstrap's resources,
    and what the xDS server sends."""
    hcm = HttpConnectionManager(
        stat_prefix="gateway",
        codec_type=HttpConnectionManagerCodecType.AUTO,
        stream_idle_timeout=seconds(300),
        request_timeout=seconds(0),
        use_remote_address=True,
        # One spelling per path before the allow-list matches: `/v1/x/../../sleep` is `/sleep`.
        normalize_path=True,
        merge_slashes=True,
        max_request_headers_kb=config.listener.max_request_headers_kb,
        common_http_protocol_options=HttpProtocolOptions(max_headers_count=config.listener.max_headers_count),
        route_config=RouteConfiguration(
            name="gateway",
            virtual_hosts=[VirtualHost(name="all", domains=["*"], routes=_routes(config, topo))],
        ),
        http_filters=[
            _strip_routing_headers(),
            *_jwt_filter(config),
            *_routing_filters(config, topo),
            router_filter(),
        ],
        local_reply_config=_local_reply_config(),
    )
    clusters = [*_ext_proc_clusters(config, topo), *_pool_clusters(config, topo)]
    listener = topology_listener(topo, hcm)
    if config.listener.max_buffered_body_bytes is not None:
        # Envoy's buffering filters answer 413 past this (shaped as JSON by `_local_reply_config`).
        listener.per_connection_buffer_limit_bytes = config.listener.max_buffered_body_bytes
    return [listener], clusters


def render_bootstrap(config: GatewayConfig, topo: Topology) -> dict[str, Any]:
    """The static bootstrap, as Envoy reads it (validated against the real protos)."""
    return bootstrap(topo.admin_port, *render_resources(config, topo))


def _ext_proc_clusters(config: GatewayConfig, topo: Topology) -> list[Cluster]:
    if topo.single_hop:
        host, port, count = _single_hop_check(config, topo)
        return [ext_proc_cluster(SINGLE_HOP_CLUSTER, host, port, topo.extproc_tls, replicas=count)]
    if topo.bbr is None:
        raise ValueError("two-hop mode needs BBR's address (Topology.bbr)")
    replicas = {pool.name: pool.epp.replicas for pool in config.pools}
    return [
        ext_proc_cluster("bbr", *topo.bbr, topo.extproc_tls),
        *(
            ext_proc_cluster(f"epp-{pool}", host, port, topo.extproc_tls, replicas=replicas.get(pool, 1))
            for pool, (host, port) in topo.epps.items()
        ),
    ]


def _routing_filters(config: GatewayConfig, topo: Topology) -> list[HttpFilter]:
    """Two-hop: BBR then the pool's EPP; single-hop: the one EPP, which does both. BBR and the
    single-hop EPP see every request, so they buffer bodies in `requestBodyMode: buffered`."""
    buffered = config.listener.request_body_mode == "buffered"
    if topo.single_hop:
        # Off the entry route (Envoy's own replies, direct responses) it must not hold the
        # response: the default skips response headers, `_single_hop_entry` asks for them.
        return [
            _ext_proc_filter(
                EPP_FILTER,
                SINGLE_HOP_CLUSTER,
                topo,
                response_headers=False,
                buffered=buffered,
                replicas=config.pools[0].epp.replicas,  # every pool names the same count
            )
        ]
    return [
        _ext_proc_filter(BBR_FILTER, "bbr", topo, response_headers=False, buffered=buffered),
        # Each pool route points this filter at its own EPP (ExtProcPerRoute). The per-route config is read when the filter runs, i.e. after
        # BBR has cleared the route cache, so it follows the model header.
        # Outside pool routes (e.g. Envoy's own reply to a malformed request, which has no
        # route) the EPP must not hold the response: the default skips response headers.
        _ext_proc_filter(
            EPP_FILTER,
            f"epp-{config.pools[0].name}",
            topo,
            response_headers=False,
            buffered=buffered,
            replicas=config.pools[0].epp.replicas,
        ),
    ]


def write_bootstrap(config: GatewayConfig, topo: Topology, path: Path) -> Path:
    path.write_text(json.dumps(render_bootstrap(config, topo), indent=1))
    return path
