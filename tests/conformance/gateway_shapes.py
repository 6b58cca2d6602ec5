"""Envoy bootstraps shaped like the ones Envoy Gateway and kgateway generate for an
HTTPRoute whose backend is an InferencePool, so our EPP can be run behind each.

Test-only: the product renders its own bootstrap (gateway/envoy_config.py); these exist to
show that our EPP also works behind the ext_proc configuration other gateways generate. Built
from gateway/envoy_blocks.py and validated against the real protos like ours.

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

from gateway.envoy_blocks import TYPES, bootstrap, https_listener, processing_mode, socket, split_host_port

DESTINATION = "x-gateway-destination-endpoint"
HEADER_TO_METADATA = "type.googleapis.com/envoy.extensions.filters.http.header_to_metadata.v3.Config"
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


def _full_duplex_mode() -> dict[str, str]:
    return processing_mode(
        request_headers=True,
        request_body="FULL_DUPLEX_STREAMED",
        request_trailers=True,
        response_headers=True,
        response_body="FULL_DUPLEX_STREAMED",
        response_trailers=True,
    )


def _http_version(version: Literal[1, 2]) -> dict[str, Any]:
    key = "http_protocol_options" if version == 1 else "http2_protocol_options"
    return {
        "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
            "@type": TYPES["http_opts"],
            "explicit_http_config": {key: {}},
        }
    }


def _epp_cluster(name: str, host: str, port: int) -> dict[str, Any]:
    """Both: the EPP behind TLS that does not verify the certificate, HTTP/2, least request."""
    return {
        "name": name,
        "type": "STATIC",  # STRICT_DNS on the EPP Service's name in a cluster
        "connect_timeout": "10s",
        "lb_policy": "LEAST_REQUEST",
        "load_assignment": {
            "cluster_name": name,
            "endpoints": [{"lb_endpoints": [{"endpoint": {"address": socket(host, port)}}]}],
        },
        "transport_socket": {
            "name": "envoy.transport_sockets.tls",
            "typed_config": {"@type": TYPES["tls_up"], "common_tls_context": {"validation_context": {}}},
        },
        "typed_extension_protocol_options": _http_version(2),
    }


def _authority(pool: InferencePoolBackend) -> str:
    return f"{pool.name}-epp.{pool.namespace}.svc:9002"


def _route_match(rule: Rule) -> dict[str, Any]:
    return {"match": {"prefix": rule.path_prefix}}


def _hcm(name: str, routes: list[dict[str, Any]], filters: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "@type": TYPES["hcm"],
        "stat_prefix": name,
        "codec_type": "AUTO",
        "route_config": {
            "name": name,
            "virtual_hosts": [{"name": name, "domains": ["*"], "routes": routes}],
        },
        "http_filters": [
            *filters,
            {"name": "envoy.filters.http.router", "typed_config": {"@type": TYPES["router"]}},
        ],
    }


def _finish(gw: Gateway, name: str, hcm: dict[str, Any], clusters: list[dict[str, Any]]) -> dict[str, Any]:
    listener = https_listener("127.0.0.1", gw.listen_port, None, None, 4 * 1024 * 1024, hcm)
    return bootstrap(gw.admin_port, [listener], clusters)


# -- Envoy Gateway + Envoy AI Gateway extension server --------------------------------------


def _eg_filter_name(pool: InferencePoolBackend) -> str:
    return f"envoy.filters.http.ext_proc/endpointpicker/{pool.name}_{pool.namespace}_ext_proc"


def _eg_epp_cluster_name(pool: InferencePoolBackend) -> str:
    return f"envoy.clusters.endpointpicker_{pool.name}_{pool.namespace}_ext_proc"


def _envoy_gateway(gw: Gateway) -> dict[str, Any]:
    filters, clusters, routes = [], [], []
    for pool in gw.pools.values():
        filters.append(
            {
                "name": _eg_filter_name(pool),
                "typed_config": {
                    "@type": TYPES["ext_proc"],
                    "grpc_service": {
                        "envoy_grpc": {
                            "cluster_name": _eg_epp_cluster_name(pool),
                            "authority": _authority(pool),
                        }
                    },
                    "processing_mode": _full_duplex_mode(),
                    "allow_mode_override": False,
                    "message_timeout": "300s",
                    "failure_mode_allow": False,  # the translator ignores the pool's failureMode
                },
            }
        )
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
            {
                "name": cluster,
                "type": "ORIGINAL_DST",
                "lb_policy": "CLUSTER_PROVIDED",
                "connect_timeout": "10s",
                "original_dst_lb_config": {"use_http_header": True, "http_header_name": DESTINATION},
                "typed_extension_protocol_options": _http_version(1),
            }
        )
        disabled = {
            _eg_filter_name(other): {"@type": TYPES["ext_proc_route"], "disabled": True}
            for other in gw.pools.values()
            if other.name != pool.name
        }
        routes.append(
            {
                **_route_match(rule),
                "route": {
                    "cluster": cluster,
                    "prefix_rewrite": "/",
                    "auto_host_rewrite": False,
                    "timeout": "0s",
                },
                **({"typed_per_filter_config": disabled} if disabled else {}),
            }
        )
    return _finish(gw, "envoy-gateway", _hcm("envoy-gateway", routes, filters), clusters)


# -- kgateway ---------------------------------------------------------------------------------

_KG_FILTER = "inference-pool-endpoint-picker"  # kgateway's wellknown.InfPoolTransformationFilterName


def _kg_epp_cluster_name(pool: InferencePoolBackend) -> str:
    return f"endpointpicker_{pool.name}_{pool.namespace}_ext_proc"


def _kg_pool_cluster_name(pool: InferencePoolBackend) -> str:
    return f"endpoint-picker_{pool.name}_{pool.namespace}"


def _kg_pool_cluster(pool: InferencePoolBackend) -> dict[str, Any]:
    name = _kg_pool_cluster_name(pool)
    hosts = [
        {
            "endpoint": {"address": socket(*split_host_port(address))},
            "load_balancing_weight": 1,
            "metadata": {"filter_metadata": {"envoy.lb": {DESTINATION: address}}},
        }
        for address in pool.endpoints
    ]
    return {
        "name": name,
        "type": "STATIC",
        "lb_policy": "ROUND_ROBIN",
        "connect_timeout": "5s",
        "lb_subset_config": {
            "subset_selectors": [{"keys": [DESTINATION]}],
            "fallback_policy": "ANY_ENDPOINT",
        },
        "ignore_health_on_host_removal": True,
        "load_assignment": {"cluster_name": name, "endpoints": [{"lb_endpoints": hosts}]},
        "circuit_breakers": {
            "thresholds": [{"max_connections": 40000, "max_pending_requests": 40000, "max_requests": 40000}]
        },
        "typed_extension_protocol_options": _http_version(1),
    }


def _kg_backend_settings(pool: InferencePoolBackend) -> dict[str, Any]:
    """What kgateway's ApplyForBackend adds for one InferencePool backend."""
    override = {
        "@type": TYPES["ext_proc_route"],
        "overrides": {
            "failure_mode_allow": pool.fail_open,
            "grpc_service": {
                "timeout": "10s",
                "envoy_grpc": {"cluster_name": _kg_epp_cluster_name(pool), "authority": _authority(pool)},
            },
        },
    }
    hint = {"envoy.lb.subset_hint": {f"{DESTINATION}-subset": list(pool.endpoints)}}
    return {"metadata_match": {"filter_metadata": hint}, "typed_per_filter_config": {_KG_FILTER: override}}


