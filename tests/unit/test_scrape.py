"""The scrape loop against real simulated pods: metrics in, failures counted, recovery."""

from __future__ import annotations

import asyncio
import logging
import random

import pytest
from prometheus_client import generate_latest

from epp.datalayer import scrape as scrape_module
from epp.datalayer.endpoint_records import Endpoint, Metrics
from epp.datalayer.metric_dialects import Rejection
from epp.datalayer.pool import Pool
from epp.datalayer.scrape import Cadence, RejectionReporter, Scraper, SpeedTracker, _busy, _Totals
from epp.requestcontrol.telemetry import Telemetry
from gateway.supervise import TASK_FAILURES, Backoff
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


async def wait_until(predicate, timeout_s: float = 5.0) -> None:
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


async def test_the_scraped_hook_gets_each_good_scrape_with_its_send_time() -> None:
    """Adapter residency dates a scrape's running adapters by when the scrape was sent (the
    page shows the pod after that): the hook's time precedes the parse time, and one good
    scrape calls it once with the recorded metrics."""
    async with run_fleet(FleetSpec.from_dict(SPEC), host="127.0.0.1") as fleet:
        v = fleet.pod("v")
        pool = Pool([Endpoint(v.address, frozenset({"m"}))])
        scraper = Scraper(pool, interval_s=0.02, timeout_s=0.5)
        calls: list[tuple[str, Metrics, float]] = []
        scraper.scraped_hook = lambda address, metrics, sent_at: calls.append((address, metrics, sent_at))
        try:
            metrics = await scraper.scrape_once(pool.endpoints()[0], SpeedTracker())
            assert metrics is not None and pool.metrics(v.address) is metrics
            [(address, got, sent_at)] = calls
            assert address == v.address and got is metrics and sent_at <= metrics.scraped_at
            await v.crash()
            assert await scraper.scrape_once(pool.endpoints()[0], SpeedTracker()) is None
            assert len(calls) == 1  # a failed scrape says nothing
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


