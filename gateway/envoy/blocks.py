"""Building blocks every Envoy renderer shares (the gateway's, gateway/envoy/bootstrap.py, the
global tier's, globalrouter/envoy_config.py, and the benchmarks' baseline, bench/harness/baseline_envoy.py):
addresses, host:port parsing, gRPC clusters, ext_proc and router filters, the HTTPS listener,
JSON direct responses, and the bootstrap envelope validated against the real protos.

Why one module: the renderers differ in topology (pools behind ext_proc vs member clusters
behind a router), not in how a listener, a socket or a validated bootstrap looks.

Every block is one of envoy-data-plane's typed messages (`envoy_data_plane.envoy...`,
dataclasses generated from Envoy's protos): a misspelt field fails where it is written (the
constructor raises, mypy reports it), `typed_config`s are packed messages with their own type
URL, and the same objects are both the bootstrap (`plain`: proto-JSON, snake_case, defaults
omitted) and the xDS resources (their wire bytes, gateway/envoy/xds_resources.py).
"""

from __future__ import annotations

import argparse
import datetime
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Protocol

import betterproto2
from envoy_data_plane.envoy.config.bootstrap.v3 import Admin, Bootstrap, BootstrapStaticResources
from envoy_data_plane.envoy.config.cluster.v3 import Cluster, ClusterDiscoveryType
from envoy_data_plane.envoy.config.core.v3 import (
    Address,
    DataSource,
    GrpcService,
    GrpcServiceEnvoyGrpc,
    HeaderValue,
    HeaderValueOption,
    Http2ProtocolOptions,
    RetryPolicy,
    SocketAddress,
    TransportSocket,
)
from envoy_data_plane.envoy.config.endpoint.v3 import (
    ClusterLoadAssignment,
    Endpoint,
    LbEndpoint,
    LocalityLbEndpoints,
)
from envoy_data_plane.envoy.config.listener.v3 import Filter, FilterChain, Listener
from envoy_data_plane.envoy.config.route.v3 import DirectResponseAction, Route, RouteMatch
from envoy_data_plane.envoy.extensions.filters.http.ext_proc.v3 import (
    ExternalProcessor,
    ProcessingMode,
    ProcessingModeBodySendMode,
    ProcessingModeHeaderSendMode,
)
from envoy_data_plane.envoy.extensions.filters.http.router.v3 import Router
from envoy_data_plane.envoy.extensions.filters.network.http_connection_manager.v3 import (
    HttpConnectionManager,
    HttpFilter,
)
from envoy_data_plane.envoy.extensions.transport_sockets.tls.v3 import (
    CommonTlsContext,
    DownstreamTlsContext,
    TlsCertificate,
)
from envoy_data_plane.envoy.extensions.upstreams.http.v3 import (
    HttpProtocolOptions,
    HttpProtocolOptionsExplicitHttpConfig,
)
from envoy_data_plane.google.protobuf import Any as AnyMessage
from google.protobuf import json_format

from extproc.errors import error_payload

BodyMode = ProcessingModeBodySendMode  # NONE, STREAMED, BUFFERED, FULL_DUPLEX_STREAMED, ...
TLS_SOCKET = "envoy.transport_sockets.tls"


def pack(message: betterproto2.Message) -> AnyMessage:
    """A `typed_config`: the message with its type URL (`type.googleapis.com/envoy...`)."""
    return AnyMessage.pack(message)


def plain(message: betterproto2.Message) -> dict[str, Any]:
    """Proto-JSON with Envoy's field names (the .proto's field order, default values left out),
    each `typed_config`'s `@type` first, where a reader looks for it."""
    return _type_first(message.to_dict(casing=betterproto2.Casing.SNAKE))


def _type_first(value: Any) -> Any:
    if isinstance(value, dict):
        ordered = sorted(value.items(), key=lambda item: item[0] != "@type")  # stable sort
        return {k: _type_first(v) for k, v in ordered}
    if isinstance(value, list):
        return [_type_first(v) for v in value]
    return value


def seconds(value: float) -> datetime.timedelta:
    return datetime.timedelta(seconds=value)


