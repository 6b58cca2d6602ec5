"""Retries that move, through the real Envoy (docs/scheduling.md, "Retries").

A pod that fails before its response started (503, or killed while it held requests it had
not answered yet) has those requests retried by Envoy on the next pod of the EPP's ranked list;
a stream that had started is never retried. The EPP's in-flight accounting follows the request
to the pod that served it and returns to 0. The llama pool has three pods and a fallback list
of one (`fallbackEndpoints: 1`); the qwen pool keeps the default (0), where a retry goes to
Envoy's least-request pick among the pool's other pods. The tests run in file order on one
gateway (the last kills llama-2).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import httpx
import pytest

from devstack.launch import LocalGateway, start_local_gateway
from tests.integration.conftest import chat
from tests.reliability.conftest import record_figures
from tests.reliability.gateway_helpers import (
    charged_where_served,
    debug_pool,
    pod_address,
    pod_fault,
    ranked_addresses,
    wait_for,
)
from tests.reliability.replica_helpers import envoy_counter
from tests.reliability.test_faults import EVEN, FLEET, LLAMA, LLAMA_POOL, QWEN, QWEN_POOL, even_with_fallback
from tests.waiting import until

RETRIES = f"cluster.pool-{LLAMA_POOL}.upstream_rq_retry"
# Idle pods tie under the `even` profile (ties break at random), so the failing pod gets ranked first.
_patch = even_with_fallback


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalGateway]:
    gateway = start_local_gateway(tmp_path_factory.mktemp("retries"), fleet=FLEET, config_patch=_patch)
    try:
        yield gateway
    finally:
        gateway.stop()


def _all_idle(gw: LocalGateway, pool: str = LLAMA_POOL) -> bool:
    return all(e["inflight_requests"] == 0 for e in debug_pool(gw, pool).values())


async def test_a_503_before_the_first_byte_is_retried_on_the_next_ranked_pod(gw: LocalGateway) -> None:
    """llama-1 answers every inference request 503 at once (an overloaded engine): each request
    the EPP ranked it first is answered 200 by the EPP's second choice, streamed or not."""
    failing = pod_address(gw, "llama-1")
    by_pod = {p["name"]: p["address"] for p in gw.pods}
    pod_fault(gw, "llama-1", error_rate=1.0, error_status=503)
    retries_before = await envoy_counter(gw, RETRIES)
    walked = 0
    try:
        async with gw.client() as client:
            for i in range(60):
                headers = {"x-gateway-decision": "true", **EVEN}
                r = await client.post(
                    "/v1/chat/completions", json=chat(LLAMA, stream=i % 2 == 1), headers=headers
                )
                assert r.status_code == 200, r.text
                served = by_pod[r.headers["x-modelsim-pod"]]
                assert served != failing
                ranked = ranked_addresses(r.headers["x-gateway-decision"])
                if ranked[0] == failing:
                    walked += 1
                    assert served == ranked[1], (ranked, served)  # the EPP's second choice
                if walked >= 4:
                    break
        assert walked >= 4, "the EPP did not rank the failing pod first 4 times in 60 requests"
        await charged_where_served(gw, LLAMA_POOL, LLAMA, failing, EVEN)
        wait_for(lambda: _all_idle(gw), 10, "in-flight back to 0")
        retried = await envoy_counter(gw, RETRIES) - retries_before
        assert retried >= walked
    finally:
        pod_fault(gw, "llama-1", error_rate=0.0, error_status=500)
    record_figures("pod_503", {"walked_to_second_choice": walked, "envoy_retries": retried})


async def test_without_a_fallback_list_a_503_is_retried_on_another_pod_of_the_pool(gw: LocalGateway) -> None:
    """`fallbackEndpoints: 0` (the default): the EPP names one pod; when it answers 503, Envoy's
    retry takes the least-request pick among the pool's other pods (OverrideHost's fallback
    policy, never the pod that failed). The EPP moves the slot there too: these requests are
    trusted, so it sees the response headers."""
    failing = pod_address(gw, "qwen-0")
    pod_fault(gw, "qwen-0", error_rate=1.0, error_status=503)
    walked = 0
    try:
        async with gw.client() as client:
            for i in range(40):
                headers = {"x-gateway-decision": "true", **EVEN}
                r = await client.post(
                    "/v1/chat/completions", json=chat(QWEN, stream=i % 2 == 1), headers=headers
                )
                assert r.status_code == 200, r.text
                assert r.headers["x-modelsim-pod"] == "qwen-1"
                walked += ranked_addresses(r.headers["x-gateway-decision"])[0] == failing
                if walked >= 3:
                    break
        assert walked >= 3, "the EPP did not rank the failing pod first 3 times in 40 requests"
        wait_for(lambda: _all_idle(gw, QWEN_POOL), 10, "in-flight back to 0")
    finally:
        pod_fault(gw, "qwen-0", error_rate=0.0, error_status=500)


