"""The pool metrics an autoscaler reads, on a live EPP's /metrics, under real queued load.

Pods that run one sequence at a time (`max_num_seqs: 1`) and four long requests through the
gateway: two run, two wait. The KEDA and HPA examples in deploy/examples query exactly these
series (tests/k8s/test_manifests.py checks that they name them).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from devstack.launch import LocalGateway, pool_name_for, start_local_gateway
from tests.integration.conftest import chat
from tests.waiting import until

MODEL = "llama-3.1-8b-instruct"
POOL = pool_name_for(MODEL)
FLEET = {
    "time_scale": 1.0,  # GPU speed: a long answer takes about a minute, long enough to observe
    "profiles": {"one-seq": {"base": "h100-llama3.1-8b", "max_num_seqs": 1}},
    "pods": [{"name": "llama", "model": MODEL, "profile": "one-seq", "replicas": 2}],
}
# Every series the autoscaling examples read, with its labels.
AUTOSCALING_SERIES = {
    "inference_pool_average_queue_size": {"name"},
    "inference_pool_average_kv_cache_utilization": {"name"},
    "inference_pool_ready_pods": {"name"},
    "inference_pool_running_requests": {"name"},
    "inference_pool_per_pod_queue_size": {"name", "model_server_pod"},
    "inference_pool_inflight_requests": {"name", "endpoint"},
    "inference_extension_flow_control_pool_saturation": {"inference_pool"},
    "gateway_pool_requests_waiting_for_endpoints": {"inference_pool"},  # scale from zero
}


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalGateway]:
    gw = start_local_gateway(tmp_path_factory.mktemp("autoscaling"), fleet=FLEET)
    try:
        yield gw
    finally:
        gw.stop()


def scrape(gw: LocalGateway) -> dict[str, list[tuple[dict[str, str], float]]]:
    """name -> [(labels, value)] from the EPP's /metrics (the real Prometheus text)."""
    text = httpx.get(f"http://127.0.0.1:{gw.epp_metrics_ports[POOL]}/metrics", timeout=5).text
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append((sample.labels, sample.value))
    return out


def value(metrics: dict[str, list[tuple[dict[str, str], float]]], name: str) -> float:
    """The pool-level series' value (exactly one series for this pool)."""
    (only,) = [v for labels, v in metrics.get(name, []) if POOL in labels.values()]
    return only


async def test_pool_metrics_follow_queued_load_and_return_to_idle(gateway: LocalGateway) -> None:
    pods = set(gateway.pods_of(MODEL))

    def both_scraped() -> bool:
        # Until the EPP has a page of a pod it scores it 0 (unknown is never idle), so load sent
        # earlier all lands on the pod scraped first (4 on one pod, 0 on the other, seen in CI).
        series = scrape(gateway).get("inference_pool_per_pod_queue_size", [])
        return {labels["model_server_pod"] for labels, _ in series} == pods

    await until(both_scraped, "both pods scraped by the EPP", within=30)
    async with gateway.client(timeout=120) as client:
        # ~7 ms a token: 10,000 tokens outlast the wait below even when a loaded machine is slow
        # to show the queue (with 3,000 the first answer once ended first: 3 in flight, never 4).
        body = chat(MODEL, "a long answer please", max_tokens=10_000)
        tasks = [asyncio.create_task(client.post("/v1/chat/completions", json=body)) for _ in range(4)]
        try:
            seen: dict[str, list[tuple[dict[str, str], float]]] = {}

            def loaded() -> bool:
                seen.clear()
                seen.update(scrape(gateway))  # the assertions below read this same scrape
                queued = sum(v for labels, v in seen.get("inference_pool_per_pod_queue_size", []))
                # The EPP counts one of its picks the page shows waiting as waiting once it is
                # past its projected start by more than a step (epp/datalayer/ledger.py,
                # STEP_SLACK_S): until the next page after that, saturation reads it as starting.
                saturation = value(seen, "inference_extension_flow_control_pool_saturation")
                return (
                    value(seen, "inference_pool_running_requests") == 4
                    and queued >= 2
                    and saturation == pytest.approx(queued / 10, abs=0.05)
                )

            try:
                await until(loaded, "4 requests in flight, 2 of them queued on the pods", within=45)
            except AssertionError as e:  # say what the last scrape showed, and how the requests ended
                running = [v for labels, v in seen.get("inference_pool_running_requests", [])]
                per_pod = seen.get("inference_pool_per_pod_queue_size", [])
                done = [t.result().status_code if t.done() and not t.exception() else t.done() for t in tasks]
                raise AssertionError(
                    f"{e}: running {running}, queued per pod {per_pod}, requests {done}"
                ) from e
            m = seen
            for name, labels in AUTOSCALING_SERIES.items():
                series = [lbls for lbls, _ in m.get(name, [])]
                assert series, f"{name} missing"
                assert all(set(lbls) == labels for lbls in series), (name, series)
            assert value(m, "inference_pool_ready_pods") == 2
            # 2 waiting when the picks split 2/2 or 3/1, 3 when a burst lands 4/0 (seen in CI: a
            # routing finding of docs/benchmarks/identical-fleets.md, "Picks in pairs").
            queued = sum(v for _, v in m["inference_pool_per_pod_queue_size"])
            assert value(m, "inference_pool_average_queue_size") == queued / 2
            assert 0 < value(m, "inference_pool_average_kv_cache_utilization") < 0.8
            assert {lbls["model_server_pod"] for lbls, _ in m["inference_pool_per_pod_queue_size"]} == pods
            assert sum(v for _, v in m["inference_pool_inflight_requests"]) == 4
            # queued waiting requests, queue threshold 5, 2 pods: (queued / 5) / 2 (KV is far lower);
            # a pod's level is capped at 1, far above these.
            assert value(m, "inference_extension_flow_control_pool_saturation") == pytest.approx(
                queued / 10, abs=0.05
            )
        finally:
            for t in tasks:
                t.cancel()  # the client gives up: Envoy resets, the EPP's in-flight returns
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.gather(*tasks, return_exceptions=True)

    def idle() -> bool:
        m = scrape(gateway)
        return (
            value(m, "inference_pool_running_requests") == 0
            and value(m, "inference_pool_average_queue_size") == 0
            and value(m, "inference_extension_flow_control_pool_saturation") == 0
        )

    await until(idle, "the pool back to idle", within=30)
