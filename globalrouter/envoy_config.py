"""Render the global Envoy's bootstrap: HTTPS in, the router ext_proc, one route per member.

Request path:
  strip client-sent x-global-* headers -> router ext_proc (request only; all replicas behind
  one cluster) sets `x-global-cluster: <member>`, dynamic metadata `global.route`, clears the
  route cache -> observer ext_proc (response only: headers, and the streamed body on the
  metered route variant) -> the route matching the header sends to the member's cluster
  (upstream TLS, each member's endpoint checked against that member's CA).

Fast failover inside one request: each member's Envoy cluster also lists the other members
as priority-1 endpoints; the route retries connect failures / refused streams once per
other member with the `previous_priorities` retry policy, so a request to a dead member lands
on a live one instead of failing. The route stamps `x-global-upstream` (the address reached)
on the response, which tells the observer that the pick failed and ejects the member.

Built like gateway/envoy/bootstrap.py: envoy-data-plane's typed messages, validated by
`json_format.ParseDict` into the real Bootstrap.

    python -m globalrouter.envoy_config --config router.yaml --listen-port 8443 --admin-port 9901 \
        --router 127.0.0.1:9100 [--router ...] --server-cert c.pem --server-key k.pem \
        --upstream-ca members-ca.pem --out global-envoy.json
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from envoy_data_plane.envoy.config.cluster.v3 import (
    Cluster,
    ClusterDiscoveryType,
    ClusterLbPolicy,
    ClusterTransportSocketMatch,
)
from envoy_data_plane.envoy.config.common.mutation_rules.v3 import HeaderMutation as RequestMutation
from envoy_data_plane.envoy.config.core.v3 import (
    DataSource,
    HeaderValue,
    HeaderValueOption,
    HeaderValueOptionHeaderAppendAction,
    HealthCheck,
    HealthCheckGrpcHealthCheck,
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
    HeaderMatcher,
    RetryPolicy,
    RetryPolicyRetryBackOff,
    RetryPolicyRetryPriority,
    Route,
    RouteAction,
    RouteConfiguration,
    RouteMatch,
    VirtualHost,
)
from envoy_data_plane.envoy.extensions.filters.http.ext_proc.v3 import (
    ExtProcOverrides,
    ExtProcPerRoute,
    MetadataOptions,
    MetadataOptionsMetadataNamespaces,
    ProcessingMode,
)
from envoy_data_plane.envoy.extensions.filters.http.header_mutation.v3 import HeaderMutation, Mutations
from envoy_data_plane.envoy.extensions.filters.network.http_connection_manager.v3 import (
    HttpConnectionManager,
    HttpConnectionManagerCodecType,
    HttpFilter,
)
from envoy_data_plane.envoy.extensions.retry.priority.previous_priorities.v3 import PreviousPrioritiesConfig
from envoy_data_plane.envoy.extensions.transport_sockets.tls.v3 import (
    CertificateValidationContext,
    CommonTlsContext,
    UpstreamTlsContext,
)
from envoy_data_plane.envoy.type.matcher.v3 import StringMatcher
from envoy_data_plane.envoy.type.v3 import HttpStatus, StatusCode
from envoy_data_plane.google.protobuf import Struct

from gateway.envoy.blocks import (
    TLS_SOCKET,
    BodyMode,
    bootstrap,
    ext_processor,
    grpc_cluster,
    host_port_argument,
    http_filter,
    json_error_route,
    pack,
    processing_mode,
    router_filter,
    seconds,
    socket,
    topology_listener,
)
from globalrouter.config import ConfigError, RouterConfig, load_config
from globalrouter.processor import (
    CLUSTER_HEADER,
    MEMBER_HEADER,
    METER_HEADER,
    ROUTE_NAMESPACE,
    UPSTREAM_HEADER,
)
from globalrouter.service import ROLE_METADATA

ROUTER_FILTER = "global.router"
OBSERVER_FILTER = "global.observer"


@dataclass(frozen=True, slots=True)
class GlobalTopology:
    listen_port: int
    admin_port: int
    routers: Sequence[tuple[str, int]]  # global-router replicas (ext_proc endpoints)
    server_cert: Path
    server_key: Path
    upstream_ca: Path  # PEM bundle that the members' server certificates chain to
    member_cas: Mapping[str, Path] = field(default_factory=dict)  # member -> its own CA (overrides)
    listen_host: str = "127.0.0.1"
    upstream_sni: str = "localhost"
    ext_proc_timeout_s: float = 10.0
    connection_buffer_bytes: int = 4 * 1024 * 1024


def _overwrite(key: str, value: str) -> HeaderValueOption:
    return HeaderValueOption(
        header=HeaderValue(key=key, value=value),
        append_action=HeaderValueOptionHeaderAppendAction.OVERWRITE_IF_EXISTS_OR_ADD,
    )


def _member_route(name: str, retries: int, *, metered: bool) -> Route:
    headers = [HeaderMatcher(name=CLUSTER_HEADER, string_match=StringMatcher(exact=name))]
    if metered:
        headers.append(HeaderMatcher(name=METER_HEADER, present_match=True))
    action = RouteAction(cluster=f"member-{name}", timeout=seconds(0), idle_timeout=seconds(300))
    route = Route(
        name=f"member-{name}" + ("-metered" if metered else ""),
        match=RouteMatch(prefix="/", headers=headers),
        route=action,
        response_headers_to_add=[
            _overwrite(MEMBER_HEADER, name),
            _overwrite(UPSTREAM_HEADER, "%UPSTREAM_REMOTE_ADDRESS%"),
        ],
    )
    if metered:  # read by the observer after the router filter chose this route
        overrides = ExtProcOverrides(processing_mode=_observer_mode(response_body=BodyMode.STREAMED))
        route.typed_per_filter_config = {OBSERVER_FILTER: pack(ExtProcPerRoute(overrides=overrides))}
    if retries:
        action.retry_policy = RetryPolicy(
            retry_on="connect-failure,refused-stream,reset-before-request",
            num_retries=retries,
            per_try_timeout=seconds(0),
            retry_priority=RetryPolicyRetryPriority(
                name="envoy.retry_priorities.previous_priorities",
                typed_config=pack(PreviousPrioritiesConfig(update_frequency=1)),
            ),
            retry_back_off=RetryPolicyRetryBackOff(base_interval=seconds(0.005), max_interval=seconds(0.05)),
        )
    return route


def _upstream_tls(ca: Path, sni: str) -> TransportSocket:
    context = UpstreamTlsContext(
        sni=sni,
        common_tls_context=CommonTlsContext(
            validation_context=CertificateValidationContext(trusted_ca=DataSource(filename=str(ca)))
        ),
    )
    return TransportSocket(name=TLS_SOCKET, typed_config=pack(context))


def _member_cluster(config: RouterConfig, index: int, topo: GlobalTopology) -> Cluster:
    """The member at priority 0, every other member at a lower priority (for retries only).

    Each endpoint is matched to its own member's CA (`transport_socket_matches`): self-signed
    member CAs may share a subject name, and one bundle of them fails verification.
    """
    member = config.members[index]
    ordered = [member] + [m for i, m in enumerate(config.members) if i != index]
    localities = [
        LocalityLbEndpoints(
            priority=prio,
            lb_endpoints=[
                LbEndpoint(
                    endpoint=Endpoint(address=socket(*m.host_port)),
                    metadata=Metadata(
                        filter_metadata={"envoy.transport_socket_match": Struct.from_dict({"member": m.name})}
                    ),
                )
            ],
        )
        for prio, m in enumerate(ordered)
    ]
    return Cluster(
        name=f"member-{member.name}",
        type=ClusterDiscoveryType.STATIC,
        connect_timeout=seconds(0.5),
        per_connection_buffer_limit_bytes=topo.connection_buffer_bytes,
        load_assignment=ClusterLoadAssignment(cluster_name=f"member-{member.name}", endpoints=localities),
        transport_socket=_upstream_tls(topo.upstream_ca, topo.upstream_sni),
        transport_socket_matches=[
            ClusterTransportSocketMatch(
                name=f"ca-{name}",
                match=Struct.from_dict({"member": name}),
                transport_socket=_upstream_tls(ca, topo.upstream_sni),
            )
            for name, ca in sorted(topo.member_cas.items())
        ],
    )


def _router_cluster(topo: GlobalTopology) -> Cluster:
    cluster = grpc_cluster("global-router", list(topo.routers))
    cluster.lb_policy = ClusterLbPolicy.ROUND_ROBIN
    cluster.health_checks = [
        HealthCheck(
            timeout=seconds(0.5),
            interval=seconds(1),
            unhealthy_threshold=2,
            healthy_threshold=1,
            grpc_health_check=HealthCheckGrpcHealthCheck(),
        )
    ]
    return cluster


def _router_filter(topo: GlobalTopology) -> HttpFilter:
    """Requests only (the observer filter watches responses); fails closed."""
    mode = processing_mode(
        request_headers=True, request_body=BodyMode.FULL_DUPLEX_STREAMED, request_trailers=True,
        response_headers=False, response_body=BodyMode.NONE, response_trailers=False,
    )  # fmt: skip
    config = ext_processor("global-router", topo.ext_proc_timeout_s, mode)
    config.metadata_options = MetadataOptions(
        receiving_namespaces=MetadataOptionsMetadataNamespaces(untyped=[ROUTE_NAMESPACE])
    )
    config.status_on_error = HttpStatus(code=StatusCode.ServiceUnavailable)
    return http_filter(ROUTER_FILTER, config)


def _observer_mode(*, response_body: BodyMode) -> ProcessingMode:
    return processing_mode(
        request_headers=False, request_body=BodyMode.NONE, request_trailers=False,
        response_headers=True, response_body=response_body, response_trailers=False,
    )  # fmt: skip


def _observer_filter(topo: GlobalTopology) -> HttpFilter:
    """Responses only; fails open (a lost observation must not fail a reply)."""
    config = ext_processor(
        "global-router",
        topo.ext_proc_timeout_s,
        _observer_mode(response_body=BodyMode.NONE),
        failure_mode_allow=True,
        initial_metadata=[HeaderValue(key=ROLE_METADATA, value="observer")],
    )
    config.metadata_options = MetadataOptions(
        forwarding_namespaces=MetadataOptionsMetadataNamespaces(untyped=[ROUTE_NAMESPACE])
    )
    return http_filter(OBSERVER_FILTER, config)


def render_bootstrap(config: RouterConfig, topo: GlobalTopology) -> dict[str, Any]:
    if not topo.routers:
        raise ConfigError("the global Envoy needs at least one router replica")
    retries = min(len(config.members) - 1, 3)
    routes = [_member_route(m.name, retries, metered=True) for m in config.members]
    routes += [_member_route(m.name, retries, metered=False) for m in config.members]
    routes.append(
        json_error_route(
            "no-member",
            RouteMatch(prefix="/"),
            503,
            "the global router chose no member cluster",
            "server_error",
            "no_cluster_selected",
        )
    )
    strip = Mutations(
        request_mutations=[RequestMutation(remove=CLUSTER_HEADER), RequestMutation(remove=METER_HEADER)]
    )
    hcm = HttpConnectionManager(
        stat_prefix="global",
        codec_type=HttpConnectionManagerCodecType.AUTO,
        stream_idle_timeout=seconds(300),
        request_timeout=seconds(0),
        use_remote_address=True,
        route_config=RouteConfiguration(
            name="global", virtual_hosts=[VirtualHost(name="all", domains=["*"], routes=routes)]
        ),
        http_filters=[
            http_filter("global.strip_routing_headers", HeaderMutation(mutations=strip)),
            _router_filter(topo),
            _observer_filter(topo),
            router_filter(),
        ],
    )
    listener = topology_listener(topo, hcm)
    clusters = [_router_cluster(topo)] + [
        _member_cluster(config, i, topo) for i in range(len(config.members))
    ]
    return bootstrap(topo.admin_port, [listener], clusters)


def write_bootstrap(config: RouterConfig, topo: GlobalTopology, path: Path) -> Path:
    path.write_text(json.dumps(render_bootstrap(config, topo), indent=1))
    return path


def main() -> None:
    parser = argparse.ArgumentParser(prog="globalrouter.envoy_config", description="Render the global Envoy")
    parser.add_argument("--config", required=True)
    parser.add_argument("--listen-port", type=int, default=8443)
    parser.add_argument("--admin-port", type=int, default=9901)
    parser.add_argument("--router", type=host_port_argument, action="append", required=True)
    parser.add_argument("--server-cert", type=Path, required=True)
    parser.add_argument("--server-key", type=Path, required=True)
    parser.add_argument("--upstream-ca", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    try:
        config = load_config(args.config)
    except ConfigError as exc:
        raise SystemExit(str(exc)) from None
    topo = GlobalTopology(
        args.listen_port, args.admin_port, args.router, args.server_cert, args.server_key, args.upstream_ca
    )
    write_bootstrap(config, topo, args.out)


if __name__ == "__main__":
    main()