async def test_a_pod_killed_mid_load_fails_only_the_streams_it_had_started(gw: LocalGateway) -> None:
    """llama-2 is killed while it holds streams it has started and requests it has not answered
    yet (stalled before their first byte). The started streams are cut, never retried; every
    request that had not started is answered 200 by another pod; in-flight returns to 0."""
    victim = "llama-2"
    retries_before = await envoy_counter(gw, RETRIES)
    heads: dict[int, str] = {}  # request -> the pod whose response headers came
    outcomes: list[tuple[bool, str | None, str]] = []  # (streamed, pod, "done" | "cut" | error)

    async def one(client: httpx.AsyncClient, i: int, streamed: bool, max_tokens: int) -> None:
        body = chat(LLAMA, f"load {i}", stream=streamed, max_tokens=max_tokens)
        pod: str | None = None
        try:
            async with client.stream("POST", "/v1/chat/completions", json=body, headers=EVEN) as r:
                pod = heads[i] = r.headers.get("x-modelsim-pod", "?")
                if r.status_code != 200:
                    outcomes.append((streamed, pod, str(r.status_code)))
                    return
                text = "".join([chunk async for chunk in r.aiter_text()])
            done = "data: [DONE]" in text if streamed else '"finish_reason"' in text
            outcomes.append((streamed, pod, "done" if done else "cut"))
        except httpx.HTTPError as exc:
            outcomes.append((streamed, pod, "cut" if streamed and pod else type(exc).__name__))

    async with gw.client(timeout=60) as client:
        # Long streams, one at a time, until llama-2 serves one (its headers came: started) ...
        tasks: list[asyncio.Task[None]] = []
        while victim not in heads.values():
            assert len(tasks) < 12, f"no stream reached {victim}: {heads}"
            tasks.append(asyncio.create_task(one(client, len(tasks), streamed=True, max_tokens=8000)))
            await until(lambda: len(heads) == len(tasks), "the stream's headers")
        # ... then llama-2 stalls before answering, and requests pile up there unanswered.
        pod_fault(gw, victim, stall_s=200.0)  # 10 s of wall time at time_scale 20
        held = _inflight_on(gw, victim)
        tasks += [asyncio.create_task(one(client, 100 + i, i % 2 == 0, 200)) for i in range(12)]
        await until(lambda: _inflight_on(gw, victim) >= held + 2, "requests waiting on llama-2")
        unanswered = _inflight_on(gw, victim) - held
        killed_at = time.monotonic()
        pod_fault(gw, victim, crash=True)
        await asyncio.gather(*tasks)
    after_kill_s = time.monotonic() - killed_at
    failed = [o for o in outcomes if o[2] not in ("done", "cut")]
    assert not failed, outcomes  # no 5xx, no reset before the response started
    cut = [o for o in outcomes if o[2] == "cut"]
    assert all(streamed and pod == victim for streamed, pod, _ in cut), cut  # only started streams
    retried = await envoy_counter(gw, RETRIES) - retries_before
    assert retried >= unanswered, (retried, unanswered)
    settled = wait_for(lambda: _all_idle(gw), 15, "in-flight back to 0")
    record_figures(
        "pod_killed_mid_load",
        {
            "requests": len(outcomes),
            "cut_started_streams": len(cut),
            "unanswered_on_victim_at_kill": unanswered,
            "envoy_retries": retried,
            "answered_s_after_kill": round(after_kill_s, 3),
            "inflight_zero_s": round(settled, 3),
        },
    )


def _inflight_on(gw: LocalGateway, pod: str) -> int:
    return int(debug_pool(gw, LLAMA_POOL)[pod_address(gw, pod)]["inflight_requests"])
