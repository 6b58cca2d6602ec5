"""Faults of active-active EPP replicas, through the real Envoy: two replicas of one pool
sharing their in-flight counts and pushed picks through a real redis-server
(epp/datalayer/shared_state.py). Redis stopped and restarted under load; a replica killed with nothing
in flight, then restarted; a replica killed mid-burst, holding streams.

The tests run in file order on one gateway: the second restarts the replica it killed, the
last kills it again. docs/reliability.md ("EPP replicas and their shared store") says what
they show.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any, cast

import httpx
import pytest
import redis.asyncio as aioredis

from devstack.launch import LocalGateway, start_local_gateway
from devstack.redis_server import RedisServer
from tests.integration.conftest import chat
from tests.reliability.conftest import record_figures
from tests.reliability.replica_helpers import (
    Load,
    Replica,
    dead_out_of_rotation,
    envoy_counter,
    epp_cluster,
    held_streams,
    in_rotation,
    replicas_of,
    settled,
    until_each,
)
from tests.waiting import until_awaited

LLAMA, POOL = "llama-3.1-8b-instruct", "llama-3-1-8b-instruct"
# Simulated time at twice the wall clock: a held answer of 2,000 tokens streams for several
# seconds, long past the kill; the short load requests still take tens of milliseconds.
FLEET = {
    "time_scale": 2.0,
    "pods": [{"name": "llama", "model": LLAMA, "profile": "h100-llama3.1-8b", "replicas": 2}],
}
TTL_MS = 1000


def _key_prefix(single_hop: bool) -> str:
    return f"igw:faults-{'single-hop' if single_hop else 'two-hop'}"


def _shape(gw: LocalGateway) -> str:
    return "single-hop" if gw.single_hop else "two-hop"


def _tag(gw: LocalGateway) -> str:
    """The prefix of the pool's keys in the store (epp/datalayer/shared_state.py)."""
    return f"{_key_prefix(gw.single_hop)}:{{{POOL}}}"


