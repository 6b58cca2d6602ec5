"""The scrape loop against real simulated pods: metrics in, failures counted, recovery."""

from __future__ import annotations

import asyncio

from epp.pool import Endpoint, Pool
from epp.scrape import Scraper, SpeedTracker, _Totals
from modelsim.fleet import FleetSpec, run_fleet

SPEC = {
    "time_scale": 50.0,
    "pods": [
        {"name": "v", "model": "m", "profile": "h100-llama3.1-8b", "dialect": "vllm"},
        {"name": "s", "model": "m", "profile": "h100-llama3.1-8b", "dialect": "sglang"},
    ],
}


def test_speed_tracker_reports_the_mean_of_the_latest_interval() -> None:
    t = SpeedTracker()
    assert t.mean_since_last("ttft", _Totals(10.0, 100)) is None  # first sight: no interval yet
    assert t.mean_since_last("ttft", _Totals(10.0, 100)) is None  # nothing finished meanwhile
    assert t.mean_since_last("ttft", _Totals(13.0, 110)) == 0.3
    assert t.mean_since_last("ttft", _Totals(1.0, 5)) is None  # counters reset: server restarted
    assert t.mean_since_last("ttft", None) is None


async def wait_until(predicate, timeout_s: float = 5.0) -> None:  # type: ignore[no-untyped-def]
    for _ in range(int(timeout_s / 0.02)):
        if predicate():
            return
        await asyncio.sleep(0.02)
    raise AssertionError("condition not reached")


async def test_scraper_fills_metrics_per_dialect_and_marks_dead_pods_unhealthy() -> None:
    async with run_fleet(FleetSpec.from_dict(SPEC), host="127.0.0.1") as fleet:
        v, s = fleet.pod("v"), fleet.pod("s")
        pool = Pool(
            [
                Endpoint(v.address, frozenset({"m"}), engine="vllm"),
                Endpoint(s.address, frozenset({"m"}), engine="sglang"),
            ]
        )
        scraper = Scraper(pool, interval_s=0.02, timeout_s=0.2)
        scraper.sync()
        try:
            await wait_until(lambda: all(e.metrics is not None for e in pool.snapshot().endpoints))
            state = pool.snapshot().by_address()
            assert state[v.address].metrics.block_size == 16  # type: ignore[union-attr]
            assert state[v.address].metrics_age < 1.0
            assert all(e.healthy for e in state.values())

            await v.crash()
            await wait_until(lambda: not pool.snapshot().by_address()[v.address].healthy)
            assert pool.snapshot().by_address()[s.address].healthy  # one dead pod affects no other
            assert scraper.failures >= 3

            await v.restart()
            await wait_until(lambda: pool.snapshot().by_address()[v.address].healthy, timeout_s=8)
        finally:
            await scraper.stop()


async def test_scraper_follows_endpoint_changes() -> None:
    async with run_fleet(FleetSpec.from_dict(SPEC), host="127.0.0.1") as fleet:
        v = fleet.pod("v")
        pool = Pool([Endpoint(v.address, frozenset({"m"}))])
        scraper = Scraper(pool, interval_s=0.02, timeout_s=0.2)
        scraper.sync()
        try:
            pool.set_endpoints([])
            scraper.sync()
            assert scraper._tasks == {}
            pool.set_endpoints([Endpoint(v.address, frozenset({"m"}))])
            scraper.sync()
            await wait_until(lambda: pool.snapshot().endpoints[0].metrics is not None)
        finally:
            await scraper.stop()
