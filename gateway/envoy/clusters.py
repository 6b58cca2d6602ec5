"""The Envoy clusters of the gateway: each pool's (OverrideHost over its static pods, or
ORIGINAL_DST for Kubernetes-discovered ones, with their retry budget and circuit breakers) and
the ext_proc services' (BBR and each pool's EPP replicas, health-checked).
"""

from __future__ import annotations

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
from envoy_data_plane.envoy.config.core.v3 import (
    DataSource,
    HealthCheck,
    HealthCheckGrpcHealthCheck,
    TransportSocket,
    TypedExtensionConfig,
)
from envoy_data_plane.envoy.config.core.v3 import RetryPolicy as CoreRetryPolicy
from envoy_data_plane.envoy.config.core.v3 import (
    RetryPolicyRetryHostPredicate as CoreRetryPolicyRetryHostPredicate,
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
from envoy_data_plane.envoy.type.matcher.v3 import StringMatcher
from envoy_data_plane.envoy.type.metadata.v3 import MetadataKey, MetadataKeyPathSegment
from envoy_data_plane.envoy.type.v3 import Percent

from extproc.headers import (
    DESTINATION_HEADER,
)
from gateway.config import GatewayConfig
from gateway.envoy.blocks import (
    TLS_SOCKET,
    grpc_cluster,
    pack,
    seconds,
    static_load_assignment,
    tls_certificate,
)
from gateway.envoy.topology import (
    EXT_PROC_STREAMS_PER_CONNECTION,
    RETRIES,
    RETRY_BUDGET_MIN_CONCURRENCY,
    RETRY_BUDGET_PERCENT,
    SINGLE_HOP_CLUSTER,
    ExtProcTls,
    Topology,
)
from gateway.pool_config import PoolConfig, is_ip, replica_addresses


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


def override_host(pool: PoolConfig, topo: Topology) -> bool:
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


def pool_clusters(config: GatewayConfig, topo: Topology) -> list[Cluster]:
    clusters: list[Cluster] = []
    unknown = topo.original_dst_pools - {pool.name for pool in config.pools}
    if unknown:
        raise ValueError(f"original_dst_pools: no such pool: {', '.join(sorted(unknown))}")
    for pool in config.pools:
        name = f"pool-{pool.name}"
        if override_host(pool, topo):
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


def ext_proc_clusters(config: GatewayConfig, topo: Topology) -> list[Cluster]:
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
