"""Reporter aggregation and the heartbeat API against an in-process router replica."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import Any

from aiohttp import web

from globalrouter.app import GlobalRouterApp
from globalrouter.config import parse_config
from globalrouter.reporter import Reporter, _EppSource, _error_rate, model_reports

POOL: dict[str, Any] = {
    "endpoints": [
        {
            "address": "10.0.0.1:8000", "models": ["m"], "adapters": ["lora"], "healthy": True,
            "metrics": {"waiting": 2, "running": 3, "kv_usage": 0.5}, "inflight_requests": 4,
            "ttft_ewma_s": 0.2, "tpot_ewma_s": 0.01,
        },
        {
            "address": "10.0.0.2:8000", "models": ["m"], "adapters": [], "healthy": True,
            "metrics": {"waiting": 0, "running": 1, "kv_usage": 0.1}, "inflight_requests": 1,
            "ttft_ewma_s": None, "tpot_ewma_s": None,
        },
        {
            "address": "10.0.0.3:8000", "models": ["m"], "adapters": [], "healthy": False,
            "metrics": None, "inflight_requests": 0,
        },
    ]
}  # fmt: skip


def test_model_reports_aggregate_ready_pods_only() -> None:
    reports = {r.model: r for r in model_reports(POOL, 0.25, slots_per_pod=8)}
    m = reports["m"]
    assert (m.ready_pods, m.total_pods, m.capacity) == (2, 3, 16)
    assert m.avg_queue == 1.0 and m.running == 4.0 and m.inflight_requests == 5
    assert abs(m.avg_kv_usage - 0.3) < 1e-9
    assert m.ttft_s == 0.2 and m.tpot_s == 0.01 and m.error_rate == 0.25
    assert reports["lora"].ready_pods == 1


def test_error_rate_needs_enough_events_and_survives_restarts() -> None:
    source = _EppSource("http://x")
    assert _error_rate(source, 0.0, 0, 0) == 0.0
    assert _error_rate(source, 1.0, 2, 2) == 0.0  # 4 events: too few to judge
    assert _error_rate(source, 2.0, 10, 5) == 0.5
    assert _error_rate(source, 3.0, 1, 0) == 0.0  # counters went backwards: EPP restarted


async def _fake_epp(state: dict[str, Any]) -> tuple[web.AppRunner, int]:
    async def pool(_: web.Request) -> web.Response:
        if state["down"]:
            raise web.HTTPServiceUnavailable()
        return web.json_response(POOL)

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(
            text='inference_objective_request_total{model_name="m",target_model_name="m"} 10.0\n'
        )

    app = web.Application()
    app.router.add_get("/debug/pool", pool)
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]


async def until(check: Callable[[], bool], within: float = 20.0) -> None:
    deadline = time.monotonic() + within
    while not check():
        assert time.monotonic() < deadline, f"not within {within} s"
        await asyncio.sleep(0.05)


async def test_heartbeats_reach_the_router_and_epp_outage_zeroes_ready_pods() -> None:
    state = {"down": False}
    epp, epp_port = await _fake_epp(state)
    config = parse_config({"members": [{"name": "east", "address": "127.0.0.1:1"}], "stale_after_s": 1.0})
    router = GlobalRouterApp(config, router_id="r-test")
    await router.start()
    reporter = Reporter(
        cluster="east", region="us-east-1", cost_per_1k_tokens=0.3,
        epp_admin=[f"http://127.0.0.1:{epp_port}"], routers=[f"127.0.0.1:{router.port}"], interval_s=0.2,
    )  # fmt: skip
    task = asyncio.create_task(reporter.run())
    try:

        async def member() -> dict[str, Any]:
            return router.members_json()["members"][0]

        await until(lambda: router.members_json()["members"][0]["available"])
        got = await member()
        assert got["available"] and got["region"] == "us-east-1" and got["cost_per_1k_tokens"] == 0.3
        assert got["models"]["m"]["ready_pods"] == 2
        await until(lambda: reporter.acks[f"127.0.0.1:{router.port}"] > 0)  # the ack may be on its way
        state["down"] = True
        await until(lambda: router.members_json()["members"][0]["models"]["m"]["ready_pods"] == 0)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        stopped = time.monotonic()
        await until(lambda: not router.members_json()["members"][0]["available"])  # stale after 1 s
        assert time.monotonic() - stopped >= 0.5  # the last heartbeat (<= 0.2 s old) kept it fresh a while
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await router.stop(0.1)
        await epp.cleanup()


def test_reporter_rejects_bad_arguments() -> None:
    import pytest

    with pytest.raises(ValueError):
        Reporter(cluster="", region="", cost_per_1k_tokens=0, epp_admin=["http://x"], routers=["x:1"])
    with pytest.raises(ValueError):
        Reporter(cluster="a", region="", cost_per_1k_tokens=-1, epp_admin=["http://x"], routers=["x:1"])
