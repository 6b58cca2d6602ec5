"""The `predicted` profile through the real Envoy on a mixed fleet: one simulated H100, one A10G.

The EPP learns each pod's prefill pace from its /metrics histograms (requests sent straight to
the pods first, so both paces are known), then sends traffic to the H100 while both are idle
and spills to the A10G once the H100's queue would take longer than the A10G's prefill. Pods
allow 2 running sequences, so `busy` builds a real queue on the H100 that the EPP only sees
through its scrapes. The saturation filter is relaxed (queue 100) so the scorer alone decides.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterator

import httpx
import pytest

from devstack.launch import LocalGateway, dev_trust
from tests.integration.busy_pods import busy, pool_state
from tests.integration.conftest import chat, local_gateway

MODEL = "llama-3.1-8b-instruct"
POOL = "llama-3-1-8b-instruct"
FLEET = {
    "time_scale": 1.0,
    "profiles": {
        "h100-two-seqs": {"base": "h100-llama3.1-8b", "max_num_seqs": 2},
        "a10g-two-seqs": {"base": "a10g-llama3.1-8b", "max_num_seqs": 2},
    },
    "pods": [
        {"name": "h100", "model": MODEL, "profile": "h100-two-seqs"},
        {"name": "a10g", "model": MODEL, "profile": "a10g-two-seqs"},
    ],
}
_words = itertools.count()


def prompt() -> str:
    """~1,600 characters (~400 tokens) that share no prefix block with any other prompt."""
    n = next(_words)
    return " ".join(f"w{n}x{i}" for i in range(230))


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalGateway]:
    yield from local_gateway(
        tmp_path_factory,
        "predicted",
        fleet=FLEET,
        config_extra={"defaultProfile": "predicted", "thresholds": {"queue": 100}},
        config_patch=dev_trust,
    )


async def test_traffic_goes_to_the_fast_pod_while_idle_and_spills_once_its_queue_is_long(
    gateway: LocalGateway,
) -> None:
    # Learn both paces: requests straight to each pod until the EPP has an estimate for both
    # (it reads the prefill histograms about once a second, and needs a read on each side of
    # some finished requests).
    async def learned() -> bool:
        state = await pool_state(gateway, POOL)
        return len(state) == 2 and all(p["prefill_tps"] is not None for p in state.values())

    async with httpx.AsyncClient(timeout=60) as client:
        for _ in range(100):
            if await learned():
                break
            for pod in gateway.pods:
                body = {"model": MODEL, "prompt": prompt(), "max_tokens": 2}
                assert (await client.post(f"http://{pod['address']}/v1/completions", json=body)).is_success
            await asyncio.sleep(0.2)
    assert await learned(), "prefill paces not learned"
    paces = {p["address"]: p["prefill_tps"] for p in (await pool_state(gateway, POOL)).values()}
    by_name = {p["name"]: p["address"] for p in gateway.pods}
    assert paces[by_name["h100"]] > 4 * paces[by_name["a10g"]], paces

    async def served(n: int) -> list[str]:
        out = []
        async with gateway.client() as client:
            for _ in range(n):
                r = await client.post("/v1/chat/completions", json=chat(MODEL, prompt(), max_tokens=2))
                assert r.status_code == 200, r.text
                out.append(r.headers["x-modelsim-pod"])
        return out

    idle = await served(20)
    assert idle.count("h100") >= 18, idle  # both idle: the 10x faster prefill wins

    # 14 waiting on the H100 (~14 x 400 tokens ahead at ~26k tokens/s: ~0.23 s) against the
    # idle A10G's ~0.15 s for this prompt.
    async with busy(gateway, "h100", 16):
        spilled = await served(8)
    assert spilled.count("a10g") >= 7, spilled
