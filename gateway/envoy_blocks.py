"""Building blocks every Envoy renderer shares (the gateway's, gateway/envoy_config.py, the
global tier's, globalrouter/envoy_config.py, and the benchmarks' baseline, bench/baseline_envoy.py):
type URLs, addresses, host:port parsing, gRPC clusters, ext_proc and router filters, the HTTPS
listener, JSON direct responses, and the bootstrap envelope validated against the real protos.

Why one module: the renderers differ in topology (pools behind ext_proc vs member clusters
behind a router), not in how a listener, a socket or a validated bootstrap looks.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any, Protocol

from google.protobuf import json_format

_T = "type.googleapis.com/envoy."
TYPES = {
    "hcm": _T + "extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
    "ext_proc": _T + "extensions.filters.http.ext_proc.v3.ExternalProcessor",
    "ext_proc_route": _T + "extensions.filters.http.ext_proc.v3.ExtProcPerRoute",
    "filter_config": _T + "config.route.v3.FilterConfig",
    "router": _T + "extensions.filters.http.router.v3.Router",
    "header_mutation": _T + "extensions.filters.http.header_mutation.v3.HeaderMutation",
    "tls_down": _T + "extensions.transport_sockets.tls.v3.DownstreamTlsContext",
    "tls_up": _T + "extensions.transport_sockets.tls.v3.UpstreamTlsContext",
    "http_opts": _T + "extensions.upstreams.http.v3.HttpProtocolOptions",
    "cel": _T + "extensions.access_loggers.filters.cel.v3.ExpressionFilter",
    "jwt_authn": _T + "extensions.filters.http.jwt_authn.v3.JwtAuthentication",
    "override_host": _T + "extensions.load_balancing_policies.override_host.v3.OverrideHost",
    "least_request": _T + "extensions.load_balancing_policies.least_request.v3.LeastRequest",
    "previous_hosts": _T + "extensions.retry.host.previous_hosts.v3.PreviousHostsPredicate",
    "prev_prio": _T + "extensions.retry.priority.previous_priorities.v3.PreviousPrioritiesConfig",
}


def processing_mode(
    *,
    request_headers: bool,
    request_body: str,
    request_trailers: bool,
    response_headers: bool,
    response_body: str,
    response_trailers: bool,
) -> dict[str, str]:
    """An ext_proc ProcessingMode: which parts of the HTTP stream the service sees."""

    def send(on: bool) -> str:
        return "SEND" if on else "SKIP"

    return {
        "request_header_mode": send(request_headers),
        "request_body_mode": request_body,
        "request_trailer_mode": send(request_trailers),
        "response_header_mode": send(response_headers),
        "response_body_mode": response_body,
        "response_trailer_mode": send(response_trailers),
    }


def socket(host: str, port: int) -> dict[str, Any]:
    return {"socket_address": {"address": host, "port_value": port}}


def duration(seconds: float) -> str:
    return f"{seconds:.3f}s"


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


def static_lb_endpoints(addresses: list[str]) -> list[dict[str, Any]]:
    """One locality of `ip:port` endpoints."""
    return [{"lb_endpoints": [{"endpoint": {"address": socket(*split_host_port(a))}} for a in addresses]}]


def grpc_cluster(
    name: str, endpoints: list[tuple[str, int]], *, cluster_type: str = "STATIC", connect_timeout: str = "1s"
) -> dict[str, Any]:
    """A cluster of gRPC (HTTP/2) services, e.g. ext_proc servers; callers add TLS, breakers, checks."""
    return {
        "name": name,
        "type": cluster_type,
        "connect_timeout": connect_timeout,
        "load_assignment": {
            "cluster_name": name,
            "endpoints": [{"lb_endpoints": [{"endpoint": {"address": socket(h, p)}} for h, p in endpoints]}],
        },
        "typed_extension_protocol_options": {
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                "@type": TYPES["http_opts"],
                "explicit_http_config": {"http2_protocol_options": {}},
            }
        },
    }


def ext_proc_filter(
    name: str,
    cluster: str,
    timeout_s: float,
    mode: dict[str, str],
    *,
    failure_mode_allow: bool = False,
    grpc_service: dict[str, Any] | None = None,
    **options: Any,
) -> dict[str, Any]:
    """An ext_proc HTTP filter calling `cluster`; `options` are further ExternalProcessor fields.

    `grpc_service` adds fields to the gRPC service (e.g. initial_metadata)."""
    return {
        "name": name,
        "typed_config": {
            "@type": TYPES["ext_proc"],
            "grpc_service": {
                "envoy_grpc": {"cluster_name": cluster},
                "timeout": duration(timeout_s),
                **(grpc_service or {}),
            },
            "failure_mode_allow": failure_mode_allow,
            "processing_mode": mode,
            "message_timeout": duration(timeout_s),
            **options,
        },
    }


def router_filter() -> dict[str, Any]:
    """The terminal HTTP filter of every chain."""
    return {"name": "envoy.filters.http.router", "typed_config": {"@type": TYPES["router"]}}


def json_error_response(status: int, message: str, error_type: str, code: str) -> dict[str, Any]:
    """A route action answering with an OpenAI-style JSON error from Envoy itself."""
    body = json.dumps({"error": {"message": message, "type": error_type, "code": code}})
    return {
        "direct_response": {"status": status, "body": {"inline_string": body}},
        "response_headers_to_add": [{"header": {"key": "content-type", "value": "application/json"}}],
    }


def https_listener(
    host: str,
    port: int,
    server_cert: Path | None,
    server_key: Path | None,
    buffer_bytes: int,
    hcm: dict[str, Any],
) -> dict[str, Any]:
    """The TLS listener (h2 + http/1.1 by ALPN) in front of an HTTP connection manager; plain
    HTTP when no certificate is given (TLS terminated in front of Envoy)."""
    chain: dict[str, Any] = {
        "filters": [{"name": "envoy.filters.network.http_connection_manager", "typed_config": hcm}]
    }
    if server_cert is not None and server_key is not None:
        chain["transport_socket"] = {
            "name": "envoy.transport_sockets.tls",
            "typed_config": {
                "@type": TYPES["tls_down"],
                "common_tls_context": {
                    "alpn_protocols": ["h2", "http/1.1"],
                    "tls_certificates": [
                        {
                            "certificate_chain": {"filename": str(server_cert)},
                            "private_key": {"filename": str(server_key)},
                        }
                    ],
                },
            },
        }
    return {
        "name": "https" if "transport_socket" in chain else "http",
        "address": socket(host, port),
        "per_connection_buffer_limit_bytes": buffer_bytes,
        "filter_chains": [chain],
    }


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


def topology_listener(topo: ListenerTopology, hcm: dict[str, Any]) -> dict[str, Any]:
    return https_listener(
        topo.listen_host,
        topo.listen_port,
        topo.server_cert,
        topo.server_key,
        topo.connection_buffer_bytes,
        hcm,
    )


def bootstrap(
    admin_port: int, listeners: list[dict[str, Any]], clusters: list[dict[str, Any]]
) -> dict[str, Any]:
    """The static bootstrap (admin on loopback only), validated before anyone writes it."""
    out = {
        "admin": {"address": socket("127.0.0.1", admin_port)},
        "static_resources": {"listeners": listeners, "clusters": clusters},
    }
    validate_bootstrap(out)
    return out


def validate_bootstrap(bootstrap: dict[str, Any]) -> None:
    """Parse into the real Bootstrap message: unknown fields or wrong types raise ParseError."""
    from envoy.config.bootstrap.v3 import bootstrap_pb2

    register_types()
    json_format.ParseDict(bootstrap, bootstrap_pb2.Bootstrap())


def register_types() -> None:
    """Register every typed_config type of TYPES with the descriptor pool (for `ParseDict`)."""
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
