"""The retry budget by behaviour, through the real Envoy (docs/scheduling.md, "Retries"): a storm
of retriable failures does not multiply the pods' load.

Every pod of the pool stalls, then answers 503 (retriable), while a wave of requests is in
flight. Without a budget Envoy would try each request 1 + `RETRIES` times (3x the load on pods
that are already failing). With it, the retries in flight at once stay within
max(`RETRY_BUDGET_PERCENT` of the cluster's requests, `RETRY_BUDGET_MIN_CONCURRENCY`): the
first wave's failures get at most that many retries, the rest go to the client at once
(Envoy's `upstream_rq_retry_overflow`), and those retries get at most one more each. The stall
(`STALL_S` simulated seconds, 5 s of wall time) is long enough for the whole wave to reach the
pods before the first answer: the test waits for that, and checks it afterwards.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import httpx
import pytest

from devstack.launch import LocalGateway, start_local_gateway
from gateway.envoy.topology import RETRIES, RETRY_BUDGET_MIN_CONCURRENCY, RETRY_BUDGET_PERCENT
from tests.integration.conftest import chat
from tests.reliability.gateway_helpers import debug_pool, metric_value, pod_fault
from tests.reliability.replica_helpers import envoy_counter
from tests.waiting import until_awaited

MODEL = "llama-3.1-8b-instruct"
POOL = "llama-3-1-8b-instruct"
TIME_SCALE = 20.0
FLEET = {
    "time_scale": TIME_SCALE,
    "pods": [{"name": "llama", "model": MODEL, "profile": "h100-llama3.1-8b", "replicas": 2}],
}
WAVE = 48  # requests at once: more than the budget's floor can retry
STALL_S = 100.0  # simulated seconds before each 503 (5 s of wall time: the wave lands within it)
BUDGET = max(int(WAVE * RETRY_BUDGET_PERCENT / 100), RETRY_BUDGET_MIN_CONCURRENCY)


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalGateway]:
    gateway = start_local_gateway(tmp_path_factory.mktemp("retry-budget"), fleet=FLEET)
    try:
        yield gateway
    finally:
        gateway.stop()


async def pod_attempts(gw: LocalGateway) -> int:
    """Chat completions the pods' HTTP apps received (each attempt, retries included)."""
    total = 0.0
    async with httpx.AsyncClient(timeout=5) as client:
        for pod in gw.pods:
            text = (await client.get(f"http://{pod['address']}/metrics")).text
            total += metric_value(text, "modelsim_http_requests_total", path="/v1/chat/completions")
    return int(total)


async def test_a_storm_of_503s_is_retried_within_the_budget_not_three_times_over(gw: LocalGateway) -> None:
    overflow_name = f"cluster.pool-{POOL}.upstream_rq_retry_overflow"
    retry_name = f"cluster.pool-{POOL}.upstream_rq_retry"
    before, overflow_before, retries_before = (
        await pod_attempts(gw),
        await envoy_counter(gw, overflow_name),
        await envoy_counter(gw, retry_name),
    )
    for pod in gw.pods:
        pod_fault(gw, pod["name"], error_rate=1.0, error_status=503, stall_s=STALL_S)
    try:
        limits = httpx.Limits(max_connections=WAVE * 2)
        async with gw.client(timeout=120, limits=limits) as client:
            sent = [
                asyncio.create_task(client.post("/v1/chat/completions", json=chat(MODEL, f"storm {i}")))
                for i in range(WAVE)
            ]

            async def wave_at_the_pods() -> bool:
                return await pod_attempts(gw) - before >= WAVE

            await until_awaited(wave_at_the_pods, "the whole wave at the pods", within=60)
            first_wave_landed = not any(task.done() for task in sent)
            responses = await asyncio.gather(*sent)
    finally:
        for pod in gw.pods:
            pod_fault(gw, pod["name"], error_rate=0.0, error_status=500, stall_s=0.0)

    assert first_wave_landed, "an answer came before the wave reached the pods: the stall was too short"
    assert [r.status_code for r in responses] == [503] * WAVE  # every one answered, none hung
    attempts = await pod_attempts(gw) - before
    retried = await envoy_counter(gw, retry_name) - retries_before
    overflowed = await envoy_counter(gw, overflow_name) - overflow_before
    # Unbudgeted: WAVE x (1 + RETRIES) = 144 attempts. Budgeted: at most BUDGET first retries,
    # and one more for each of those.
    assert attempts <= WAVE + RETRIES * BUDGET, (attempts, retried, overflowed)
    assert attempts < WAVE * (1 + RETRIES)
    assert overflowed >= WAVE - BUDGET  # the rest went to the client at once
    assert attempts == WAVE + retried  # the pods saw exactly the first attempts and Envoy's retries

    async def settled() -> bool:
        return not any(p["inflight_requests"] for p in debug_pool(gw, POOL).values())

    await until_awaited(settled, "in-flight back to 0")
