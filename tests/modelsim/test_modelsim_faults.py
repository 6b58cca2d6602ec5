"""Fault knobs, through the in-process handle and through POST /sim/fault."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from modelsim.fleet import Fleet

REQ = {"model": "llama", "prompt": "hello", "max_tokens": 2}


async def test_error_rate_gives_json_500s(fleet: Fleet) -> None:
    pod = fleet.pod("llama-0")
    await pod.set_fault(error_rate=1.0)
    async with httpx.AsyncClient(base_url=pod.url) as c:
        r = await c.post("/v1/completions", json=REQ)
        assert r.status_code == 500 and r.json()["error"]["code"] == 500
        await pod.set_fault(error_rate=0.0)
        assert (await c.post("/v1/completions", json=REQ)).status_code == 200


async def test_error_status_makes_the_failures_503s(fleet: Fleet) -> None:
    """What an overloaded engine answers; the gateway retries it on another pod."""
    pod = fleet.pod("llama-0")
    async with httpx.AsyncClient(base_url=pod.url) as c:
        knobs = (await c.post("/sim/fault", json={"error_rate": 1.0, "error_status": 503})).json()
        assert knobs["error_status"] == 503
        r = await c.post("/v1/completions", json={**REQ, "stream": True})
        assert r.status_code == 503 and r.json()["error"]["type"] == "ServiceUnavailable"
        assert (await c.post("/sim/fault", json={"error_status": 404})).status_code == 400
        assert (await c.post("/sim/fault", json={"error_rate": 0.0, "error_status": 500})).status_code == 200
        assert (await c.post("/v1/completions", json=REQ)).status_code == 200


async def test_stall_delays_responses(fleet: Fleet) -> None:
    pod = fleet.pod("llama-0")
    async with httpx.AsyncClient(base_url=pod.url) as c:
        r = await c.post("/sim/fault", json={"stall_s": 10.0})  # simulated seconds: 0.2 s wall at 50x
        assert r.status_code == 200 and r.json()["stall_s"] == 10.0
        t0 = time.perf_counter()
        assert (await c.post("/v1/completions", json=REQ)).status_code == 200
        assert time.perf_counter() - t0 >= 10.0 / fleet.time_scale
        assert (await c.post("/sim/fault", json={"stall_s": -1})).status_code == 400
        assert (await c.post("/sim/fault", json={"error_rate": "x"})).status_code == 400


async def test_crash_aborts_stream_and_refuses_connections(fleet: Fleet) -> None:
    pod = fleet.pod("llama-0")
    async with httpx.AsyncClient(base_url=pod.url) as c:
        req = {"model": "llama", "prompt": "long answer", "max_tokens": 5000, "stream": True}
        async with c.stream("POST", "/v1/completions", json=req) as r:
            got = 0
            with pytest.raises(httpx.HTTPError):
                async for _ in r.aiter_raw():
                    got += 1
                    if got == 3:
                        pod.crash()
        assert got >= 3
        with pytest.raises(httpx.ConnectError):
            await c.get("/health")
    await pod.restart()
    async with httpx.AsyncClient(base_url=pod.url) as c:
        assert (await c.post("/v1/completions", json=REQ)).status_code == 200
        assert pod.engine.stats.request_success["length"] == 1  # a fresh engine after restart


async def test_refuse_closes_listener_until_cleared(fleet: Fleet) -> None:
    pod = fleet.pod("llama-0")
    await pod.set_fault(refuse=True)
    async with httpx.AsyncClient(base_url=pod.url) as c:
        with pytest.raises(httpx.ConnectError):
            await c.get("/health")
    await pod.set_fault(refuse=False)
    async with httpx.AsyncClient(base_url=pod.url) as c:
        assert (await c.get("/health")).status_code == 200


async def test_crash_via_http(fleet: Fleet) -> None:
    pod = fleet.pod("llama-0")
    async with httpx.AsyncClient(base_url=pod.url) as c:
        assert (await c.post("/sim/fault", json={"crash": True})).status_code == 200
    await asyncio.sleep(0.1)
    async with httpx.AsyncClient(base_url=pod.url) as c:
        with pytest.raises(httpx.ConnectError):
            await c.get("/health")


async def test_metrics_faults_garbage_and_delay(fleet: Fleet) -> None:
    pod = fleet.pod("qwen")
    async with httpx.AsyncClient(base_url=pod.url) as c:
        assert (await c.post("/sim/fault", json={"metrics_garbage": True})).json()["metrics_garbage"] is True
        page = (await c.get("/metrics")).text
        assert "sglang:" not in page and page.strip()
        await c.post("/sim/fault", json={"metrics_garbage": False, "metrics_delay_s": 0.2})
        t0 = time.perf_counter()
        assert "sglang:num_running_reqs" in (await c.get("/metrics")).text  # this pod speaks SGLang
        assert time.perf_counter() - t0 >= 0.2
        await c.post("/sim/fault", json={"metrics_delay_s": 0})
        assert (await c.post("/sim/fault", json={"metrics_delay_s": -1})).status_code == 400
        assert (await c.post("/sim/fault", json={"metrics_garbage": 1})).status_code == 400
