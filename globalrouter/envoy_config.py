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

Validated like gateway/envoy_config.py: `json_format.ParseDict` into the real Bootstrap.

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

from gateway.envoy_blocks import (
    TYPES,
    bootstrap,
    ext_proc_filter,
    grpc_cluster,
    host_port_argument,
    json_error_response,
    processing_mode,
    router_filter,
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


def _member_route(name: str, retries: int, *, metered: bool) -> dict[str, Any]:
    headers: list[dict[str, Any]] = [{"name": CLUSTER_HEADER, "string_match": {"exact": name}}]
    if metered:
        headers.append({"name": METER_HEADER, "present_match": True})
    route: dict[str, Any] = {
        "name": f"member-{name}" + ("-metered" if metered else ""),
        "match": {"prefix": "/", "headers": headers},
        "route": {"cluster": f"member-{name}", "timeout": "0s", "idle_timeout": "300s"},
        "response_headers_to_add": [
            {"header": {"key": MEMBER_HEADER, "value": name}, "append_action": "OVERWRITE_IF_EXISTS_OR_ADD"},
            {
                "header": {"key": UPSTREAM_HEADER, "value": "%UPSTREAM_REMOTE_ADDRESS%"},
                "append_action": "OVERWRITE_IF_EXISTS_OR_ADD",
            },
        ],
    }
    if metered:  # read by the observer after the router filter chose this route
        route["typed_per_filter_config"] = {
            OBSERVER_FILTER: {
                "@type": TYPES["ext_proc_route"],
                "overrides": {"processing_mode": _observer_mode(response_body="STREAMED")},
            }
        }
    if retries:
        route["route"]["retry_policy"] = {
            # Only failures before the member saw the request: never run a generation twice.
            "retry_on": "connect-failure,refused-stream,reset-before-request",
            "num_retries": retries,
            "per_try_timeout": "0s",
            "retry_priority": {
                "name": "envoy.retry_priorities.previous_priorities",
                "typed_config": {"@type": TYPES["prev_prio"], "update_frequency": 1},
            },
            "retry_back_off": {"base_interval": "0.005s", "max_interval": "0.05s"},
        }
    return route


def _upstream_tls(ca: Path, sni: str) -> dict[str, Any]:
    return {
        "name": "envoy.transport_sockets.tls",
        "typed_config": {
            "@type": TYPES["tls_up"],
            "sni": sni,
            "common_tls_context": {"validation_context": {"trusted_ca": {"filename": str(ca)}}},
        },
    }


def _member_cluster(config: RouterConfig, index: int, topo: GlobalTopology) -> dict[str, Any]:
    """The member at priority 0, every other member at a lower priority (for retries only).

    Each endpoint is matched to its own member's CA (`transport_socket_matches`): self-signed
    member CAs may share a subject name, and one bundle of them fails verification.
    """
    member = config.members[index]
    ordered = [member] + [m for i, m in enumerate(config.members) if i != index]
    localities = [
        {
            "priority": prio,
            "lb_endpoints": [
                {
                    "endpoint": {"address": socket(*m.host_port)},
                    "metadata": {"filter_metadata": {"envoy.transport_socket_match": {"member": m.name}}},
                }
            ],
        }
        for prio, m in enumerate(ordered)
    ]
    return {
        "name": f"member-{member.name}",
        "type": "STATIC",
        "connect_timeout": "0.5s",
        "per_connection_buffer_limit_bytes": topo.connection_buffer_bytes,
        "load_assignment": {"cluster_name": f"member-{member.name}", "endpoints": localities},
        "transport_socket": _upstream_tls(topo.upstream_ca, topo.upstream_sni),
        "transport_socket_matches": [
            {
                "name": f"ca-{name}",
                "match": {"member": name},
                "transport_socket": _upstream_tls(ca, topo.upstream_sni),
            }
            for name, ca in sorted(topo.member_cas.items())
        ],
    }


def _router_cluster(topo: GlobalTopology) -> dict[str, Any]:
    cluster = grpc_cluster("global-router", list(topo.routers))
    cluster["lb_policy"] = "ROUND_ROBIN"
    # A dead or draining replica (gRPC health NOT_SERVING) stops getting new streams.
    cluster["health_checks"] = [
        {
            "timeout": "0.5s",
            "interval": "1s",
            "unhealthy_threshold": 2,
            "healthy_threshold": 1,
            "grpc_health_check": {},
        }
    ]
    return cluster


def _router_filter(topo: GlobalTopology) -> dict[str, Any]:
    """Requests only (the observer filter watches responses); fails closed."""
    return ext_proc_filter(
        ROUTER_FILTER,
        "global-router",
        topo.ext_proc_timeout_s,
        processing_mode(
            request_headers=True,
            request_body="FULL_DUPLEX_STREAMED",
            request_trailers=True,
            response_headers=False,
            response_body="NONE",
            response_trailers=False,
        ),
        metadata_options={"receiving_namespaces": {"untyped": [ROUTE_NAMESPACE]}},
        status_on_error={"code": "ServiceUnavailable"},
    )


def _observer_mode(*, response_body: str) -> dict[str, str]:
    return processing_mode(
        request_headers=False, request_body="NONE", request_trailers=False,
        response_headers=True, response_body=response_body, response_trailers=False,
    )  # fmt: skip


def _observer_filter(topo: GlobalTopology) -> dict[str, Any]:
    """Responses only; fails open (a lost observation must not fail a reply)."""
    return ext_proc_filter(
        OBSERVER_FILTER,
        "global-router",
        topo.ext_proc_timeout_s,
        _observer_mode(response_body="NONE"),
        failure_mode_allow=True,
        grpc_service={"initial_metadata": [{"key": ROLE_METADATA, "value": "observer"}]},
        metadata_options={"forwarding_namespaces": {"untyped": [ROUTE_NAMESPACE]}},
    )


def render_bootstrap(config: RouterConfig, topo: GlobalTopology) -> dict[str, Any]:
    if not topo.routers:
        raise ConfigError("the global Envoy needs at least one router replica")
    retries = min(len(config.members) - 1, 3)
    routes = [_member_route(m.name, retries, metered=True) for m in config.members]
    routes += [_member_route(m.name, retries, metered=False) for m in config.members]
    routes.append(
        {
            "name": "no-member",
            "match": {"prefix": "/"},
            **json_error_response(
                503, "the global router chose no member cluster", "server_error", "no_cluster_selected"
            ),
        }
    )
    hcm = {
        "@type": TYPES["hcm"],
        "stat_prefix": "global",
        "codec_type": "AUTO",
        "stream_idle_timeout": "300s",
        "request_timeout": "0s",
        "use_remote_address": True,
        "route_config": {
            "name": "global",
            "virtual_hosts": [{"name": "all", "domains": ["*"], "routes": routes}],
        },
        "http_filters": [
            {
                "name": "global.strip_routing_headers",
                "typed_config": {
                    "@type": TYPES["header_mutation"],
                    "mutations": {
                        "request_mutations": [{"remove": CLUSTER_HEADER}, {"remove": METER_HEADER}]
                    },
                },
            },
            _router_filter(topo),
            _observer_filter(topo),
            router_filter(),
        ],
    }
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
