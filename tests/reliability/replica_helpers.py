"""Helpers for tests of a pool's EPP replicas behind the real Envoy (epp/datalayer/shared_state.py):
each replica read through its admin port, answers held open mid-stream, Envoy's view of a
dead replica, and a bounded load loop that records every outcome."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx

from devstack.launch import LocalGateway
from gateway.envoy.topology import SINGLE_HOP_CLUSTER
from tests.integration.conftest import chat
from tests.reliability.gateway_helpers import metric_value
from tests.waiting import until_awaited


class Replica:
    """One EPP replica through its admin port."""

    def __init__(self, name: str, port: int, client: httpx.AsyncClient, model: str, pool: str) -> None:
        self.name, self._base, self._client = name, f"http://127.0.0.1:{port}", client
        self.model, self.pool_name = model, pool

    async def pool(self) -> dict[str, Any]:
        """/debug/pool: the endpoints as it schedules on them, its own in-flight, its shared state."""
        return (await self._client.get(f"{self._base}/debug/pool")).json()

    async def inflight(self) -> int:
        """Total in-flight as this replica schedules on it: its own plus its peers'."""
        return sum(e["inflight_requests"] for e in (await self.pool())["endpoints"])

    async def local(self) -> int:
        return sum(c[0] for c in (await self.pool())["local_inflight"].values())

    async def shared(self) -> dict[str, Any]:
        return (await self.pool())["shared_state"]

    async def metric(self, metric: str, **labels: str) -> float:
        return metric_value((await self._client.get(f"{self._base}/metrics")).text, metric, **labels)

    async def routed(self) -> float:
        return await self.metric("inference_objective_request_total", model_name=self.model)

    async def up(self) -> float:
        return await self.metric("gateway_shared_state_up", inference_pool=self.pool_name)

    async def peers(self) -> float:
        return await self.metric("gateway_shared_state_peers", inference_pool=self.pool_name)


def replicas_of(gw: LocalGateway, pool: str, model: str, client: httpx.AsyncClient) -> list[Replica]:
    ports = gw.epp_replica_metrics_ports[pool]
    names = gw.epp_replica_names(pool)
    return [Replica(name, port, client, model, pool) for name, port in zip(names, ports, strict=True)]


async def until_each(replicas: list[Replica], check: Callable[[Replica], Awaitable[bool]], what: str) -> None:
    """Wait until `check` holds for every replica (AssertionError naming the replica and `what`)."""
    for replica in replicas:
        await until_awaited(lambda r=replica: check(r), f"{replica.name}: {what}")  # type: ignore[misc]


async def settled(replicas: list[Replica]) -> None:
    """Every replica's picture (its own and its peers' in-flight) back to zero."""

    async def zero(replica: Replica) -> bool:
        return await replica.inflight() == 0

    await until_each(replicas, zero, "in-flight back to 0")


class HeldStream:
    """A streamed answer opened past its first token; `finish` reads it to its end."""

    def __init__(self, response: httpx.Response, lines: AsyncIterator[str]) -> None:
        self.response, self.lines = response, lines

    async def finish(self) -> str:
        """ "done" (it ended with [DONE]), "cut" (the connection was reset mid-answer) or
        "incomplete" (it ended without [DONE])."""
        try:
            async for line in self.lines:
                if line.strip() == "data: [DONE]":
                    return "done"
        except httpx.HTTPError:  # RemoteProtocolError, ReadError: the answer was reset
            return "cut"
        return "incomplete"


@contextlib.asynccontextmanager
async def held_streams(
    client: httpx.AsyncClient, model: str, n: int, max_tokens: int = 3000
) -> AsyncIterator[list[HeldStream]]:
    """`n` streamed answers, each open past its first token until the block ends (then aborted
    unless read to their end)."""
    held = []  # kept referenced: a line iterator garbage-collected mid-stream closes the stream
    async with contextlib.AsyncExitStack() as stack:
        for i in range(n):
            body = chat(model, f"hold {i}", stream=True, max_tokens=max_tokens)
            r = await stack.enter_async_context(client.stream("POST", "/v1/chat/completions", json=body))
            assert r.status_code == 200
            lines = r.aiter_lines()
            held.append(HeldStream(r, lines))
            while not (await anext(lines)).startswith("data: "):
                pass
        yield held


def epp_cluster(gw: LocalGateway, pool: str) -> str:
    """The Envoy cluster of the pool's EPP replicas."""
    return SINGLE_HOP_CLUSTER if gw.single_hop else f"epp-{pool}"


async def _health_flags(gw: LocalGateway, pool: str, replica: int) -> str:
    """Envoy's health flags for the pool's `replica`-th EPP replica ("healthy", "/failed_active_hc", ...)."""
    port = gw.epp_replica_ports[pool][replica]
    async with httpx.AsyncClient(timeout=2) as admin:
        text = (await admin.get(f"http://127.0.0.1:{gw.admin_port}/clusters")).text
    prefix = f"{epp_cluster(gw, pool)}::127.0.0.1:{port}::health_flags::"
    return next((line.removeprefix(prefix) for line in text.splitlines() if line.startswith(prefix)), "")


async def dead_out_of_rotation(gw: LocalGateway, pool: str, replica: int) -> bool:
    """Envoy's health check (or outlier detection) marks the pool's `replica`-th EPP replica failed."""
    return "failed" in await _health_flags(gw, pool, replica)


async def in_rotation(gw: LocalGateway, pool: str, replica: int) -> bool:
    """Envoy sends new streams to the pool's `replica`-th EPP replica again."""
    return await _health_flags(gw, pool, replica) == "healthy"


async def envoy_counter(gw: LocalGateway, name: str) -> int:
    """One of Envoy's counters (admin /stats), 0 when it has none by that name."""
    async with httpx.AsyncClient(timeout=2) as admin:
        text = (
            await admin.get(f"http://127.0.0.1:{gw.admin_port}/stats", params={"filter": f"^{name}$"})
        ).text
    return sum(int(line.rpartition(": ")[2]) for line in text.splitlines() if line.startswith(f"{name}: "))


class Load:
    """Short chat completions from `workers` concurrent clients until stopped, at most
    `max_requests` and `max_s` seconds: every outcome counted (a status code, or the name of
    the exception a request ended with)."""

    def __init__(
        self,
        client: httpx.AsyncClient,
        model: str,
        *,
        workers: int = 3,
        max_requests: int = 400,
        max_s: float = 90.0,
    ) -> None:
        self._client, self._model, self._workers = client, model, workers
        self._max_requests, self._max_s = max_requests, max_s
        self.outcomes: Counter[int | str] = Counter()
        self._stop = asyncio.Event()
        self._sent = 0

    @property
    def sent(self) -> int:
        return self._sent

    def failures(self) -> dict[int | str, int]:
        return {k: n for k, n in self.outcomes.items() if k != 200}

    async def _worker(self, deadline: float) -> None:
        while not self._stop.is_set() and self._sent < self._max_requests and time.monotonic() < deadline:
            self._sent += 1
            body = chat(self._model, f"load {self._sent}")
            try:
                outcome: int | str = (await self._client.post("/v1/chat/completions", json=body)).status_code
            except httpx.HTTPError as exc:
                outcome = type(exc).__name__
            self.outcomes[outcome] += 1

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[Load]:
        """The load runs for the block's duration (or until its bounds); all its requests have
        ended when the block exits."""
        deadline = time.monotonic() + self._max_s
        tasks = [asyncio.create_task(self._worker(deadline)) for _ in range(self._workers)]
        try:
            yield self
        finally:
            self._stop.set()
            await asyncio.gather(*tasks)
