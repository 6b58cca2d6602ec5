"""The benchmarks' baseline Envoy: the same binary and HTTPS listener as the gateway, with a
plain load balancer over the pods (the Kubernetes Service a gateway is compared against).

Benchmark-only, so it lives here and not in gateway/envoy_config.py (the product's
topologies); it is built from the same gateway/envoy_blocks.py pieces.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gateway.envoy_blocks import (
    TYPES,
    bootstrap,
    ext_proc_filter,
    https_listener,
    router_filter,
    static_lb_endpoints,
)
from gateway.envoy_config import ext_proc_cluster, pool_processing_mode

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
    filters: list[dict[str, Any]] = []
    clusters: list[dict[str, Any]] = []
    if ext_proc is not None:
        mode = pool_processing_mode(response_headers=True, buffered=buffered_request_body)
        mode["response_body_mode"] = response_body_mode
        mode["response_trailer_mode"] = response_trailer_mode
        filters.append(ext_proc_filter("bench.ext_proc", "ext_proc", 10.0, mode))
        clusters.append(ext_proc_cluster("ext_proc", *ext_proc, None))
    clusters.append(
        {
            "name": "pods",
            "type": "STATIC",
            "lb_policy": lb_policy,
            "connect_timeout": "2s",
            "load_assignment": {"cluster_name": "pods", "endpoints": static_lb_endpoints(pods)},
        }
    )
    hcm = {
        "@type": TYPES["hcm"],
        "stat_prefix": "baseline",
        "codec_type": "AUTO",
        "stream_idle_timeout": "300s",
        "request_timeout": "0s",
        "route_config": {
            "name": "baseline",
            "virtual_hosts": [
                {
                    "name": "all",
                    "domains": ["*"],
                    "routes": [
                        {
                            "match": {"prefix": "/"},
                            "route": {"cluster": "pods", "timeout": "0s", "idle_timeout": "300s"},
                        }
                    ],
                }
            ],
        },
        "http_filters": [
            *filters,
            router_filter(),
        ],
    }
    listener = https_listener(listen_host, listen_port, server_cert, server_key, 4 * 1024 * 1024, hcm)
    return bootstrap(admin_port, [listener], clusters)
