"""Faults through the real Envoy: refused pods, scrape failures, EPP death and restart, bad config.

The pool for llama has three pods and a fallback list of one (`fallbackEndpoints: 1`), so the
EPP emits `primary,fallback` and Envoy's OverrideHost retries walk it. qwen is FailOpen.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from devstack.launch import LocalGateway, dev_trust, grpc_serving, start_local_gateway
from tests.integration.conftest import chat
from tests.reliability.conftest import record_figures
from tests.reliability.gateway_helpers import (
    charged_where_served,
    debug_pool,
    pod_address,
    pod_fault,
    ranked_addresses,
    rejected_reloads,
    wait_for,
)
from tests.reliability.replica_helpers import Load
from tests.waiting import until

LLAMA, QWEN = "llama-3.1-8b-instruct", "qwen3-32b"
LLAMA_POOL, QWEN_POOL = "llama-3-1-8b-instruct", "qwen3-32b"
FLEET = {
    "time_scale": 20.0,
    "pods": [
        {"name": "llama", "model": LLAMA, "profile": "h100-llama3.1-8b", "replicas": 3},
        {"name": "qwen", "model": QWEN, "profile": "h100x2-qwen3-32b", "replicas": 2},
    ],
}


# A profile under which idle pods tie (ties break at random), so a test can get the refused pod
# ranked first: under the default, idle identical pods are told apart by the prefix a repeated
# prompt left on the pods that served it, which the refused pod never did.
EVEN = {"x-gateway-inference-objective": "even"}


def even_with_fallback(config: dict[str, Any]) -> None:
    """The `even` profile on every model, the decision header open, llama's pool with one
    fallback endpoint (the retry tests share it)."""
    dev_trust(config)  # the tests read the EPP's ranking from the decision header
    config["profiles"] = {"even": {"weights": {"queue": 1}}}
    for pool in config["pools"]:
        for model in pool["models"]:
            model["objectives"] = [*model.get("objectives", []), "even"]
        if pool["name"] == LLAMA_POOL:
            pool["fallbackEndpoints"] = 1


def _patch(config: dict[str, Any]) -> None:
    even_with_fallback(config)
    for pool in config["pools"]:
        if pool["name"] != LLAMA_POOL:
            pool["failureMode"] = "FailOpen"


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalGateway]:
    gateway = start_local_gateway(tmp_path_factory.mktemp("faults"), fleet=FLEET, config_patch=_patch)
    try:
        yield gateway
    finally:
        gateway.stop()


async def test_refused_pod_falls_back_to_the_next_listed_endpoint(gw: LocalGateway) -> None:
    refused = pod_address(gw, "llama-0")
    pod_fault(gw, "llama-0", refuse=True)
    async with gw.client() as client:
        replies = await asyncio.gather(
            *(
                client.post("/v1/chat/completions", json=chat(LLAMA), headers={"x-gateway-decision": "true"})
                for _ in range(12)
            )
        )
    by_pod = {p["name"]: p["address"] for p in gw.pods}
    walked = 0
    for r in replies:
        assert r.status_code == 200, r.text
        served = by_pod[r.headers["x-modelsim-pod"]]
        assert served != refused
        ranked = ranked_addresses(r.headers["x-gateway-decision"])
        if ranked[0] == refused:
            walked += 1
            assert served == ranked[1], (ranked, served)  # the EPP's fallback, not any pod
    # The simulator cannot be told to listen again over HTTP (its listener is what refuses), so
    # llama-0 stays out for the rest of this module. Its open keep-alive connections (the EPP's
    # scrapes) still work, so it is not marked unhealthy: Envoy's retries are what keep it out.
    async with gw.client() as client:
        after = [await client.post("/v1/chat/completions", json=chat(LLAMA)) for _ in range(4)]
    assert all(r.status_code == 200 and r.headers["x-modelsim-pod"] != "llama-0" for r in after)
    record_figures(
        "refused_pod",
        {"requests": len(replies) + len(after), "errors": 0, "walked_to_fallback": walked},
    )


async def test_a_request_walked_to_the_fallback_holds_its_inflight_slot_there(gw: LocalGateway) -> None:
    """Envoy reports the endpoint that served (`upstream.address`); when a retry walked the
    request past refused llama-0 (still refused from the test above), the EPP counts it on the
    fallback that serves it, not on llama-0, for as long as the answer streams."""
    await charged_where_served(gw, LLAMA_POOL, LLAMA, pod_address(gw, "llama-0"), EVEN)


async def test_pod_killed_mid_stream_is_a_clean_truncation(gw: LocalGateway) -> None:
    body = chat(LLAMA, stream=True, max_tokens=3000)
    lines: list[str] = []
    error: str | None = None
    async with gw.client() as client:
        async with client.stream("POST", "/v1/chat/completions", json=body) as r:
            assert r.status_code == 200
            victim = r.headers["x-modelsim-pod"]
            try:
                async for line in r.aiter_lines():
                    lines.append(line)
                    if len(lines) == 10:
                        pod_fault(gw, victim, crash=True)
            except httpx.HTTPError as exc:  # a reset mid-body is a clean, visible failure
                error = type(exc).__name__
    assert "data: [DONE]" not in lines  # truncated, never silently "complete"
    address = pod_address(gw, victim)
    excluded = wait_for(
        lambda: not debug_pool(gw, LLAMA_POOL)[address]["healthy"], 30, "crashed pod excluded"
    )
    settled = wait_for(
        lambda: all(e["inflight_requests"] == 0 for e in debug_pool(gw, LLAMA_POOL).values()),
        5,
        "in-flight 0",
    )
    async with gw.client() as client:
        after = [await client.post("/v1/chat/completions", json=chat(LLAMA)) for _ in range(4)]
    assert [r.status_code for r in after] == [200] * 4
    assert victim not in {r.headers["x-modelsim-pod"] for r in after}
    record_figures(
        "pod_crash_mid_stream",
        {
            "client_saw": error or "truncated stream",
            "lines_before_cut": len(lines),
            "excluded_s": round(excluded, 3),
            "inflight_zero_s": round(settled, 3),
        },
    )


async def test_epp_killed_under_load_fail_close_answers_json_503_fail_open_keeps_serving(
    gw: LocalGateway,
) -> None:
    """Both pools under load when their EPPs are killed (SIGKILL: no drain). FailClose: JSON 503
    from then on. FailOpen: every request answered, by the pool's `fallback-<pool>` cluster once
    the EPP is gone (its EPP route runs the ext_proc in BUFFERED mode, the only mode where Envoy
    honours failure_mode_allow; a request whose held EPP stream dies goes on too)."""
    try:
        async with gw.client() as client:
            opened, closed = Load(client, QWEN, workers=3), Load(client, LLAMA, workers=3)
            async with opened.running(), closed.running():
                await until(
                    lambda: min(opened.outcomes.total(), closed.outcomes.total()) >= 10, "load answered"
                )
                gw.procs[f"epp-{LLAMA_POOL}"].popen.kill()
                gw.procs[f"epp-{QWEN_POOL}"].popen.kill()
                killed = {"open": opened.outcomes.total(), "closed": closed.outcomes.total()}
                await until(
                    lambda: opened.outcomes.total() >= killed["open"] + 20 and closed.outcomes[503] >= 20,
                    "20 more answers from each pool",
                )
        assert opened.failures() == {}, opened.outcomes
        # FailClose: JSON 503s; at most the requests in flight at the kill cut (their held EPP
        # stream died), none hung (`Load` ends).
        cut = sum(n for k, n in closed.failures().items() if k != 503)
        assert cut <= 3, closed.outcomes
        started = time.monotonic()
        async with gw.client() as client:
            closed_reply = await client.post("/v1/chat/completions", json=chat(LLAMA))
            opened_reply = await client.post("/v1/chat/completions", json=chat(QWEN))
        answered_s = time.monotonic() - started
        assert closed_reply.status_code == 503, closed_reply.text
        assert closed_reply.headers["content-type"] == "application/json"
        assert closed_reply.json()["error"]["type"] == "server_error"
        assert opened_reply.status_code == 200, opened_reply.text
        assert opened_reply.headers["x-modelsim-pod"].startswith("qwen")
        record_figures(
            "epp_killed_under_load",
            {
                "fail_open": dict(opened.outcomes),
                "fail_close": dict(closed.outcomes),
                "answered_s": round(answered_s, 3),
            },
        )
    finally:
        started = time.monotonic()
        gw.restart(f"epp-{LLAMA_POOL}")
        gw.restart(f"epp-{QWEN_POOL}")

    async def served() -> bool:
        async with gw.client() as client:
            return (await client.post("/v1/chat/completions", json=chat(LLAMA))).status_code == 200

    while not await served():
        assert time.monotonic() - started < 60, "traffic did not recover after the EPP restart"
        await asyncio.sleep(0.05)
    recovery = time.monotonic() - started
    record_figures("epp_restart", {"recovery_s": round(recovery, 3)})  # ~1.4 s on an idle machine


async def test_corrupt_config_keeps_the_last_good_one(gw: LocalGateway) -> None:
    good = gw.config_path.read_bytes()
    metrics_url = f"http://127.0.0.1:{gw.epp_metrics_ports[LLAMA_POOL]}/metrics"
    wait_for(lambda: grpc_serving(gw.epp_ports[LLAMA_POOL]), 60, "epp serving")
    before = rejected_reloads(metrics_url)
    try:
        gw.config_path.write_text("pools: [ {name: 'Not A Valid Name!', models: 42 ")
        counted = wait_for(lambda: rejected_reloads(metrics_url) > before, 30, "rejected reload counted")
        async with gw.client() as client:
            r = await client.post("/v1/chat/completions", json=chat(LLAMA))
        assert r.status_code == 200, r.text
    finally:
        gw.config_path.write_bytes(good)
    record_figures("corrupt_config", {"rejected_counted_s": round(counted, 3), "served_after": r.status_code})
