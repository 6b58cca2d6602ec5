"""The EPP's own Prometheus metrics, named like the Gateway API Inference Extension's.

Keeping GIE's names lets existing dashboards, alerts and autoscaler triggers work unchanged.
The pool gauges (docs/observability.md, "Autoscaling") are what a KEDA or HPA trigger reads:
queue, KV use, in-flight, saturation and ready pods, computed from one snapshot per scrape.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from epp.datalayer.endpoint_records import PoolSnapshot
from epp.datalayer.prefix_index import PrefixIndex
from epp.requestcontrol.agent_session import OTHER as OTHER_AGENT
from epp.scheduling.decision import Decision
from epp.scheduling.request import InferenceRequest
from epp.scheduling.saturation import pool_saturation
from gateway.scheduling_params import DEFAULT_THRESHOLDS, Thresholds

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
_SCHEDULER_BUCKETS = (0.00005, 0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.05)


def _mean_known(values: list[float | None]) -> float:
    """Mean over the pods that reported the value (unknown ones are left out); 0 if none did."""
    known = [v for v in values if v is not None]
    return sum(known) / len(known) if known else 0.0


class _PoolCollector(Collector):
    """Pool-level gauges computed from a fresh snapshot at scrape time."""

    def __init__(
        self, pool_name: str, snapshot: Callable[[], PoolSnapshot], thresholds: Callable[[], Thresholds]
    ) -> None:
        self._pool = pool_name
        self._snapshot = snapshot
        self._thresholds = thresholds

    def collect(self) -> Iterator[GaugeMetricFamily]:
        snap = self._snapshot()
        scraped = [s.metrics for s in snap.endpoints if s.metrics is not None]
        kv = GaugeMetricFamily(
            "inference_pool_average_kv_cache_utilization", "Mean KV-cache use", labels=["name"]
        )
        kv.add_metric([self._pool], _mean_known([m.kv_usage for m in scraped]))
        queue = GaugeMetricFamily(
            "inference_pool_average_queue_size", "Mean waiting requests", labels=["name"]
        )
        queue.add_metric([self._pool], _mean_known([m.waiting for m in scraped]))
        ready = GaugeMetricFamily("inference_pool_ready_pods", "Pods with fresh metrics", labels=["name"])
        ready.add_metric([self._pool], sum(1 for s in snap.endpoints if s.healthy and s.metrics is not None))
        inflight = GaugeMetricFamily(
            "inference_pool_inflight_requests",
            "Requests routed and not finished (with sharedState: by every EPP replica of the pool, "
            "so do not sum it over replicas)",
            labels=["name", "endpoint"],
        )
        for s in snap.endpoints:
            inflight.add_metric([self._pool, s.address], s.inflight_requests)
        running = GaugeMetricFamily(
            "inference_pool_running_requests",
            "Requests this EPP routed to the pool and not finished (the pool's in-flight total)",
            labels=["name"],
        )
        running.add_metric([self._pool], sum(s.inflight_requests for s in snap.endpoints))
        per_pod_queue = GaugeMetricFamily(
            "inference_pool_per_pod_queue_size",
            "Waiting requests each pod reported (model_server_pod: its address)",
            labels=["name", "model_server_pod"],
        )
        for s in snap.endpoints:
            if s.metrics is not None and s.metrics.waiting is not None:
                per_pod_queue.add_metric([self._pool, s.address], s.metrics.waiting)
        th = self._thresholds()
        saturation = GaugeMetricFamily(
            "inference_extension_flow_control_pool_saturation",
            "Mean over pods of min(1, max(queue / queue threshold, KV / KV threshold)); stale, "
            "unscraped or unhealthy pods count 1, an empty pool is 1",
            labels=["inference_pool"],
        )
        saturation.add_metric([self._pool], pool_saturation(snap, th, stale_after=th.stale_after))
        yield from (kv, queue, ready, inflight, running, per_pod_queue, saturation)


class Telemetry:
    def __init__(self, pool_name: str, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.pool_name = pool_name
        r = self.registry
        self.requests = Counter(
            "inference_objective_request", "Requests routed", ["model_name", "target_model_name"], registry=r
        )
        self.errors = Counter(
            "inference_objective_request_error",
            "Requests refused or failed",
            ["model_name", "error_code"],
            registry=r,
        )
        self.duration = Histogram(
            "inference_objective_request_duration_seconds",
            "Routed request duration, routing to end of response",
            ["model_name"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.agent_requests = Counter(
            "inference_extension_agent_requests",
            "Requests routed per agent program (claude-code, codex, opencode, gemini-cli, other)",
            ["agent"],
            registry=r,
        )
        self.held_for_home_total = Counter(
            "inference_extension_held_for_home",
            "Requests held in the EPP's flow-control queue because the pod holding their "
            "conversation's KV was saturated (issue #51: hold rather than thrash)",
            registry=r,
        )
        self.input_tokens = Counter(
            "inference_objective_input_tokens", "Estimated prompt tokens routed", ["model_name"], registry=r
        )
        self.running = Gauge(
            "inference_objective_running_requests", "Requests in flight", ["model_name"], registry=r
        )
        self.prefix_entries = Gauge(
            "inference_extension_prefix_indexer_size", "Block hashes held by the prefix index", registry=r
        )
        self.prefix_bytes = Gauge(
            "inference_extension_prefix_indexer_bytes", "Approximate memory of the prefix index", registry=r
        )
        self.prefix_hit_ratio = Histogram(
            "inference_extension_prefix_indexer_hit_ratio",
            "Prefix-cache score of the chosen endpoint",
            buckets=(0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 1.0),
            registry=r,
        )
        self.rejected_values = Counter(
            "inference_extension_metric_values_rejected",
            "Scraped values rejected (non-finite, negative, out of range); the field reads as unknown",
            ["endpoint", "field", "reason"],
            registry=r,
        )
        self._rejected_labels: dict[str, set[tuple[str, str]]] = {}
        self.scrape_failures = Counter(
            "inference_extension_scrape_failures",
            "Failed scrapes of a pod's metrics page (refused, timed out, not HTTP 200, unparsable); "
            "pod: its name, endpoint: its address",
            ["endpoint", "pod"],
            registry=r,
        )
        self._scrape_failure_labels: dict[str, str] = {}  # endpoint -> pod label
        self.scheduler_e2e = Histogram(
            "inference_extension_scheduler_e2e_duration_seconds",
            "Parse + schedule time per request",
            buckets=_SCHEDULER_BUCKETS,
            registry=r,
        )

    def value_rejected(self, endpoint: str, field: str, reason: str) -> None:
        self.rejected_values.labels(endpoint, field, reason).inc()
        self._rejected_labels.setdefault(endpoint, set()).add((field, reason))

    def scrape_failed(self, endpoint: str, pod: str) -> None:
        self.scrape_failures.labels(endpoint, pod).inc()
        self._scrape_failure_labels[endpoint] = pod

    def forget_endpoint(self, endpoint: str) -> None:
        """Drop a departed pod's series so pod churn does not grow /metrics for ever."""
        for field, reason in self._rejected_labels.pop(endpoint, ()):
            self.rejected_values.remove(endpoint, field, reason)
        pod = self._scrape_failure_labels.pop(endpoint, None)
        if pod is not None:
            self.scrape_failures.remove(endpoint, pod)

    def conformance_test_mode(self) -> None:
        """A gauge an alert can fire on: clients choose endpoints (epp/requestcontrol/conformance_mode.py)."""
        Gauge(
            "epp_conformance_test_mode",
            "1 when this EPP runs in conformance test mode (clients choose endpoints)",
            registry=self.registry,
        ).set(1)

    def attach_pool(
        self,
        snapshot: Callable[[], PoolSnapshot],
        thresholds: Callable[[], Thresholds] = lambda: DEFAULT_THRESHOLDS,
    ) -> None:
        """`thresholds`: the default profile's, which the saturation gauge measures against."""
        self.registry.register(_PoolCollector(self.pool_name, snapshot, thresholds))

    def attach_prefix_index(self, index: PrefixIndex) -> None:
        """Export the prefix index's size so its memory bound is visible in production."""
        self.prefix_entries.set_function(index.memory_entries)
        self.prefix_bytes.set_function(index.approx_bytes)

    def prefix_lookup(self, hit_ratio: float) -> None:
        self.prefix_hit_ratio.observe(hit_ratio)

    def scheduled(self, seconds: float) -> None:
        self.scheduler_e2e.observe(seconds)

    def routed(self, request: InferenceRequest) -> None:
        self.requests.labels(request.model, request.target_model).inc()
        self.agent_requests.labels(request.agent or OTHER_AGENT).inc()  # a fixed set: bounded
        self.input_tokens.labels(request.model).inc(request.prompt_tokens)
        self.running.labels(request.model).inc()

    def finished(self, request: InferenceRequest, *, ok: bool, duration: float) -> None:
        self.running.labels(request.model).dec()
        self.duration.labels(request.model).observe(duration)
        if not ok:
            self.errors.labels(request.model, "upstream_error").inc()

    def queued(self, decision: Decision) -> None:
        """A request waits in the flow-control queue; counted apart when it waits for its home."""
        if decision.hold:
            self.held_for_home_total.inc()

    def request_error(self, model: str, code: str) -> None:
        self.errors.labels(model, code).inc()
