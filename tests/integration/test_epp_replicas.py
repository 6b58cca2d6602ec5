"""Two active-active EPP replicas of one pool behind the real Envoy, sharing in-flight counts
through a real redis-server (epp/datalayer/shared_state.py), in both shapes: two-hop (BBR, then the
pool's replicas) and single-hop (replicas that each route and pick for every pool).

Envoy balances the ext_proc streams over both replicas; each replica publishes its own
per-pod in-flight counts and reads the other's, so both see every request in flight. A
replica killed outright (no clean exit) stops counting once its hash's TTL expires, and
Envoy's health check moves new streams to the live one. Redis down: requests are still
served, on local counts. The tests run in file order (the last one kills a replica).
"""

from __future__ import annotations

import signal
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest

from devstack.launch import LocalGateway, start_local_gateway
from devstack.redis_server import RedisServer
from tests.integration.conftest import chat
from tests.reliability.replica_helpers import (
    Replica,
    dead_out_of_rotation,
    held_streams,
    replicas_of,
    settled,
)
from tests.waiting import until_awaited as until

LLAMA, POOL = "llama-3.1-8b-instruct", "llama-3-1-8b-instruct"
FLEET = {
    "time_scale": 4.0,
    "pods": [{"name": "llama", "model": LLAMA, "profile": "h100-llama3.1-8b", "replicas": 2}],
}
TTL_MS = 1000


@pytest.fixture(scope="module", params=["two-hop", "single-hop"])
def gw(
    redis: RedisServer, tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[LocalGateway]:
    shared = {
        "redis": redis.url,
        "publishIntervalMs": 20,
        "ttlMs": TTL_MS,
        "keyPrefix": f"igw:{request.param}",
    }
    gw = start_local_gateway(
        tmp_path_factory.mktemp("replicas"),
        fleet=FLEET,
        config_extra={"sharedState": shared},
        epp_replicas=2,
        single_hop=request.param == "single-hop",
    )
    try:
        yield gw
    finally:
        gw.stop()


@pytest.fixture
async def replicas(gw: LocalGateway) -> AsyncIterator[list[Replica]]:
    async with httpx.AsyncClient(timeout=5) as client:
        yield replicas_of(gw, POOL, LLAMA, client)


async def test_requests_through_envoy_land_on_both_replicas(
    gw: LocalGateway, replicas: list[Replica]
) -> None:
    before = [await r.routed() for r in replicas]
    async with gw.client() as client:
        for i in range(20):
            body = chat(LLAMA, "a shared system prompt long enough for several blocks " * 20 + f"r{i}")
            assert (await client.post("/v1/chat/completions", json=body)).status_code == 200
    delta = [await r.routed() - b for r, b in zip(replicas, before, strict=True)]
    assert sum(delta) == 20 and min(delta) >= 5, delta  # Envoy's round robin over the two
    for r in replicas:
        assert await r.metric("gateway_shared_state_peers", inference_pool=POOL) == 1

        # Each replica's prefix index learned the other's routing decisions (the shared stream).
        async def learned(r: Replica = r) -> bool:
            return (await r.pool())["shared_state"]["prefix_decisions_learned"] >= min(delta)

        await until(learned, f"{r.name} learns the other's decisions")

        # ... and reads the other's scrapes of the pods (each scrapes every 2nd interval).
        async def scrapes(r: Replica = r) -> bool:
            return (await r.pool())["shared_state"]["scrapes_learned"] > 0

        await until(scrapes, f"{r.name} reads the other's scrapes")
    await settled(replicas)


async def test_each_replica_counts_the_other_replicas_requests(
    gw: LocalGateway, replicas: list[Replica]
) -> None:
    async with gw.client() as client, held_streams(client, LLAMA, 4):
        for r in replicas:

            async def sees_all(r: Replica = r) -> bool:
                return await r.inflight() == 4

            await until(sees_all, f"{r.name} sees all 4 in flight")
        own = [await r.local() for r in replicas]
        assert sum(own) == 4 and min(own) >= 1, own  # each holds some; each sees the total
    await settled(replicas)


async def test_requests_are_served_while_redis_is_down(
    gw: LocalGateway, replicas: list[Replica], redis: RedisServer
) -> None:
    redis.stop()
    try:
        async with gw.client() as client:
            for i in range(6):
                assert (
                    await client.post("/v1/chat/completions", json=chat(LLAMA, f"d{i}"))
                ).status_code == 200
            for r in replicas:

                async def failed(r: Replica = r) -> bool:
                    return await r.metric("gateway_shared_state_errors_total", inference_pool=POOL) > 0

                await until(failed, f"{r.name} counts the Redis failure")
                assert await r.metric("gateway_shared_state_up", inference_pool=POOL) == 0
            # Still scheduling, on local counts only: each sees exactly its own stream.
            async with held_streams(client, LLAMA, 2):
                own = [await r.local() for r in replicas]
                assert [await r.inflight() for r in replicas] == own and sum(own) == 2
    finally:
        redis.restart()
    for r in replicas:

        async def back(r: Replica = r) -> bool:
            return await r.metric("gateway_shared_state_up", inference_pool=POOL) == 1

        await until(back, f"{r.name} reconnects")
    await settled(replicas)


async def test_a_killed_replica_stops_counting_and_the_other_serves(
    gw: LocalGateway, replicas: list[Replica]
) -> None:
    live, dead = replicas
    async with gw.client() as client:
        async with held_streams(client, LLAMA, 4):
            await until(lambda: _equals(dead.inflight, 4), "the doomed replica sees all 4")
            own = await dead.local()
            assert own >= 1
            gw.procs[dead.name].popen.send_signal(signal.SIGKILL)  # no clean exit: only the TTL
            gw.procs[dead.name].popen.wait(5)
            # The dead replica's share leaves the live one's view once its hash expires.
            await until(lambda: _equals(live.inflight, 4 - own), "the dead replica's share expires")
            assert await live.local() == 4 - own
            assert await live.metric("gateway_shared_state_peers", inference_pool=POOL) == 0
        # Envoy's health check takes the dead replica out of rotation; then every request lands.
        await until(lambda: dead_out_of_rotation(gw, POOL, 1), "Envoy ejects the dead replica")
        before = await live.routed()
        for i in range(8):
            assert (await client.post("/v1/chat/completions", json=chat(LLAMA, f"k{i}"))).status_code == 200
        assert await live.routed() - before == 8
    await settled([live])


async def _equals(read: Any, value: int) -> bool:
    return bool(await read() == value)