def processing_mode(
    *,
    request_headers: bool,
    request_body: BodyMode,
    request_trailers: bool,
    response_headers: bool,
    response_body: BodyMode,
    response_trailers: bool,
) -> ProcessingMode:
    """An ext_proc ProcessingMode: which parts of the HTTP stream the service sees."""

    def send(on: bool) -> ProcessingModeHeaderSendMode:
        return ProcessingModeHeaderSendMode.SEND if on else ProcessingModeHeaderSendMode.SKIP

    return ProcessingMode(
        request_header_mode=send(request_headers),
        request_body_mode=request_body,
        request_trailer_mode=send(request_trailers),
        response_header_mode=send(response_headers),
        response_body_mode=response_body,
        response_trailer_mode=send(response_trailers),
    )


def socket(host: str, port: int) -> Address:
    return Address(socket_address=SocketAddress(address=host, port_value=port))


def split_host_port(value: str) -> tuple[str, int]:
    """`host:port` or `[v6]:port` -> (host, port); ValueError when it is neither."""
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"{value!r} is not host:port")
    return host.strip("[]"), int(port)


def host_port_argument(value: str) -> tuple[str, int]:
    """`split_host_port` as an argparse `type=`: a usage error instead of a traceback."""
    try:
        return split_host_port(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def load_assignment(name: str, endpoints: Iterable[tuple[str, int]]) -> ClusterLoadAssignment:
    """One locality of endpoints."""
    lb_endpoints = [LbEndpoint(endpoint=Endpoint(address=socket(h, p))) for h, p in endpoints]
    return ClusterLoadAssignment(
        cluster_name=name, endpoints=[LocalityLbEndpoints(lb_endpoints=lb_endpoints)]
    )


def static_load_assignment(name: str, addresses: list[str]) -> ClusterLoadAssignment:
    """One locality of `ip:port` endpoints."""
    return load_assignment(name, (split_host_port(a) for a in addresses))


def grpc_cluster(
    name: str,
    endpoints: list[tuple[str, int]],
    *,
    cluster_type: ClusterDiscoveryType = ClusterDiscoveryType.STATIC,
    connect_timeout_s: float = 1.0,
    max_concurrent_streams: int | None = None,
) -> Cluster:
    """A cluster of gRPC (HTTP/2) services, e.g. ext_proc servers; callers add TLS, breakers,
    checks. `max_concurrent_streams`: streams per connection before Envoy opens another."""
    http2 = HttpProtocolOptions(
        explicit_http_config=HttpProtocolOptionsExplicitHttpConfig(
            http2_protocol_options=Http2ProtocolOptions(max_concurrent_streams=max_concurrent_streams)
        )
    )
    return Cluster(
        name=name,
        type=cluster_type,
        connect_timeout=seconds(connect_timeout_s),
        load_assignment=load_assignment(name, endpoints),
        typed_extension_protocol_options={
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": pack(http2)
        },
    )


def ext_processor(
    cluster: str,
    timeout_s: float,
    mode: ProcessingMode,
    *,
    failure_mode_allow: bool = False,
    initial_metadata: list[HeaderValue] | None = None,
    retry_policy: RetryPolicy | None = None,
) -> ExternalProcessor:
    """An ext_proc filter's configuration calling `cluster`; callers set further fields."""
    return ExternalProcessor(
        grpc_service=GrpcService(
            envoy_grpc=GrpcServiceEnvoyGrpc(cluster_name=cluster),
            timeout=seconds(timeout_s),
            initial_metadata=initial_metadata or [],
            retry_policy=retry_policy,
        ),
        failure_mode_allow=failure_mode_allow,
        processing_mode=mode,
        message_timeout=seconds(timeout_s),
    )


def http_filter(name: str, config: betterproto2.Message, *, disabled: bool = False) -> HttpFilter:
    return HttpFilter(name=name, typed_config=pack(config), disabled=disabled)


def router_filter() -> HttpFilter:
    """The terminal HTTP filter of every chain."""
    return http_filter("envoy.filters.http.router", Router())


def header(key: str, value: str) -> HeaderValueOption:
    return HeaderValueOption(header=HeaderValue(key=key, value=value))


def json_error_route(
    name: str,
    match: RouteMatch,
    status: int,
    message: str,
    error_type: str,
    code: str,
    *,
    anthropic: bool = False,
) -> Route:
    """A route answering with a JSON error from Envoy itself: OpenAI's shape, or `anthropic`'s
    (Anthropic's Messages API paths; extproc/errors.py writes both)."""
    body = json.dumps(error_payload(status, message, code, anthropic=anthropic, error_type=error_type))
    return Route(
        name=name,
        match=match,
        direct_response=DirectResponseAction(status=status, body=DataSource(inline_string=body)),
        response_headers_to_add=[header("content-type", "application/json")],
    )


def tls_certificate(cert: Path, key: Path) -> TlsCertificate:
    return TlsCertificate(
        certificate_chain=DataSource(filename=str(cert)), private_key=DataSource(filename=str(key))
    )


def https_listener(
    host: str,
    port: int,
    server_cert: Path | None,
    server_key: Path | None,
    buffer_bytes: int,
    hcm: HttpConnectionManager,
) -> Listener:
    """The TLS listener (h2 + http/1.1 by ALPN) in front of an HTTP connection manager; plain
    HTTP when no certificate is given (TLS terminated in front of Envoy)."""
    chain = FilterChain(
        filters=[Filter(name="envoy.filters.network.http_connection_manager", typed_config=pack(hcm))]
    )
    if server_cert is not None and server_key is not None:
        tls = DownstreamTlsContext(
            common_tls_context=CommonTlsContext(
                alpn_protocols=["h2", "http/1.1"], tls_certificates=[tls_certificate(server_cert, server_key)]
            )
        )
        chain.transport_socket = TransportSocket(name=TLS_SOCKET, typed_config=pack(tls))
    return Listener(
        name="https" if chain.transport_socket is not None else "http",
        address=socket(host, port),
        per_connection_buffer_limit_bytes=buffer_bytes,
        filter_chains=[chain],
    )


class ListenerTopology(Protocol):
    """What a renderer's topology says about its client-facing listener."""

    @property
    def listen_host(self) -> str: ...
    @property
    def listen_port(self) -> int: ...
    @property
    def server_cert(self) -> Path | None: ...
    @property
    def server_key(self) -> Path | None: ...
    @property
    def connection_buffer_bytes(self) -> int: ...


def topology_listener(topo: ListenerTopology, hcm: HttpConnectionManager) -> Listener:
    return https_listener(
        topo.listen_host,
        topo.listen_port,
        topo.server_cert,
        topo.server_key,
        topo.connection_buffer_bytes,
        hcm,
    )


def admin(port: int) -> Admin:
    """The admin interface, on loopback only."""
    return Admin(address=socket("127.0.0.1", port))


def bootstrap(admin_port: int, listeners: list[Listener], clusters: list[Cluster]) -> dict[str, Any]:
    """The static bootstrap, validated before anyone writes it."""
    return validated(
        Bootstrap(
            admin=admin(admin_port),
            static_resources=BootstrapStaticResources(listeners=listeners, clusters=clusters),
        )
    )


def validated(message: Bootstrap) -> dict[str, Any]:
    """The bootstrap as written (`plain`), checked by the real protos (`validate_bootstrap`)."""
    out = plain(message)
    validate_bootstrap(out)
    return out


def validate_bootstrap(bootstrap: dict[str, Any]) -> None:
    """Parse into the real Bootstrap message: unknown fields or wrong types raise ParseError."""
    from envoy.config.bootstrap.v3 import bootstrap_pb2

    register_types()
    json_format.ParseDict(bootstrap, bootstrap_pb2.Bootstrap())


def register_types() -> None:
    """Register every typed_config type the renderers use with the descriptor pool (for `ParseDict`)."""
    from envoy.config.route.v3 import route_components_pb2  # noqa: F401
    from envoy.extensions.access_loggers.filters.cel.v3 import cel_pb2  # noqa: F401
    from envoy.extensions.filters.http.ext_proc.v3 import ext_proc_pb2  # noqa: F401
    from envoy.extensions.filters.http.header_mutation.v3 import header_mutation_pb2  # noqa: F401
    from envoy.extensions.filters.http.jwt_authn.v3 import config_pb2 as jwt_config_pb2  # noqa: F401
    from envoy.extensions.filters.http.router.v3 import router_pb2  # noqa: F401
    from envoy.extensions.filters.network.http_connection_manager.v3 import (  # noqa: F401
        http_connection_manager_pb2,
    )
    from envoy.extensions.load_balancing_policies.least_request.v3 import least_request_pb2  # noqa: F401
    from envoy.extensions.load_balancing_policies.override_host.v3 import override_host_pb2  # noqa: F401
    from envoy.extensions.retry.host.previous_hosts.v3 import previous_hosts_pb2  # noqa: F401
    from envoy.extensions.retry.priority.previous_priorities.v3 import (  # noqa: F401
        previous_priorities_config_pb2,
    )
    from envoy.extensions.transport_sockets.tls.v3 import tls_pb2  # noqa: F401
    from envoy.extensions.upstreams.http.v3 import http_protocol_options_pb2  # noqa: F401
