"""Render the Envoy bootstrap from the gateway configuration.

Why plain dicts validated against xds-protos rather than envoy-data-plane's typed classes:
the bootstrap reads like the Envoy documentation (so operators can diff it against what they
know), and `json_format.ParseDict` into the real `Bootstrap` message rejects any misspelt
field or wrong type at render time, with the very descriptors Envoy is built from. The
integration tests then run `envoy --mode validate` on the result. One source of truth
(the gateway config) feeds both the services and this file.

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
reset before request) takes the next address of the list, and only cluster members can ever be
chosen, so even a compromised EPP cannot send traffic outside the pool. Kubernetes-discovered
pools keep ORIGINAL_DST (their pods are not known at render time) and use the first address;
`Topology.original_dst_pools` renders a static pool that way too, so the local gateway and
its tests run the very cluster kind Kubernetes deployments use.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from extproc.headers import CLAIM_HEADER, DESTINATION_HEADER, MODEL_HEADER, TENANT_CLAIM_HEADER
from gateway.config import MODELS_PATH, GatewayConfig, PoolConfig, is_ip, replica_addresses
from gateway.envoy_blocks import (
    TYPES,
    bootstrap,
    duration,
    ext_proc_filter,
    grpc_cluster,
    json_error_response,
    processing_mode,
    router_filter,
    static_lb_endpoints,
    topology_listener,
)

ERROR_DETAILS_PREFIX = "gateway_"  # ImmediateResponse details set by our ext_proc services
EPP_FILTER = "gateway.epp"
BBR_FILTER = "gateway.bbr"


# A refused or reset connection to the picked pod moves to the next pod of the EPP's ranked list.
RETRY_ON = "connect-failure,refused-stream,reset-before-request"
RETRIES = 2


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
_REPLICA_HEALTH_CHECK = {
    "timeout": "1s",
    "interval": "1s",
    "no_traffic_interval": "1s",
    "unhealthy_threshold": 1,
    "healthy_threshold": 1,
    "grpc_health_check": {},
}
_REPLICA_OUTLIER_DETECTION = {
    "split_external_local_origin_errors": True,
    "consecutive_local_origin_failure": 1,
    "interval": "1s",
    "base_ejection_time": "5s",
    "max_ejection_percent": 100,
}


def ext_proc_cluster(
    name: str, host: str, port: int, tls: ExtProcTls | None, *, replicas: int = 1
) -> dict[str, Any]:
    """An ext_proc service: a fixed IP locally, a Service DNS name in Kubernetes. `replicas`
    > 1: that many endpoints on consecutive ports (IP) or whatever the name resolves to (a
    headless Service), health-checked so that losing one moves new streams to the others."""
    ip = is_ip(host)
    endpoints = replica_addresses(host, port, replicas)
    cluster = grpc_cluster(name, endpoints, cluster_type="STATIC" if ip else "STRICT_DNS")
    if replicas > 1:
        cluster["health_checks"] = [copy.deepcopy(_REPLICA_HEALTH_CHECK)]
        cluster["outlier_detection"] = copy.deepcopy(_REPLICA_OUTLIER_DETECTION)
    # Each in-flight request holds one EPP stream until its response ends (see
    # `pool_processing_mode`), so Envoy's default of 1,024 requests per cluster would cap a pool
    # at 1,024 concurrent requests (measured with the limit at 2: the 3rd stream got a 503).
    cluster["circuit_breakers"] = copy.deepcopy(_POOL_CIRCUIT_BREAKERS)  # a copy: no YAML anchors
    if not ip:
        cluster["dns_lookup_family"] = "V4_PREFERRED"
    if tls is not None:
        # The service must present a certificate for the very name (or IP) Envoy dials.
        san = {"san_type": "IP_ADDRESS" if ip else "DNS", "matcher": {"exact": host}}
        cluster["transport_socket"] = {
            "name": "envoy.transport_sockets.tls",
            "typed_config": {
                "@type": TYPES["tls_up"],
                "sni": "localhost" if ip else host,
                "common_tls_context": {
                    "tls_certificates": [
                        {
                            "certificate_chain": {"filename": str(tls.client_cert)},
                            "private_key": {"filename": str(tls.client_key)},
                        }
                    ],
                    "validation_context": {
                        "trusted_ca": {"filename": str(tls.ca)},
                        "match_typed_subject_alt_names": [san],
                    },
                },
            },
        }
    return cluster


def pool_processing_mode(
    *, response_headers: bool, buffered: bool = False, response_trailers: bool | None = None
) -> dict[str, str]:
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
        request_body="BUFFERED" if buffered else "FULL_DUPLEX_STREAMED",
        request_trailers=not buffered,
        response_headers=response_headers,
        response_body="NONE",
        response_trailers=response_headers if response_trailers is None else response_trailers,
    )


def _ext_proc_filter(
    name: str, cluster: str, topo: Topology, *, response_headers: bool, disabled: bool, buffered: bool
) -> dict[str, Any]:
    out = ext_proc_filter(
        name,
        cluster,
        topo.ext_proc_timeout_s,
        pool_processing_mode(response_headers=response_headers, buffered=buffered),
        status_on_error={"code": "ServiceUnavailable"},
        allow_mode_override=False,
        mutation_rules={"allow_all_routing": True},
    )
    if name == EPP_FILTER:
        out["typed_config"]["metadata_options"] = {"receiving_namespaces": {"untyped": ["envoy.lb"]}}
        # The endpoint that actually served (a retry may have moved it along the ranked list),
        # sent with the response headers: the EPP moves the in-flight slot there.
        out["typed_config"]["response_attributes"] = ["upstream.address"]
    out["disabled"] = disabled
    return out


def _json_error_route(
    name: str, status: int, message: str, code: str, match: dict[str, Any]
) -> dict[str, Any]:
    return {
        "name": name,
        "match": match,
        **json_error_response(status, message, "invalid_request_error", code),
    }


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


def _path_match(paths: list[str] | None) -> dict[str, Any]:
    """Any path, or exactly the given ones (Envoy matches the path without its query string)."""
    if paths is None:
        return {"prefix": "/"}
    return {"safe_regex": {"regex": "|".join(_regex_escape(p) for p in paths)}}


def _served_routes(config: GatewayConfig, topo: Topology) -> list[dict[str, Any]]:
    """Everything after `/v1/models`: the pools, then Envoy's own JSON errors.

    With the allow-list (the default) a path outside it, or a method other than POST on an
    inference path, never reaches BBR, an EPP or a pod: the routes answering them have BBR
    disabled here and the EPP disabled on every direct response.
    """
    paths = _pool_paths(config)
    if paths is None:  # allowAllPaths: any path and method goes to the pools
        anything = {"prefix": "/"}
        return [*_pool_routes(config, topo, anything), *_no_route(anything)]
    routes: list[dict[str, Any]] = []
    if paths:
        post = _with_headers(_path_match(paths), _POST)
        routes += _pool_routes(config, topo, post)
        routes += _no_route(post)
        routes.append(
            _without_bbr(_method_not_allowed("method-not-allowed", _path_match(paths), "POST"), topo)
        )
    not_served = _json_error_route(
        "path-not-served",
        404,
        f"this gateway serves only these paths: {', '.join(config.listener.paths)}",
        "not_found",
        {"prefix": "/"},
    )
    return [*routes, _without_bbr(not_served, topo)]


_POST = {"name": ":method", "string_match": {"exact": "POST"}}


def _with_headers(match: dict[str, Any], *headers: dict[str, Any]) -> dict[str, Any]:
    """`match` narrowed by more header matchers (all must hold)."""
    return {**match, "headers": [*match.get("headers", []), *headers]}


def _without_bbr(route: dict[str, Any], topo: Topology) -> dict[str, Any]:
    """A route Envoy answers from the request line alone: BBR need not read the body."""
    if not topo.single_hop:
        route.setdefault("typed_per_filter_config", {})[BBR_FILTER] = {
            "@type": TYPES["ext_proc_route"],
            "disabled": True,
        }
    return route


def _method_not_allowed(name: str, match: dict[str, Any], allowed: str) -> dict[str, Any]:
    """A served path with another method: a JSON 405 naming the one it takes (`allow`, RFC 9110)."""
    route = _json_error_route(name, 405, f"this path takes {allowed} only", "method_not_allowed", match)
    route["response_headers_to_add"].append({"header": {"key": "allow", "value": allowed}})
    return route


def _no_route(match: dict[str, Any]) -> list[dict[str, Any]]:
    """After BBR (or the single-hop EPP) routed, no pool route took the request.

    With a model header, the model is one Envoy's routes do not know (yet: the services
    checked it against a configuration Envoy has not received): a 404 `model_not_found` naming
    it. Envoy substitutes the name into a JSON body, so it is escaped, never spliced. Without
    one (no body to route on) the request named no model at all.
    """
    error = {
        "message": f"The model '%REQ({MODEL_HEADER})%' has no route in this gateway",
        "type": "not_found_error",
        "code": "model_not_found",
    }
    unknown_model = {
        "name": "no-route-model",
        "match": _with_headers(match, {"name": MODEL_HEADER, "present_match": True}),
        "direct_response": {
            "status": 404,
            "body_format": {"json_format": {"error": error}, "content_type": "application/json"},
        },
    }
    no_model = "no route: send an OpenAI-compatible JSON request with a 'model' field"
    return [unknown_model, _json_error_route("no-route", 404, no_model, "route_not_found", match)]


def _pool_routes(config: GatewayConfig, topo: Topology, path: dict[str, Any]) -> list[dict[str, Any]]:
    """Two routes per pool (one in single-hop), matching `path` (paths and method) and the model."""
    routes: list[dict[str, Any]] = []
    for pool in config.pools:
        names = [m.name for m in pool.models] + [a for m in pool.models for a in m.adapters]
        model_match = {
            "name": MODEL_HEADER,
            "string_match": {"safe_regex": {"regex": "|".join(_regex_escape(n) for n in names)}},
        }
        # 1) After the EPP chose: route by `envoy.lb` metadata to the chosen pod.
        routes.append(
            {
                "name": f"{pool.name}-picked",
                "match": _with_headers(
                    path, model_match, {"name": DESTINATION_HEADER, "present_match": True}
                ),
                "route": {
                    "cluster": f"pool-{pool.name}",
                    "timeout": "0s",
                    "idle_timeout": "300s",
                    **({"retry_policy": _retry_policy()} if _override_host(pool, topo) else {}),
                },
                "request_headers_to_remove": [
                    CLAIM_HEADER,
                    TENANT_CLAIM_HEADER,
                ],  # the pod needs no client identity
            }
        )
        if topo.single_hop:  # the one EPP already chose, on the entry route (`_single_hop_entry`)
            continue
        # 2) Before the EPP chose: run this pool's EPP. If it fails open, the fallback cluster serves.
        epp_override: dict[str, Any] = {
            "@type": TYPES["ext_proc_route"],
            "overrides": {
                "grpc_service": {
                    "envoy_grpc": {"cluster_name": f"epp-{pool.name}"},
                    "timeout": duration(topo.ext_proc_timeout_s),
                },
                "failure_mode_allow": pool.failure_mode == "FailOpen",
                # Response headers + trailers: the EPP holds the request's in-flight slot until
                # the response ends; only pool routes ask for them.
                "processing_mode": pool_processing_mode(
                    response_headers=config.epp_reads_response_headers(pool),
                    response_trailers=True,
                    buffered=config.buffers_request_bodies(pool),
                ),
            },
        }
        fallback = f"fallback-{pool.name}" if pool.failure_mode == "FailOpen" else f"pool-{pool.name}"
        routes.append(
            {
                "name": f"{pool.name}-pick",
                "match": _with_headers(path, model_match),
                "route": {"cluster": fallback, "timeout": "0s", "idle_timeout": "300s"},
                "request_headers_to_remove": [CLAIM_HEADER, TENANT_CLAIM_HEADER],
                "typed_per_filter_config": {EPP_FILTER: epp_override},
            }
        )
    return routes


SINGLE_HOP_CLUSTER = "epp"


def _single_hop_entry(route: dict[str, Any], *, buffered: bool, response_headers: bool) -> None:
    """Single-hop: the routes a request can match before the EPP answers, i.e. where the one EPP
    filter reads its per-route settings (Envoy reads them once, before the EPP's reply clears
    the route cache). That is `no-route` (no model header yet; when the EPP lets a request
    through without a model, no body, this very route answers Envoy's JSON 404), and the pools'
    `-picked` routes, which a client forging the routing headers matches until they are
    stripped. They ask for response trailers (and headers where a feature reads them), as a pool
    route does in two-hop mode, so the EPP holds the in-flight slot until the response ends."""
    route["typed_per_filter_config"] = {
        EPP_FILTER: {
            "@type": TYPES["ext_proc_route"],
            "overrides": {
                "processing_mode": pool_processing_mode(
                    response_headers=response_headers, response_trailers=True, buffered=buffered
                )
            },
        }
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


def _retry_policy() -> dict[str, Any]:
    """Only failures before the pod saw the request: a generation is never run twice."""
    return {
        "retry_on": RETRY_ON,
        "num_retries": RETRIES,
        "retry_host_predicate": [
            {
                "name": "envoy.retry_host_predicates.previous_hosts",
                "typed_config": {"@type": TYPES["previous_hosts"]},
            }
        ],
        "host_selection_retry_max_attempts": 3,
    }


def _regex_escape(name: str) -> str:
    return re.escape(name)


def _override_host_policy() -> dict[str, Any]:
    """Pick the host named by the EPP's metadata; retries walk its ranked list.

    The fallback (least-request over the members) only serves when the listed hosts are all
    used up or none is a member: still never a host outside the pool.
    """
    return {
        "policies": [
            {
                "typed_extension_config": {
                    "name": "envoy.load_balancing_policies.override_host",
                    "typed_config": {
                        "@type": TYPES["override_host"],
                        "override_host_sources": [
                            {"metadata": {"key": "envoy.lb", "path": [{"key": DESTINATION_HEADER}]}}
                        ],
                        "fallback_policy": {
                            "policies": [
                                {
                                    "typed_extension_config": {
                                        "name": "envoy.load_balancing_policies.least_request",
                                        "typed_config": {"@type": TYPES["least_request"]},
                                    }
                                }
                            ]
                        },
                    },
                }
            }
        ]
    }


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


# Envoy's default circuit breakers allow 3 concurrent retries and 1,024 requests per cluster.
# A pod refusing connections under concurrent load needs more than 3 retries at once (measured:
# the 4th got a 503 instead of the fallback pod), and LLM streams are long-lived, so a pool
# easily holds more than 1,024 at once; the EPP's admission is the real limit.
_POOL_CIRCUIT_BREAKERS: dict[str, Any] = {
    "thresholds": [
        {
            "max_connections": 100_000,
            "max_pending_requests": 100_000,
            "max_requests": 100_000,
            "max_retries": 1_000,
        }
    ]
}


def _pool_clusters(config: GatewayConfig, topo: Topology) -> list[dict[str, Any]]:
    clusters: list[dict[str, Any]] = []
    unknown = topo.original_dst_pools - {pool.name for pool in config.pools}
    if unknown:
        raise ValueError(f"original_dst_pools: no such pool: {', '.join(sorted(unknown))}")
    for pool in config.pools:
        if _override_host(pool, topo):
            clusters.append(
                {
                    "name": f"pool-{pool.name}",
                    "type": "STATIC",
                    "connect_timeout": "2s",
                    "load_assignment": {
                        "cluster_name": f"pool-{pool.name}",
                        "endpoints": static_lb_endpoints([ep.address for ep in pool.endpoints]),
                    },
                    "load_balancing_policy": _override_host_policy(),
                    "per_connection_buffer_limit_bytes": topo.connection_buffer_bytes,
                    "circuit_breakers": _POOL_CIRCUIT_BREAKERS,
                }
            )
        else:
            clusters.append(
                {
                    "name": f"pool-{pool.name}",
                    "type": "ORIGINAL_DST",
                    "lb_policy": "CLUSTER_PROVIDED",
                    "connect_timeout": "2s",
                    "cleanup_interval": "60s",
                    "original_dst_lb_config": {
                        "use_http_header": False,
                        "metadata_key": {"key": "envoy.lb", "path": [{"key": DESTINATION_HEADER}]},
                    },
                    "per_connection_buffer_limit_bytes": topo.connection_buffer_bytes,
                    "circuit_breakers": _POOL_CIRCUIT_BREAKERS,
                }
            )
        if pool.failure_mode == "FailOpen":
            endpoints = topo.fallback_endpoints.get(pool.name) or [ep.address for ep in pool.endpoints]
            clusters.append(
                {
                    "name": f"fallback-{pool.name}",
                    "type": "STATIC",
                    "lb_policy": "LEAST_REQUEST",
                    "connect_timeout": "2s",
                    "load_assignment": {
                        "cluster_name": f"fallback-{pool.name}",
                        "endpoints": static_lb_endpoints(endpoints),
                    },
                }
            )
    return clusters


# Envoy's own refusals by status: (OpenAI error type, stable code, message prefix).
_LOCAL_ERRORS: dict[int, tuple[str, str, str]] = {
    401: ("authentication_error", "invalid_api_key", "authentication failed"),
    403: ("permission_error", "forbidden", "forbidden"),
    413: ("invalid_request_error", "request_too_large", "request too large"),
    431: ("invalid_request_error", "request_header_fields_too_large", "request headers too large"),
}


def _mapper(expression: str, error_type: str, code: str, message: str) -> dict[str, Any]:
    return {
        "filter": {
            "extension_filter": {
                "name": "envoy.access_loggers.extension_filters.cel",
                "typed_config": {"@type": TYPES["cel"], "expression": expression},
            }
        },
        "body_format_override": {
            "json_format": {"error": {"message": message, "type": error_type, "code": code}},
            "content_type": "application/json",
        },
    }


def _local_reply_config() -> dict[str, Any]:
    """Shape Envoy's own error replies (ext_proc down, upstream reset, no route, auth, limits)
    as OpenAI JSON.

    Replies our services produced (details prefixed `gateway_`) and our direct responses are
    already JSON and pass through untouched.
    """
    ours = f"!response.code_details.startsWith('{ERROR_DETAILS_PREFIX}') && response.code_details != 'direct_response'"
    mappers = [
        _mapper(
            f"{ours} && response.code == {status}",
            error_type,
            code,
            f"{prefix}: %LOCAL_REPLY_BODY% (%RESPONSE_CODE_DETAILS%)",
        )
        for status, (error_type, code, prefix) in _LOCAL_ERRORS.items()
    ]
    mappers.append(
        _mapper(
            ours,
            "server_error",
            "%RESPONSE_CODE_DETAILS%",
            "the gateway could not complete the request (%RESPONSE_CODE_DETAILS%) %LOCAL_REPLY_BODY%",
        )
    )
    return {"mappers": mappers}


def _jwt_filter(config: GatewayConfig) -> list[dict[str, Any]]:
    """Verify `Authorization: Bearer <JWT>` against the configured JWKS before anything else runs.

    The token is not forwarded upstream: model servers never see client credentials.
    """
    jwt = config.listener.jwt
    if jwt is None:
        return []
    provider: dict[str, Any] = {
        "issuer": jwt.issuer,
        "local_jwks": {"inline_string": jwt.jwks},
        "forward": False,
    }
    if jwt.audiences:
        provider["audiences"] = list(jwt.audiences)
    claim = config.listener.trust.jwt_claim
    if claim is not None:  # the EPP trusts the request when this equals the configured value
        provider["claim_to_headers"] = [{"header_name": CLAIM_HEADER, "claim_name": claim.name}]
    tenant_claim = config.flow_control.tenant_claim
    if tenant_claim is not None:  # the EPP's fair-share tenant (epp/flow_control.py)
        provider.setdefault("claim_to_headers", []).append(
            {"header_name": TENANT_CLAIM_HEADER, "claim_name": tenant_claim}
        )
    return [
        {
            "name": "envoy.filters.http.jwt_authn",
            "typed_config": {
                "@type": TYPES["jwt_authn"],
                "providers": {"gateway": provider},
                "rules": [{"match": {"prefix": "/"}, "requires": {"provider_name": "gateway"}}],
            },
        }
    ]


def render_bootstrap(config: GatewayConfig, topo: Topology) -> dict[str, Any]:
    routes: list[dict[str, Any]] = []
    if config.listener.allow_all_paths or MODELS_PATH in config.listener.paths:
        routes.append(
            {
                "name": "models-list",
                "match": {
                    "path": MODELS_PATH,
                    "headers": [{"name": ":method", "string_match": {"exact": "GET"}}],
                },
                "direct_response": {"status": 200, "body": {"inline_string": _models_list(config)}},
                "response_headers_to_add": [{"header": {"key": "content-type", "value": "application/json"}}],
            }
        )
        if not config.listener.allow_all_paths:
            routes.append(
                _without_bbr(_method_not_allowed("models-method", {"path": MODELS_PATH}, "GET"), topo)
            )
    routes.extend(_served_routes(config, topo))
    if topo.single_hop:
        for route in routes:
            if route["name"].startswith("no-route") or route["name"].endswith("-picked"):
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
        if "direct_response" in route and EPP_FILTER not in route.get("typed_per_filter_config", {}):
            route.setdefault("typed_per_filter_config", {})[EPP_FILTER] = {
                "@type": TYPES["ext_proc_route"],
                "disabled": True,
            }
    hcm = {
        "@type": TYPES["hcm"],
        "stat_prefix": "gateway",
        "codec_type": "AUTO",
        "stream_idle_timeout": "300s",
        "request_timeout": "0s",
        "use_remote_address": True,
        # One spelling per path before the allow-list matches: `/v1/x/../../sleep` is `/sleep`.
        "normalize_path": True,
        "merge_slashes": True,
        "max_request_headers_kb": config.listener.max_request_headers_kb,
        "common_http_protocol_options": {"max_headers_count": config.listener.max_headers_count},
        "route_config": {
            "name": "gateway",
            "virtual_hosts": [{"name": "all", "domains": ["*"], "routes": routes}],
        },
        "http_filters": [
            {
                "name": "gateway.strip_routing_headers",
                "typed_config": {
                    "@type": TYPES["header_mutation"],
                    "mutations": {
                        "request_mutations": [
                            {"remove": h}
                            for h in (
                                DESTINATION_HEADER,
                                MODEL_HEADER,
                                "x-gateway-base-model-name",
                                CLAIM_HEADER,
                                TENANT_CLAIM_HEADER,
                            )
                        ]
                    },
                },
            },
            *_jwt_filter(config),
            *_routing_filters(config, topo),
            router_filter(),
        ],
        "local_reply_config": _local_reply_config(),
    }
    clusters = [*_ext_proc_clusters(config, topo), *_pool_clusters(config, topo)]
    listener = topology_listener(topo, hcm)
    if config.listener.max_buffered_body_bytes is not None:
        # Envoy's buffering filters answer 413 past this (shaped as JSON by `_local_reply_config`).
        listener["per_connection_buffer_limit_bytes"] = config.listener.max_buffered_body_bytes
    return bootstrap(topo.admin_port, [listener], clusters)


def _ext_proc_clusters(config: GatewayConfig, topo: Topology) -> list[dict[str, Any]]:
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


def _routing_filters(config: GatewayConfig, topo: Topology) -> list[dict[str, Any]]:
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
                disabled=False,
                buffered=buffered,
            )
        ]
    return [
        _ext_proc_filter(BBR_FILTER, "bbr", topo, response_headers=False, disabled=False, buffered=buffered),
        # Each pool route points this filter at its own EPP (ExtProcPerRoute). The per-route config is read when the filter runs, i.e. after
        # BBR has cleared the route cache, so it follows the model header.
        # Outside pool routes (e.g. Envoy's own reply to a malformed request, which has no
        # route) the EPP must not hold the response: the default skips response headers.
        _ext_proc_filter(
            EPP_FILTER,
            f"epp-{config.pools[0].name}",
            topo,
            response_headers=False,
            disabled=False,
            buffered=buffered,
        ),
    ]


def write_bootstrap(config: GatewayConfig, topo: Topology, path: Path) -> Path:
    path.write_text(json.dumps(render_bootstrap(config, topo), indent=1))
    return path