@pytest.fixture(scope="module", params=["two-hop", "single-hop"])
def gw(
    redis: RedisServer, tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[LocalGateway]:
    single_hop = request.param == "single-hop"
    shared = {
        "redis": redis.url,
        "publishIntervalMs": 20,
        "ttlMs": TTL_MS,
        "keyPrefix": _key_prefix(single_hop),
    }
    gateway = start_local_gateway(
        tmp_path_factory.mktemp("replica-faults"),
        fleet=FLEET,
        config_extra={"sharedState": shared},
        epp_replicas=2,
        single_hop=single_hop,
    )
    try:
        yield gateway
    finally:
        gateway.stop()


@pytest.fixture
async def replicas(gw: LocalGateway) -> AsyncIterator[list[Replica]]:
    async with httpx.AsyncClient(timeout=5) as client:
        yield replicas_of(gw, POOL, LLAMA, client)


@pytest.fixture
async def store(redis: RedisServer) -> AsyncIterator[aioredis.Redis]:
    """A plain client of the shared store, to read what the replicas keep there."""
    client = aioredis.Redis.from_url(redis.url, socket_timeout=2, decode_responses=True)
    try:
        yield client
    finally:
        await client.aclose()


async def _connected(replica: Replica) -> bool:
    return await replica.up() == 1 and await replica.peers() == 1


async def _disconnected(replica: Replica) -> bool:
    return await replica.up() == 0


async def _both_subscribed(store: aioredis.Redis, gw: LocalGateway) -> bool:
    """Both replicas listen on the pool's picks channel (their subscriptions are up)."""
    try:
        [(_, listeners)] = await store.pubsub_numsub(f"{_tag(gw)}:picks")
    except (aioredis.ConnectionError, OSError):
        return False
    return bool(listeners == 2)


async def _routes_more(replicas: list[Replica], at_least: int) -> None:
    """Each replica routes `at_least` more of the load's requests than it had."""
    marks = [await r.routed() for r in replicas]
    for replica, mark in zip(replicas, marks, strict=True):
        await until_awaited(
            lambda r=replica, m=mark: _above(r.routed, m + at_least),  # type: ignore[misc]
            f"{replica.name} routes {at_least} more requests",
        )


async def _above(read: Any, value: float) -> bool:
    return bool(await read() >= value)


def _own_picture(data: dict[str, Any]) -> bool:
    """A replica's /debug/pool (one snapshot) counts nothing but its own: no peers, nothing
    remote, every pod's in-flight exactly its own."""
    shared, local = data["shared_state"], data["local_inflight"]
    return (
        shared["peers"] == []
        and shared["remote_inflight"] == {}
        and all(e["inflight_requests"] == local.get(e["address"], [0])[0] for e in data["endpoints"])
    )


async def test_redis_stopped_and_restarted_under_load(
    gw: LocalGateway, replicas: list[Replica], redis: RedisServer, store: aioredis.Redis
) -> None:
    await until_each(replicas, _connected, "connected, one peer")
    await until_awaited(lambda: _both_subscribed(store, gw), "both replicas subscribed to the picks")
    async with gw.client() as client:
        load = Load(client, LLAMA, workers=3, max_requests=400, max_s=120.0)
        async with load.running():
            await _routes_more(replicas, 3)
            redis.stop()
            stopped, served_before = time.monotonic(), load.outcomes[200]
            await until_each(replicas, _disconnected, "gateway_shared_state_up 0")
            down_s = time.monotonic() - stopped
            # Routing continues: each replica keeps routing its share, on its own picture.
            await _routes_more(replicas, 5)
            for replica in replicas:
                data = await replica.pool()
                assert not data["shared_state"]["connected"] and _own_picture(data), data
            served_down = load.outcomes[200] - served_before
            redis.restart()
            restarted = time.monotonic()
            await until_each(replicas, _connected, "gateway_shared_state_up 1 and its peer seen again")
            rejoin_s = time.monotonic() - restarted
            await until_awaited(lambda: _both_subscribed(store, gw), "both replicas subscribed again")
            await _routes_more(replicas, 3)
        assert load.failures() == {}, load.outcomes  # not one 5xx or reset through the outage
        assert load.sent < 400, "the load hit its bound before the test ended"
    # The state rejoined: each replica counts the other's requests again, through its hash
    # and through the pushed picks of the restarted channel.
    learned = [(await r.shared())["picks_learned"] for r in replicas]
    async with gw.client() as client, held_streams(client, LLAMA, 4):

        async def sees_all(replica: Replica) -> bool:
            return await replica.inflight() == 4

        await until_each(replicas, sees_all, "sees all 4 in flight")
        own = [await r.local() for r in replicas]
        assert sum(own) == 4 and min(own) >= 1, own
        for replica, before in zip(replicas, learned, strict=True):

            async def learns(replica: Replica = replica, before: int = before) -> bool:
                return (await replica.shared())["picks_learned"] > before

            await until_awaited(learns, f"{replica.name} counts its peer's pushed picks again")
    await settled(replicas)
    record_figures(
        "redis_stopped_and_restarted_under_load",
        {
            "shape": _shape(gw),
            "requests": load.sent,
            "served_while_down": served_down,
            "down_seen_s": down_s,
            "rejoin_s": rejoin_s,
        },
    )


async def test_a_replica_killed_between_bursts_costs_no_request(
    gw: LocalGateway, replicas: list[Replica], store: aioredis.Redis
) -> None:
    """Killed with nothing in flight, a replica still gets the next streams Envoy sends it
    until its health check fails (1 s): each meets a refused connection and is retried on the
    other replica (replica_retry_policy), so the burst after the kill is served in full."""
    live, dead = replicas
    await until_each(replicas, _connected, "connected, one peer")
    await settled(replicas)
    cluster = f"cluster.{epp_cluster(gw, POOL)}"
    refused_before = await envoy_counter(gw, f"{cluster}.upstream_cx_connect_fail")
    before = await live.routed()
    gw.procs[dead.name].popen.send_signal(signal.SIGKILL)
    gw.procs[dead.name].popen.wait(5)
    burst = 12
    async with gw.client() as client:
        replies = await asyncio.gather(
            *(client.post("/v1/chat/completions", json=chat(LLAMA, f"after {i}")) for i in range(burst))
        )
    codes = [r.status_code for r in replies]
    refused = await envoy_counter(gw, f"{cluster}.upstream_cx_connect_fail") - refused_before
    record_figures(
        "replica_killed_between_bursts", {"shape": _shape(gw), "codes": codes, "refused_connections": refused}
    )
    assert codes == [200] * burst, codes
    assert await live.routed() - before == burst  # every one routed by the survivor

    async def alone() -> bool:
        return await live.peers() == 0 and _own_picture(await live.pool())

    await until_awaited(alone, "the dead replica leaves the survivor's picture")
    # Restarted (a new process, a new replica id), it rejoins: both count each other again
    # and Envoy sends it streams again.
    gw.restart(dead.name)
    await until_each(replicas, _connected, "connected again, one peer")
    await until_awaited(lambda: _both_subscribed(store, gw), "both replicas subscribed to the picks")
    await until_awaited(lambda: in_rotation(gw, POOL, 1), "Envoy's health check passes the restarted replica")
    # Envoy's balancer takes it back a moment after its flags read healthy (~1.5 s seen):
    # one request at a time, every one served, until it routes one.
    async with gw.client() as client:

        async def routes_again() -> bool:
            reply = await client.post("/v1/chat/completions", json=chat(LLAMA, "again"))
            assert reply.status_code == 200, reply.text
            return await dead.routed() > 0

        await until_awaited(routes_again, "the restarted replica routes requests again")


async def _held_counts(store: aioredis.Redis, tag: str, replica_id: str) -> dict[str, int]:
    """The requests a replica's hash in the store holds per pod (its published in-flight)."""
    fields = cast("dict[str, str]", await store.hgetall(f"{tag}:inflight:{replica_id}"))  # decoded
    requests = {k: int(v.split(",")[0]) for k, v in fields.items() if k != "_" and not k.startswith("busy:")}
    return {pod: n for pod, n in requests.items() if n}


async def test_a_replica_killed_mid_burst_leaves_no_reservations(
    gw: LocalGateway, replicas: list[Replica], store: aioredis.Redis
) -> None:
    live, dead = replicas
    await until_each(replicas, _connected, "connected, one peer")
    await until_awaited(lambda: _both_subscribed(store, gw), "both replicas subscribed to the picks")
    dead_id, live_id = (await dead.shared())["replica"], (await live.shared())["replica"]
    tag = _tag(gw)
    burst, after = 12, 12
    async with gw.client() as client:
        async with held_streams(client, LLAMA, burst, max_tokens=2000) as held:

            async def sees_burst(replica: Replica) -> bool:
                return await replica.inflight() == burst

            await until_each(replicas, sees_burst, f"sees all {burst} of the burst")
            own = await dead.local()  # the streams the doomed replica holds
            assert 1 <= own < burst, own
            gw.procs[dead.name].popen.send_signal(signal.SIGKILL)  # no clean exit: only the TTL
            killed = time.monotonic()
            gw.procs[dead.name].popen.wait(5)
            # Its hash in the store expires within the TTL of its last publish (-2: already gone).
            assert await store.pttl(f"{tag}:inflight:{dead_id}") <= TTL_MS
            # Mid-burst: more requests arrive while Envoy still lists the dead replica.
            late = await asyncio.gather(
                *(client.post("/v1/chat/completions", json=chat(LLAMA, f"late {i}")) for i in range(after))
            )

            # Its reservations (hash counts and pushed picks) leave the survivor's picture
            # once its hash expires.
            async def own_only() -> bool:
                return _own_picture(await live.pool())

            await until_awaited(own_only, "the dead replica's share leaves the survivor's picture")
            gone_s = time.monotonic() - killed
            assert await live.peers() == 0
            assert await store.exists(f"{tag}:inflight:{dead_id}") == 0
            assert await store.smembers(f"{tag}:replicas") == {live_id}
            outcomes = await asyncio.gather(*(h.finish() for h in held))
    late_codes = [r.status_code for r in late]
    record_figures(
        "replica_killed_mid_burst",
        {
            "shape": _shape(gw),
            "held_by_dead": own,
            "burst": burst,
            "outcomes": outcomes,
            "late": late_codes,
            "dead_share_gone_s": gone_s,
        },
    )
    # The streams the dead replica held are the only ones lost; the survivor's end with [DONE].
    assert (
        outcomes.count("done") == burst - own and outcomes.count("done") + outcomes.count("cut") == burst
    ), outcomes
    assert all(code == 200 for code in late_codes), late_codes
    # The burst over: in-flight zero on the survivor and in what it publishes.
    await settled([live])

    async def published_zero() -> bool:
        return await _held_counts(store, tag, live_id) == {}

    await until_awaited(published_zero, "the survivor publishes zero in flight")
    await until_awaited(lambda: dead_out_of_rotation(gw, POOL, 1), "Envoy ejects the dead replica")
