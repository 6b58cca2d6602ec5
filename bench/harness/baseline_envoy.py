"""The benchmarks' baseline Envoy: the same binary and HTTPS listener as the gateway, with a
plain load balancer over the pods (the Kubernetes Service a gateway is compared against).

Benchmark-only, so it lives here and not in gateway/envoy/bootstrap.py (the product's
topologies); it is built from the same gateway/envoy/blocks.py pieces.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from envoy_data_plane.envoy.config.cluster.v3 import Cluster, ClusterDiscoveryType, ClusterLbPolicy
from envoy_data_plane.envoy.config.route.v3 import (
    Route,
    RouteAction,
    RouteConfiguration,
    RouteMatch,
    VirtualHost,
)
from envoy_data_plane.envoy.extensions.filters.http.ext_proc.v3 import (
    ProcessingModeBodySendMode,
    ProcessingModeHeaderSendMode,
)
from envoy_data_plane.envoy.extensions.filters.network.http_connection_manager.v3 import (
    HttpConnectionManager,
    HttpConnectionManagerCodecType,
    HttpFilter,
)

from gateway.envoy.blocks import (
    bootstrap,
    ext_processor,
    http_filter,
    https_listener,
    router_filter,
    seconds,
    static_load_assignment,
)
from gateway.envoy.clusters import ext_proc_cluster
from gateway.envoy.routes import pool_processing_mode

BASELINE_LB_POLICIES = ("ROUND_ROBIN", "LEAST_REQUEST", "RANDOM")


def render_baseline_bootstrap(
    pods: list[str],
    lb_policy: str,
    listen_port: int,
    admin_port: int,
    server_cert: Path,
    server_key: Path,
    *,
    listen_host: str = "127.0.0.1",
    ext_proc: tuple[str, int] | None = None,
    response_body_mode: str = "NONE",
    response_trailer_mode: str = "SEND",
    buffered_request_body: bool = False,
) -> dict[str, Any]:
    """Envoy alone in front of `pods` (ip:port) with a plain load balancer: the Kubernetes
    Service baseline the benchmarks compare against (same binary, same HTTPS listener).

    `ext_proc` puts one ext_proc filter (FULL_DUPLEX_STREAMED request bodies, like the
    gateway's pool routes; BUFFERED with `buffered_request_body`, like
    `requestBodyMode: buffered`) in the chain, to measure the protocol's own cost;
    `response_body_mode` (NONE or STREAMED) measures what sending response bodies to it would
    add, `response_trailer_mode` SKIP what holding the stream to the response's end costs.
    """
    if lb_policy not in BASELINE_LB_POLICIES:
        raise ValueError(f"lb_policy must be one of {', '.join(BASELINE_LB_POLICIES)}, got {lb_policy!r}")
    if not pods:
        raise ValueError("a baseline needs at least one pod address")
    if response_body_mode not in ("NONE", "STREAMED"):
        raise ValueError(f"response_body_mode must be NONE or STREAMED, got {response_body_mode!r}")
    if response_trailer_mode not in ("SEND", "SKIP"):
        raise ValueError(f"response_trailer_mode must be SEND or SKIP, got {response_trailer_mode!r}")
    filters: list[HttpFilter] = []
    clusters: list[Cluster] = []
    if ext_proc is not None:
        mode = pool_processing_mode(response_headers=True, buffered=buffered_request_body)
        mode.response_body_mode = ProcessingModeBodySendMode[response_body_mode]
        mode.response_trailer_mode = ProcessingModeHeaderSendMode[response_trailer_mode]
        filters.append(http_filter("bench.ext_proc", ext_processor("ext_proc", 10.0, mode)))
        clusters.append(ext_proc_cluster("ext_proc", *ext_proc, None))
    clusters.append(
        Cluster(
            name="pods",
            type=ClusterDiscoveryType.STATIC,
            lb_policy=ClusterLbPolicy[lb_policy],
            connect_timeout=seconds(2),
            load_assignment=static_load_assignment("pods", pods),
        )
    )
    route = Route(
        match=RouteMatch(prefix="/"),
        route=RouteAction(cluster="pods", timeout=seconds(0), idle_timeout=seconds(300)),
    )
    hcm = HttpConnectionManager(
        stat_prefix="baseline",
        codec_type=HttpConnectionManagerCodecType.AUTO,
        stream_idle_timeout=seconds(300),
        request_timeout=seconds(0),
        route_config=RouteConfiguration(
            name="baseline", virtual_hosts=[VirtualHost(name="all", domains=["*"], routes=[route])]
        ),
        http_filters=[*filters, router_filter()],
    )
    listener = https_listener(listen_host, listen_port, server_cert, server_key, 4 * 1024 * 1024, hcm)
    return bootstrap(admin_port, [listener], clusters)
