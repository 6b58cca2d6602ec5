"""EPP replicas: the config (`pools[].epp.replicas`, `sharedState`), the rendered EPP cluster,
and the shared in-flight counts against a real Valkey, the store deploy/ runs (one test on
redis-server: Redis compatibility) (epp/datalayer/shared_state.py)."""

from __future__ import annotations

import asyncio
import dataclasses
import shutil
import time
from pathlib import Path
from typing import Any

import msgpack
import pytest
import yaml
from prometheus_client import CollectorRegistry
from redis.asyncio import Redis

from devstack.redis_server import RedisServer, start_redis
from epp.datalayer.endpoint_records import Endpoint, Metrics
from epp.datalayer.pool import Pool
from epp.datalayer.prefix_index import PrefixIndex
from epp.datalayer.shared_state import SharedState
from gateway.config import ConfigError, SharedStateConfig, parse_config
from gateway.envoy.clusters import ext_proc_cluster

POD_A, POD_B = "10.0.0.1:8000", "10.0.0.2:8000"
REPO = Path(__file__).resolve().parents[2]


def _config(epp: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"pools": [{"name": "p", "models": [{"name": "m"}], "epp": epp}], **extra}


def test_replicas_listen_on_consecutive_ports_of_an_ip_and_once_for_a_name() -> None:
    ip = parse_config(_config({"host": "127.0.0.1", "port": 9002, "replicas": 3})).pools[0].epp
    assert ip.addresses() == [("127.0.0.1", 9002), ("127.0.0.1", 9003), ("127.0.0.1", 9004)]
    dns = parse_config(_config({"host": "epp.ns.svc", "port": 9002, "replicas": 3})).pools[0].epp
    assert dns.addresses() == [("epp.ns.svc", 9002)]
    assert parse_config(_config({})).pools[0].epp.replicas == 1


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (_config({"replicas": 0}), "replicas"),
        (_config({"replicas": 33}), "replicas"),
        (_config({"port": 65535, "replicas": 2}), "runs past 65535"),
        (_config({}, sharedState={"redis": "http://x"}), "sharedState.redis"),
        (_config({}, sharedState={"redis": "redis://x", "ttlMs": 100}), "3 x idleIntervalMs"),
        (_config({}, sharedState={"redis": "redis://x", "publishIntervalMs": 50, "idleIntervalMs": 20}), "idleInterval"),
        (_config({}, sharedState={"redis": "redis://x", "bogus": 1}), "bogus"),
    ],
)  # fmt: skip
def test_bad_replica_settings_are_refused_by_name(data: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_config(data)


def test_the_epp_cluster_lists_every_replica_and_health_checks_them() -> None:
    cluster = ext_proc_cluster("epp-p", "127.0.0.1", 9002, None, replicas=2)
    hosts = [e.endpoint.address.socket_address for e in cluster.load_assignment.endpoints[0].lb_endpoints]
    assert [h.port_value for h in hosts] == [9002, 9003]
    assert cluster.health_checks[0].grpc_health_check is not None
    assert cluster.outlier_detection is not None
    single = ext_proc_cluster("epp-p", "127.0.0.1", 9002, None)
    assert not single.health_checks and len(single.load_assignment.endpoints[0].lb_endpoints) == 1


def test_a_pool_adds_the_other_replicas_counts_to_its_own() -> None:
    pool = Pool([Endpoint(POD_A, frozenset({"m"})), Endpoint(POD_B, frozenset({"m"}))])
    pool.record_metrics(POD_A, Metrics(waiting=0, running=0, scraped_at=time.monotonic()))
    pool.on_routed(POD_A, 100)
    pool.set_remote_inflight({POD_A: (2, 50), "10.9.9.9:1": (5, 5)})  # unknown pods are ignored
    state = pool.snapshot().by_address()
    assert (state[POD_A].inflight_requests, state[POD_A].inflight_tokens) == (3, 150)
    assert state[POD_A].queue == 3  # all three unseen by the scrape
    assert state[POD_B].inflight_requests == 0
    assert pool.local_inflight() == {POD_A: (1, 100)} and pool.inflight(POD_A) == 1


def _replica(redis_url: str, name: str, ttl_ms: int = 300) -> tuple[Pool, SharedState]:
    pool = Pool([Endpoint(POD_A, frozenset({"m"})), Endpoint(POD_B, frozenset({"m"}))])
    config = SharedStateConfig.model_validate(
        {
            "redis": redis_url,
            "publishIntervalMs": 10,
            "idleIntervalMs": 50,
            "ttlMs": ttl_ms,
            "keyPrefix": name,
        }
    )
    return pool, SharedState(pool, "p", config, CollectorRegistry(), replica_id=name + "-r")


async def test_replicas_see_each_other_and_a_silent_one_expires(redis: RedisServer) -> None:
    url = redis.url
    pool_a, a = _replica(url, "t1")
    pool_b, b = _replica(url, "t1")
    b.replica_id = "t1-other"
    pool_a.on_routed(POD_A, 10)
    pool_a.on_routed(POD_A, 10)
    pool_b.on_routed(POD_B, 7)
    assert await a.sync_once() and await b.sync_once() and await a.sync_once()
    assert pool_b.snapshot().by_address()[POD_A].inflight_requests == 2
    assert pool_a.snapshot().by_address()[POD_B].inflight_tokens == 7
    # `a` goes silent (a killed process): `b` stops counting its share once the TTL passes.
    deadline = time.monotonic() + 5
    while pool_b.snapshot().by_address()[POD_A].inflight_requests:
        assert time.monotonic() < deadline, "a silent replica's share never expired"
        await asyncio.sleep(0.05)
        assert await b.sync_once()
    assert b.peers == [] and b.remote == {}
    await a.stop()
    await b.stop()


async def test_the_store_under_test_is_the_valkey_deploy_runs(redis: RedisServer) -> None:
    """deploy/ runs `valkey/valkey:8.1` (base/epp-state.yaml): the tests share state through the
    same server, not a Redis of another lineage and version."""
    image = next(
        c["image"]
        for doc in yaml.safe_load_all((REPO / "deploy/base/epp-state.yaml").read_text())
        if doc and doc["kind"] == "Deployment"
        for c in doc["spec"]["template"]["spec"]["containers"]
    )
    client = Redis.from_url(redis.url)
    info = await client.info("server")
    await client.aclose()
    assert info.get("server_name") == "valkey", info
    assert image == f"valkey/valkey:{'.'.join(str(info['valkey_version']).split('.')[:2])}-alpine"


@pytest.mark.skipif(
    shutil.which("redis-server") is None, reason="Redis compatibility: no redis-server installed"
)
async def test_replicas_share_counts_through_redis_too(tmp_path: Path) -> None:
    """Redis compatibility (`sharedState.redis` may name a Redis): the same sharing on redis-server."""
    server = start_redis(tmp_path / "redis", server="redis")
    try:
        pool_a, a = _replica(server.url, "t-redis")
        pool_b, b = _replica(server.url, "t-redis")
        b.replica_id = "t-redis-other"
        pool_a.on_routed(POD_A, 3)
        assert await a.sync_once() and await b.sync_once()
        assert pool_b.snapshot().by_address()[POD_A].inflight_tokens == 3
        await a.stop()
        await b.stop()
    finally:
        server.stop()


async def test_a_clean_stop_removes_the_share_at_once(redis: RedisServer) -> None:
    pool_a, a = _replica(redis.url, "t2", ttl_ms=60_000)
    pool_b, b = _replica(redis.url, "t2")
    b.replica_id = "t2-other"
    pool_a.on_routed(POD_A, 1)
    assert await a.sync_once() and await b.sync_once()
    assert pool_b.snapshot().by_address()[POD_A].inflight_requests == 1
    await a.stop()  # a TTL of a minute: only the delete can make it disappear now
    assert await b.sync_once()
    assert pool_b.snapshot().by_address()[POD_A].inflight_requests == 0
    await b.stop()


async def test_redis_unreachable_falls_back_to_local_counts(redis: RedisServer, tmp_path: Path) -> None:
    down = start_redis(tmp_path / "down")
    pool, shared = _replica(down.url, "t3")
    pool.on_routed(POD_A, 1)
    pool.set_remote_inflight({POD_A: (4, 4)})
    down.stop()
    started = time.monotonic()
    assert not await shared.sync_once()
    assert time.monotonic() - started < 2  # no hidden retries with backoff
    assert shared.errors == 1 and not shared.connected
    assert pool.snapshot().by_address()[POD_A].inflight_requests == 1  # the stale remote share is gone
    await shared.stop()


async def test_routing_decisions_reach_the_other_replicas_prefix_index(redis: RedisServer) -> None:
    pool_a, _ = _replica(redis.url, "t4")
    pool_b, _ = _replica(redis.url, "t4")
    index_a, index_b = PrefixIndex(), PrefixIndex()
    config = SharedStateConfig.model_validate({"redis": redis.url, "keyPrefix": "t4"})
    a = SharedState(pool_a, "p", config, CollectorRegistry(), replica_id="a", prefix_index=index_a)
    b = SharedState(pool_b, "p", config, CollectorRegistry(), replica_id="b", prefix_index=index_b)
    hashes = index_a.hashes("m", "a long shared system prompt " * 40)
    assert len(hashes) >= 4
    index_a.add(POD_A, hashes)  # what the scheduler does for a request a routed
    index_a.add("10.9.9.9:1", hashes)  # a pod b's pool does not have: never learned
    # Junk on the stream (another writer, a corrupt entry) is skipped, not fatal.
    client = Redis.from_url(redis.url)
    await client.xadd("t4:{p}:prefix", {"r": "x", "b": b"\xc1not msgpack"})
    await client.aclose()
    assert await a.sync_once() and await b.sync_once()
    assert index_b.match(hashes, POD_A) == len(hashes) and index_b.match(hashes, POD_B) == 0
    assert b.learned == 1 and b.bad_entries == 1
    assert await a.sync_once() and a.learned == 0  # its own decisions are not learned twice
    # A replica started later warms its index from the stream's history.
    late_index = PrefixIndex()
    late = SharedState(
        _replica(redis.url, "t4")[0], "p", config, CollectorRegistry(), prefix_index=late_index
    )
    assert await late.sync_once() and late_index.match(hashes, POD_A) == len(hashes)
    for s in (a, b, late):
        await s.stop()


async def test_a_scrape_reaches_the_other_replicas_on_their_clock(redis: RedisServer) -> None:
    config = SharedStateConfig.model_validate({"redis": redis.url, "keyPrefix": "t4s"})
    seen: list[tuple[str, Metrics, float]] = []

    def replica(name: str, on_scrape: Any, settings: SharedStateConfig = config) -> SharedState:
        pool = _replica(redis.url, "t4s")[0]
        return SharedState(pool, "p", settings, CollectorRegistry(), replica_id=name, on_scrape=on_scrape)

    a = replica("a", lambda *args: None)
    b = replica("b", lambda addr, m, at: seen.append((addr, m, at)))
    now = time.monotonic()
    scraped = Metrics(
        waiting=3,
        running=7,
        kv_usage=0.42,
        running_adapters=frozenset({"sql", "chat"}),
        waiting_adapters=frozenset({"x"}),
        max_lora=4,
        block_size=16,
        num_gpu_blocks=900,
        scraped_at=now - 0.02,
    )
    a.publish_scrape(POD_A, scraped, now - 0.03)
    a.publish_scrape("10.9.9.9:1", scraped, now - 0.03)  # a pod b's pool does not have: skipped
    client = Redis.from_url(redis.url)  # junk from another writer is counted and skipped
    await client.xadd("t4s:{p}:prefix", {"r": "x", "s": msgpack.packb([["only", "three", 3]])})
    await client.aclose()
    assert await a.sync_once() and await b.sync_once()
    assert [addr for addr, _, _ in seen] == [POD_A] and b.bad_entries == 1
    _, got, sent_at = seen[0]
    assert dataclasses.replace(got, scraped_at=scraped.scraped_at) == scraped
    # Same host, so the wall-clock round trip lands within a few ms of the original instants.
    assert got.scraped_at == pytest.approx(scraped.scraped_at, abs=0.05)
    assert sent_at == pytest.approx(now - 0.03, abs=0.05) and sent_at <= got.scraped_at
    assert await a.sync_once() and a.scrapes_learned == 0  # its own scrapes come back to no one
    off = SharedStateConfig.model_validate({"redis": redis.url, "keyPrefix": "t4s", "shareScrapes": False})
    c = replica("c", lambda *args: pytest.fail("shareScrapes is off"), off)
    c.publish_scrape(POD_A, scraped, now)
    assert await c.sync_once() and c.scrapes_learned == 0
    for s in (a, b, c):
        await s.stop()


async def test_peers_counts_are_summed_per_pod_and_junk_is_skipped(redis: RedisServer) -> None:
    pool_a, a = _replica(redis.url, "t5", ttl_ms=60_000)
    pool_b, b = _replica(redis.url, "t5", ttl_ms=60_000)
    pool_c, c = _replica(redis.url, "t5")
    b.replica_id, c.replica_id = "t5-b", "t5-c"
    pool_a.on_routed(POD_A, 300)
    pool_a.on_routed(POD_A, 300)
    pool_a.on_routed(POD_B, 5)
    pool_b.on_routed(POD_A, 10)
    assert await a.sync_once() and await b.sync_once()
    # Another writer's hash in the pool's set: values that are not "requests,tokens" are skipped,
    # negative ones count as 0, a bare count is requests only.
    client = Redis.from_url(redis.url)
    junk = ["10.9.9.9:1", "x,y", POD_B, "-3,-4", "10.0.0.3:8000", "7"]
    await client.execute_command("HSET", "t5:{p}:inflight:junk", *junk)
    await client.pexpire("t5:{p}:inflight:junk", 60_000)
    await client.sadd("t5:{p}:replicas", "junk")
    await client.aclose()
    assert await c.sync_once()
    assert sorted(c.peers) == ["junk", "t5-b", "t5-r"]
    assert c.remote == {POD_A: (3, 610), POD_B: (1, 5), "10.0.0.3:8000": (7, 0)}
    assert pool_c.snapshot().by_address()[POD_A].inflight_tokens == 610
    pool_b.on_finished(POD_A, 10)
    assert await b.sync_once() and await c.sync_once()
    assert c.remote[POD_A] == (2, 600)
    assert c.debug()["remote_inflight"][POD_A] == [2, 600]
    for s in (a, b, c):
        await s.stop()


async def test_a_restarted_redis_is_reconnected_and_given_the_script_again(tmp_path: Path) -> None:
    server = start_redis(tmp_path / "restarted")
    try:
        pool_a, a = _replica(server.url, "t6", ttl_ms=60_000)
        pool_b, b = _replica(server.url, "t6", ttl_ms=60_000)
        b.replica_id = "t6-other"
        pool_a.on_routed(POD_A, 1)
        assert await a.sync_once() and await b.sync_once()
        server.stop()
        assert not await b.sync_once() and not b.connected and b.errors == 1
        assert pool_b.snapshot().by_address()[POD_A].inflight_requests == 0
        server.restart()  # empty, and without the script: EVALSHA is refused, EVAL loads it
        assert await a.sync_once() and await b.sync_once() and b.connected
        assert pool_b.snapshot().by_address()[POD_A].inflight_requests == 1
        await a.stop()
        await b.stop()
    finally:
        server.stop()


async def test_a_redis_that_never_answers_times_out_and_the_next_call_reconnects(redis: RedisServer) -> None:
    connections: list[asyncio.StreamWriter] = []

    async def silent(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(writer)  # reads nothing, answers nothing: a hung Redis

    hung = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = hung.sockets[0].getsockname()[1]
    config = SharedStateConfig.model_validate({"redis": f"redis://127.0.0.1:{port}/0", "timeoutMs": 100})
    pool = Pool([Endpoint(POD_A, frozenset({"m"}))])
    shared = SharedState(pool, "p", config, CollectorRegistry())
    started = time.monotonic()
    assert not await shared.sync_once()
    assert time.monotonic() - started < 2 and shared.errors == 1
    assert not await shared.sync_once() and shared.errors == 2
    assert len(connections) == 2  # the timed-out connection was dropped, not reused
    hung.close()
    for writer in connections:
        writer.close()
    await shared.stop()


def test_replicas_share_counts_on_uvloop(redis: RedisServer) -> None:
    """The EPP's default event loop (--event-loop uvloop): its transports are not asyncio's classes."""
    uvloop = pytest.importorskip("uvloop")

    async def share() -> None:
        pool_a, a = _replica(redis.url, "t7", ttl_ms=60_000)
        pool_b, b = _replica(redis.url, "t7")
        b.replica_id = "t7-other"
        pool_a.on_routed(POD_A, 3)
        assert await a.sync_once() and await b.sync_once()
        assert b.remote == {POD_A: (1, 3)} and pool_b.snapshot().by_address()[POD_A].inflight_requests == 1
        await a.stop()
        await b.stop()

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(share())


async def test_a_password_and_a_database_in_the_url_are_used(tmp_path: Path) -> None:
    server = start_redis(tmp_path / "auth")
    try:
        admin = Redis.from_url(server.url)
        await admin.config_set("requirepass", "s3cret")
        await admin.aclose()
        base = f"redis://:s3cret@127.0.0.1:{server.port}"
        pool, shared = _replica(f"{base}/2", "t8")
        pool.on_routed(POD_A, 1)
        assert await shared.sync_once()
        reader = Redis.from_url(f"{base}/2")
        assert await reader.hgetall("t8:{p}:inflight:t8-r") == {b"_": b"1", POD_A.encode(): b"1,1"}
        await reader.aclose()
        _, wrong = _replica(f"redis://:nope@127.0.0.1:{server.port}/2", "t8")
        assert not await wrong.sync_once() and wrong.errors == 1  # refused, logged, counted
        await shared.stop()
        await wrong.stop()
    finally:
        server.stop()


async def test_a_replica_prices_the_others_unseen_picks_by_their_predicted_prefill(
    redis: RedisServer,
) -> None:
    """Replicas see each other's picks as the prefill seconds they committed, not as request
    counts at a typical prompt; a silent replica's share (its ledger) goes with its hash."""
    pool_a, a = _replica(redis.url, "t9")
    pool_b, b = _replica(redis.url, "t9")
    b.replica_id = "t9-other"
    for pool in (pool_a, pool_b):
        pool.record_metrics(POD_A, Metrics(waiting=0, running=0, kv_usage=0.0))
        pool.record_metrics(POD_B, Metrics(waiting=0, running=0, kv_usage=0.0))
    pool_a.on_routed(POD_A, 4000, prefill_s=2.0)  # a long prompt, picked by `a`
    assert await a.sync_once() and await b.sync_once()
    seen = pool_b.snapshot().by_address()[POD_A]
    assert 1.5 < seen.busy_s <= 2.0  # `a`'s pick, minus the time since it was made
    assert seen.foreign_waiting == 0  # not counted a second time as an unseen request
    assert pool_b.snapshot().by_address()[POD_B].busy_s == 0.0
    # `a` goes silent: its share (and with it the busy seconds) leaves with its hash.
    deadline = time.monotonic() + 5
    while pool_b.snapshot().by_address()[POD_A].inflight_requests:
        assert time.monotonic() < deadline, "a silent replica's share never expired"
        await asyncio.sleep(0.05)
        assert await b.sync_once()
    assert pool_b.snapshot().by_address()[POD_A].busy_s == 0.0
    await a.stop()
    await b.stop()


async def test_a_pick_reaches_the_other_replica_as_it_is_made_and_counts_once(redis: RedisServer) -> None:
    """`pushPicks`: a replica's pick wakes its round trip, which publishes it; the peer counts
    it on arrival (before any round trip of its own) and its next round trip, which reads the
    picker's hash, replaces it rather than adding it twice."""
    pool_a, a = _replica(redis.url, "t10", ttl_ms=60_000)
    pool_b, b = _replica(redis.url, "t10", ttl_ms=60_000)
    b.replica_id = "t10-other"
    for pool in (pool_a, pool_b):
        pool.record_metrics(POD_A, Metrics(waiting=0, running=0, kv_usage=0.0))
    assert await b.sync_once() and await a.sync_once() and a.peers == ["t10-other"]
    listening = asyncio.create_task(b.listen())
    client = Redis.from_url(redis.url)
    deadline = time.monotonic() + 10
    while (await client.pubsub_numsub("t10:{p}:picks"))[0][1] < 1:
        assert time.monotonic() < deadline, "the peer never subscribed"
        await asyncio.sleep(0.02)
    a.start()
    try:
        pool_a.on_routed(POD_A, 4000, prefill_s=2.0)
        while b.picks_learned < 1:
            assert time.monotonic() < deadline, "the pick was never pushed"
            await asyncio.sleep(0.01)
        seen = pool_b.snapshot().by_address()[POD_A]
        assert seen.inflight_requests == 1 and seen.inflight_tokens == 4000
        assert 1.5 < seen.busy_s <= 2.0 and seen.foreign_waiting == 0
        assert await b.sync_once()  # the authoritative totals: the same pick, once
        assert pool_b.snapshot().by_address()[POD_A].inflight_requests == 1
    finally:
        listening.cancel()
        await client.aclose()
        await a.stop()
        await b.stop()


def test_without_push_picks_no_pick_is_hooked(redis: RedisServer) -> None:
    pool = Pool([Endpoint(POD_A, frozenset({"m"}))])
    config = SharedStateConfig.model_validate({"redis": redis.url, "pushPicks": False})
    SharedState(pool, "p", config, CollectorRegistry())
    assert pool.pick_hook is None


async def test_a_conversation_routed_by_one_replica_is_in_the_others_kv_memory(redis: RedisServer) -> None:
    """The KV-memory model (epp/datalayer/session_memory.py) is shared like the prefix index:
    a session's next turn, decided by the other replica, sees its whole history on the pod."""
    from epp.datalayer.session_memory import SessionMemory, checkpoints

    pool_a, _ = _replica(redis.url, "t9")
    pool_b, _ = _replica(redis.url, "t9")
    memory_a, memory_b = SessionMemory(), SessionMemory()
    config = SharedStateConfig.model_validate({"redis": redis.url, "keyPrefix": "t9"})
    a = SharedState(
        pool_a, "p", config, CollectorRegistry(), replica_id="a", prefix_index=PrefixIndex(), memory=memory_a
    )
    b = SharedState(
        pool_b, "p", config, CollectorRegistry(), replica_id="b", prefix_index=PrefixIndex(), memory=memory_b
    )
    history = "".join(f"turn {i} of a long agent session; " for i in range(3_000))  # ~100 KB
    cps, per = checkpoints("m", None, history)
    memory_a.routed(POD_A, cps, per, len(history) / 4, 200)  # what the scheduler does on routing
    assert await a.sync_once() and await b.sync_once()
    assert memory_b.depths(cps, [POD_A, POD_B]) == [len(cps), 0]
    assert memory_b.used_tokens(POD_A) == memory_a.used_tokens(POD_A)
    assert await a.sync_once() and memory_a.entries(POD_A) == 1  # not learned twice
    for s in (a, b):
        await s.stop()
