"""Scrape faults through the whole gateway: a pod whose /metrics is garbage or too slow is
excluded from routing within a few scrapes and comes back once its metrics recover."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import httpx
import pytest

from devstack.launch import LocalGateway, start_local_gateway
from tests.integration.conftest import chat
from tests.reliability.conftest import record_figures

MODEL, POOL = "llama-3.1-8b-instruct", "llama-3-1-8b-instruct"
FLEET = {
    "time_scale": 20.0,
    "pods": [{"name": "llama", "model": MODEL, "profile": "h100-llama3.1-8b", "replicas": 2}],
}


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalGateway]:
    gw = start_local_gateway(
        tmp_path_factory.mktemp("scrapefaults"),
        fleet=FLEET,
        config_extra={"scrape": {"intervalMs": 50, "timeoutMs": 200}},
    )
    try:
        yield gw
    finally:
        gw.stop()


async def healthy(gw: LocalGateway) -> dict[str, bool]:
    async with httpx.AsyncClient() as c:
        pool = (await c.get(f"http://127.0.0.1:{gw.epp_metrics_ports[POOL]}/debug/pool")).json()
    return {e["address"]: e["healthy"] for e in pool["endpoints"]}


async def wait_health(gw: LocalGateway, address: str, want: bool, within: float = 20.0) -> float:
    started = time.monotonic()
    while (await healthy(gw))[address] is not want:
        assert time.monotonic() - started < within, f"{address} healthy={not want} after {within}s"
        await asyncio.sleep(0.02)
    return time.monotonic() - started


async def set_fault(address: str, **knobs: object) -> None:
    async with httpx.AsyncClient() as c:
        r = await c.post(f"http://{address}/sim/fault", json=knobs)
        assert r.status_code == 200, r.text


async def served_by(gw: LocalGateway, n: int) -> set[str]:
    pods = set()
    async with gw.client() as client:
        for i in range(n):
            r = await client.post("/v1/chat/completions", json=chat(MODEL, f"q{i}", max_tokens=2))
            assert r.status_code == 200
            pods.add(r.headers["x-modelsim-pod"])
    return pods


@pytest.mark.parametrize(
    "fault", [{"metrics_garbage": True}, {"metrics_delay_s": 1.0}], ids=["garbage", "timeout"]
)
async def test_bad_metrics_exclude_the_pod_until_they_recover(gateway: LocalGateway, fault: dict) -> None:
    bad = next(p for p in gateway.pods if p["name"] == "llama-0")["address"]
    await wait_health(gateway, bad, True)
    await set_fault(bad, **fault)
    excluded_s = await wait_health(gateway, bad, False)
    assert await served_by(gateway, 12) == {"llama-1"}
    await set_fault(bad, metrics_garbage=False, metrics_delay_s=0)
    recovered_s = await wait_health(gateway, bad, True)
    assert await served_by(gateway, 24) == {"llama-0", "llama-1"}
    # How fast is a figure for docs/reliability.md (a few 50 ms scrapes on an idle machine), not
    # an assertion: a loaded CI machine only stretches it; the deadline above bounds it.
    record_figures(
        f"scrape_fault_{next(iter(fault))}",
        {"excluded_s": round(excluded_s, 3), "recovered_s": round(recovered_s, 3)},
    )