def _kgateway(gw: Gateway) -> dict[str, Any]:
    placeholder = InferencePoolBackend(
        "placeholder-pool", (), ("127.0.0.1", 9002), namespace="placeholder-namespace"
    )
    filters = [
        {
            "name": _KG_FILTER,
            "typed_config": {
                "@type": TYPES["ext_proc"],
                "grpc_service": {
                    "envoy_grpc": {
                        "cluster_name": _kg_epp_cluster_name(placeholder),
                        "authority": _authority(placeholder),
                    }
                },
                "processing_mode": _full_duplex_mode(),
                "message_timeout": "5s",
                "failure_mode_allow": False,
                "metadata_options": {
                    "forwarding_namespaces": {"untyped": ["envoy.lb.subset_hint"]},
                    "receiving_namespaces": {"untyped": ["envoy.lb"]},
                },
            },
        },
        {
            "name": "envoy.filters.http.header_to_metadata",
            "typed_config": {
                "@type": HEADER_TO_METADATA,
                "request_rules": [
                    {
                        "header": DESTINATION,
                        "on_header_present": {
                            "metadata_namespace": "envoy.lb",
                            "key": DESTINATION,
                            "type": "STRING",
                        },
                        "remove": False,
                    }
                ],
            },
        },
    ]
    clusters = [_kg_pool_cluster(p) for p in gw.pools.values()]
    clusters += [_epp_cluster(_kg_epp_cluster_name(p), *p.epp) for p in gw.pools.values()]
    routes = []
    for rule in gw.rules:
        action: dict[str, Any] = {"prefix_rewrite": "/", "timeout": "0s"}
        extra: dict[str, Any] = {}
        if len(rule.backends) == 1:
            pool = gw.pools[rule.backends[0][0]]
            settings = _kg_backend_settings(pool)
            action["cluster"] = _kg_pool_cluster_name(pool)
            action["metadata_match"] = settings["metadata_match"]
            extra["typed_per_filter_config"] = settings["typed_per_filter_config"]
        else:
            action["weighted_clusters"] = {
                "clusters": [
                    {
                        "name": _kg_pool_cluster_name(gw.pools[name]),
                        "weight": weight,
                        **_kg_backend_settings(gw.pools[name]),
                    }
                    for name, weight in rule.backends
                ]
            }
        routes.append({**_route_match(rule), "route": action, **extra})
    return _finish(gw, "kgateway", _hcm("kgateway", routes, filters), clusters)