async def test_a_crashing_scrape_loop_is_logged_counted_marks_the_pod_unhealthy_and_recovers(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """OverflowError (e.g. int(float("inf")) on a label) used to escape the loop's `except`:
    the task died for good and the pod stayed 'healthy' on its last metrics."""
    real_parse = scrape_module.parse_metrics
    crashes = 0

    def exploding_parse(*args: object, **kwargs: object) -> object:
        nonlocal crashes
        crashes += 1
        raise OverflowError("cannot convert float infinity to integer")

    before = TASK_FAILURES.labels(task="scrape")._value.get()
    async with run_fleet(FleetSpec.from_dict(SPEC), host="127.0.0.1") as fleet:
        v = fleet.pod("v")
        pool = Pool([Endpoint(v.address, frozenset({"m"}), engine="vllm")])
        scraper = Scraper(pool, interval_s=0.02, timeout_s=0.5, restart_backoff=Backoff(0.02, 0.1))
        scraper.sync()
        task = scraper._tasks[v.address]
        try:
            await wait_until(lambda: pool.snapshot().endpoints[0].metrics is not None)
            assert pool.snapshot().endpoints[0].healthy
            with caplog.at_level(logging.ERROR, logger="gateway.supervise"):
                monkeypatch.setattr(scrape_module, "parse_metrics", exploding_parse)
                await wait_until(lambda: crashes >= 3)  # crashed, restarted, crashed again...
                assert not pool.snapshot().endpoints[0].healthy
                assert TASK_FAILURES.labels(task="scrape")._value.get() - before >= 2
                logged = [r for r in caplog.records if f"scrape {v.address}" in r.getMessage()]
                assert logged and logged[0].exc_info and logged[0].exc_info[0] is OverflowError
                assert not task.done()  # the same supervised task, restarting its loop

                monkeypatch.setattr(scrape_module, "parse_metrics", real_parse)
                scraped_before = scraper.scrapes
                await wait_until(
                    lambda: pool.snapshot().endpoints[0].healthy and scraper.scrapes > scraped_before
                )
        finally:
            await scraper.stop()


async def test_rejected_values_are_counted_per_pod_and_logged_at_a_bounded_rate(
    caplog: pytest.LogCaptureFixture,
) -> None:
    telemetry = Telemetry("p")
    reporter = RejectionReporter(telemetry, interval_s=60.0)
    bad = [Rejection("max_lora", "non_finite", "inf"), Rejection("waiting", "negative", "-1.0")]
    with caplog.at_level(logging.WARNING, logger="epp.datalayer.scrape"):
        for i in range(100):  # 100 scrapes with the same two bad values within a minute
            reporter.report("10.0.0.1:8000", bad, now=float(i) * 0.05)
        reporter.report("10.0.0.1:8000", bad[:1], now=61.0)
    counter = telemetry.rejected_values
    assert counter.labels("10.0.0.1:8000", "max_lora", "non_finite")._value.get() == 101
    assert counter.labels("10.0.0.1:8000", "waiting", "negative")._value.get() == 100
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 3  # one per kind, then one more after the interval
    assert "99 more since the last report" in messages[-1]
    reporter.forget("10.0.0.1:8000")
    assert b"10.0.0.1" not in generate_latest(telemetry.registry)


async def test_scrape_failures_are_counted_per_pod_and_logged_once_per_change_of_state(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A pod whose metrics URL is wrong used to turn unhealthy with no log line and no metric:
    now the first failure is logged with its URL and reason, every failure is counted under the
    pod's name, and the recovery is logged once; nothing in between."""
    async with run_fleet(FleetSpec.from_dict(SPEC), host="127.0.0.1") as fleet:
        v = fleet.pod("v")
        telemetry = Telemetry("p")
        pool = Pool([Endpoint(v.address, frozenset({"m"}), name="v-0")])
        scraper = Scraper(pool, interval_s=0.02, timeout_s=0.5, telemetry=telemetry)
        ep, speed = pool.endpoints()[0], SpeedTracker()
        counter = telemetry.scrape_failures.labels(v.address, "v-0")
        try:
            with caplog.at_level(logging.DEBUG, logger="epp.datalayer.scrape"):
                assert await scraper.scrape_once(ep, speed) is not None
                await v.crash()
                for _ in range(5):
                    assert await scraper.scrape_once(ep, speed) is None
                assert counter._value.get() == 5
                assert not pool.snapshot().endpoints[0].healthy
                await v.restart()
                assert await scraper.scrape_once(ep, speed) is not None
                assert await scraper.scrape_once(ep, speed) is not None
            loud = [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO]
            assert len(loud) == 2, loud
            assert f"pod v-0 ({v.address}): scrape of http://{v.address}/metrics failed" in loud[0]
            assert "after 3 failures in a row" in loud[0]
            assert "scraped again after 5 failed scrape(s)" in loud[1]
            assert counter._value.get() == 5  # good scrapes count nothing
            scraper.sync()
            pool.set_endpoints([])
            scraper.sync()
            assert b"scrape_failures_total{" not in generate_latest(telemetry.registry)  # pod gone
        finally:
            await scraper.stop()


def test_cadence_is_fast_while_busy_and_backs_off_to_the_bound_while_idle() -> None:
    c = Cadence(fast_s=0.05, max_s=0.2, jitter=0.1)
    assert c.next_interval(0.2, busy=True) == 0.05
    assert [c.next_interval(x, busy=False) for x in (0.05, 0.1, 0.2, 0.2)] == [0.1, 0.2, 0.2, 0.2]
    rng = random.Random(0)
    spread = [c.jittered(0.1, rng) for _ in range(1000)]
    assert 0.09 <= min(spread) < 0.092 and 0.108 < max(spread) <= 0.11  # +-10 %, both ends reached
    assert Cadence(0.05, 0.2, jitter=0.0).jittered(0.1, rng) == 0.1


def test_a_pod_is_busy_when_it_has_work_or_its_metrics_changed() -> None:
    idle = Metrics(waiting=0, running=0, kv_usage=0.1)
    assert _busy(None, idle, 0)  # first sight
    assert not _busy(idle, Metrics(waiting=0, running=0, kv_usage=0.1), 0)
    assert _busy(idle, idle, 1)  # this EPP routed a request there
    assert _busy(idle, Metrics(waiting=0, running=1, kv_usage=0.1), 0)
    assert _busy(idle, Metrics(waiting=0, running=0, kv_usage=0.2), 0)  # KV changed
    assert _busy(idle, Metrics(waiting=0, running=0, kv_usage=0.1, running_adapters=frozenset({"a"})), 0)


async def test_routing_a_request_ends_an_idle_pods_long_sleep() -> None:
    pool = Pool([Endpoint("10.0.0.1:8000", frozenset({"m"}))])
    scraper = Scraper(pool, interval_s=0.01, max_interval_s=60.0)
    loop = asyncio.get_running_loop()
    sleeper = asyncio.ensure_future(scraper._sleep("10.0.0.1:8000", 60.0, loop))
    await wait_until(lambda: "10.0.0.1:8000" in scraper._wakers)
    pool.on_routed("10.0.0.1:8000", 10)
    await asyncio.wait_for(sleeper, timeout=10)  # not the 60 s
    assert scraper._wakers == {}
    await scraper.stop()


async def test_a_configured_kv_capacity_gives_tgi_pods_a_kv_usage(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """TGI publishes the tokens its batch holds, not a fraction: the pool's kvCapacityTokens
    (or the endpoint's own) must reach the parser, or every TGI pod reads KV-unknown."""
    import yaml

    from epp.app import EppApp

    spec = {
        "time_scale": 50.0,
        "pods": [{"name": "t", "model": "m", "profile": "h100-llama3.1-8b", "dialect": "tgi"}],
    }
    async with run_fleet(FleetSpec.from_dict(spec), host="127.0.0.1") as fleet:
        t = fleet.pod("t")
        config = {
            "pools": [
                {
                    "name": "p",
                    "engine": "tgi",
                    "kvCapacityTokens": 4096,
                    "models": [{"name": "m"}],
                    "endpoints": [{"address": t.address}, {"address": "127.0.0.1:9", "kvCapacityTokens": 64}],
                }
            ]
        }
        path = tmp_path / "gateway.yaml"
        path.write_text(yaml.safe_dump(config))
        app = EppApp(path, "p")
        by_address = {ep.address: ep for ep in app.pool.endpoints()}
        assert by_address[t.address].kv_capacity_tokens == 4096  # the pool's
        assert by_address["127.0.0.1:9"].kv_capacity_tokens == 64  # the endpoint's own wins
        scraper = Scraper(app.pool, interval_s=0.02, timeout_s=0.2)
        scraper.sync()
        try:
            await wait_until(lambda: app.pool.snapshot().by_address()[t.address].metrics is not None)
            metrics = app.pool.snapshot().by_address()[t.address].metrics
            assert metrics is not None and metrics.kv_usage is not None and 0.0 <= metrics.kv_usage <= 1.0
        finally:
            await scraper.stop()


async def test_replicas_sharing_a_pool_scrape_it_at_their_interval_times_their_count() -> None:
    """scrape.shareAcrossReplicas: N replicas each wait N intervals between good scrapes, so
    the pods see one scrape per interval from the pool's EPPs together; one replica alone, or
    one whose shared state is down (no peers known), waits one interval."""
    pool = Pool([Endpoint("10.0.0.1:8000", frozenset({"m"}))])
    scraper = Scraper(pool, interval_s=1.0, max_interval_s=4.0, jitter=0.0)
    sharers = [3]
    scraper.sharers = lambda: sharers[0]
    delays: list[float] = []

    async def scrape_once(ep: Endpoint, speed: SpeedTracker) -> Metrics:
        return Metrics(waiting=1, running=1)  # busy: the fast interval applies

    async def sleep(address: str, delay: float, loop: asyncio.AbstractEventLoop) -> None:
        delays.append(delay)
        if len(delays) == 3:
            sharers[0] = 1  # the peers are gone
        if len(delays) == 5:
            raise asyncio.CancelledError

    scraper.scrape_once = scrape_once  # type: ignore[method-assign]
    scraper._sleep = sleep  # type: ignore[method-assign]
    with pytest.raises(asyncio.CancelledError):
        await scraper._loop(pool.endpoints()[0])
    phase, *waits = delays
    assert 0.0 <= phase <= 3.0  # a random phase over the shared period
    assert all(2.5 < d <= 3.0 for d in waits[:2]), waits  # three sharers: 3 x 1 s
    assert all(0.5 < d <= 1.0 for d in waits[2:]), waits  # alone again: 1 s
