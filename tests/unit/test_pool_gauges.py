"""The EPP's pool gauges (what autoscalers read) from a given snapshot, in Prometheus text."""

from __future__ import annotations

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from epp.datalayer.endpoint_records import Endpoint, EndpointState, Metrics, PoolSnapshot
from epp.requestcontrol.telemetry import Telemetry


def pod(
    address: str, *, waiting: float, kv: float, age: float = 0.05, inflight: int = 0, running: float = 0.0
) -> EndpointState:
    return EndpointState(
        Endpoint(address, frozenset({"m"})),
        Metrics(waiting=waiting, running=running, kv_usage=kv),
        metrics_age=age,
        inflight_requests=inflight,
    )


def gauges(*pods: EndpointState) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    telemetry = Telemetry("p")
    telemetry.attach_pool(lambda: PoolSnapshot(tuple(pods), taken_at=0.0))
    text = generate_latest(telemetry.registry).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name.startswith(("inference_pool_", "inference_extension_flow_control"))
    }


SATURATION = ("inference_extension_flow_control_pool_saturation", (("inference_pool", "p"),))
RUNNING = ("inference_pool_running_requests", (("name", "p"),))


def test_an_empty_pool_is_saturated_with_nothing_in_flight() -> None:
    g = gauges()
    assert g[SATURATION] == 1.0
    assert g[RUNNING] == 0
    assert g[("inference_pool_ready_pods", (("name", "p"),))] == 0


def test_saturation_is_the_mean_of_clamped_pod_levels_and_stale_pods_count_full() -> None:
    idle = pod("10.0.0.1:8000", waiting=0, kv=0.0)
    # Its 3 in-flight requests are all on the page (1 waiting + 2 running): max(1/5, 0.4/0.8).
    half = pod("10.0.0.2:8000", waiting=1, kv=0.4, inflight=3, running=2)
    over = pod("10.0.0.3:8000", waiting=50, kv=0.1, inflight=2)  # 10, clamped to 1
    assert gauges(idle, half, over)[SATURATION] == pytest.approx((0 + 0.5 + 1) / 3)
    stale = pod("10.0.0.4:8000", waiting=0, kv=0.0, age=5.0)  # older than staleAfterMs (1 s)
    g = gauges(idle, stale)
    assert g[SATURATION] == pytest.approx(0.5)
    # In-flight requests the last scrape cannot show yet count as queued (epp/scheduling/saturation.py).
    unseen = pod("10.0.0.5:8000", waiting=0, kv=0.0, inflight=2)  # 2 / 5
    assert gauges(unseen)[SATURATION] == pytest.approx(0.4)
    g = gauges(idle, half, over)
    assert g[RUNNING] == 5
    assert (
        g[("inference_pool_per_pod_queue_size", (("model_server_pod", "10.0.0.3:8000"), ("name", "p")))] == 50
    )
    assert g[("inference_pool_average_queue_size", (("name", "p"),))] == pytest.approx(17)
