"""Load that only the EPP's scrape can see: long requests sent straight to a pod, not through Envoy.

With pods that allow 2 running sequences (`max_num_seqs: 2`), `busy(gw, pod, n)` builds a real
queue of n - 2 waiting requests on that pod for as long as the block runs.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

import httpx

from devstack.launch import LocalGateway, pool_name_for


def pod_address(gw: LocalGateway, name: str) -> str:
    return next(p["address"] for p in gw.pods if p["name"] == name)


async def debug_pool(gw: LocalGateway, pool: str) -> dict:
    """The EPP's whole `/debug/pool` document."""
    async with httpx.AsyncClient() as c:
        r = await c.get(f"http://127.0.0.1:{gw.epp_metrics_ports[pool]}/debug/pool")
    return r.json()


async def pool_state(gw: LocalGateway, pool: str) -> dict[str, dict]:
    """The EPP's view of each pod (`/debug/pool`), by address."""
    return {e["address"]: e for e in (await debug_pool(gw, pool))["endpoints"]}


async def wait_for(predicate: Callable[[], Awaitable[bool]], timeout_s: float = 20.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not await predicate():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.05)


@contextlib.asynccontextmanager
async def busy(gw: LocalGateway, pod: str, n: int) -> AsyncIterator[None]:
    """Keep `n` long requests running on one pod, sent to it directly, until the block ends."""
    address = pod_address(gw, pod)
    model = next(p["model"] for p in gw.pods if p["name"] == pod)

    async def long_request(client: httpx.AsyncClient) -> None:
        with contextlib.suppress(httpx.HTTPError):
            await client.post(
                f"http://{address}/v1/completions",
                json={"model": model, "prompt": "busy " * 50, "max_tokens": 3000},
            )

    async with httpx.AsyncClient(timeout=60) as client:
        tasks = [asyncio.create_task(long_request(client)) for _ in range(n)]

        async def queued() -> bool:
            state = (await pool_state(gw, pool_name_for(model)))[address]
            return bool(state["metrics"]) and state["metrics"]["waiting"] >= n - 2

        await wait_for(queued)
        try:
            yield
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
