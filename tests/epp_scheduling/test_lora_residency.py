"""LoRA residency: the EPP's model of each pod's GPU adapter slots, and the scorer that uses it."""

from __future__ import annotations

import asyncio
import random

import httpx
import pytest

from epp.pool import Endpoint, Pool
from epp.scheduling import WeightedScheduler, profile
from epp.scheduling.lora import AdapterResidency
from epp.scrape import Scraper
from modelsim.fleet import FleetSpec, run_fleet

from .factories import req, snap, state


def test_the_most_recent_max_lora_adapters_are_resident() -> None:
    r = AdapterResidency()
    for adapter in ("a", "b", "c", "b"):
        r.on_routed("pod", adapter)
    assert r.adapters("pod", 2) == ["b", "c"]  # vLLM would have evicted "a" for "c"
    assert r.resident("pod", "b", 2) and r.resident("pod", "c", 2) and not r.resident("pod", "a", 2)
    assert r.resident("pod", "a", 3)
    assert not r.resident("pod", "b", 0)  # capacity unknown: no claim
    assert not r.resident("other", "b", 4)
    r.retain(["other"])
    assert not r.resident("pod", "b", 4)


def test_memory_per_pod_is_bounded() -> None:
    r = AdapterResidency(max_tracked=3)
    for i in range(100):
        r.on_routed("pod", f"a{i}")
    assert r.adapters("pod", 100) == ["a99", "a98", "a97"]
    with pytest.raises(ValueError):
        AdapterResidency(max_tracked=0)


def test_an_idle_resident_adapter_wins_over_a_pod_that_must_load_it() -> None:
    """Both pods report no running adapter (the scrape cannot see idle ones) and free slots;
    the one this EPP sent `sql` to a moment ago holds it and must win."""
    sched = WeightedScheduler({"default": profile("default", {"lora-affinity": 1})}, rng=random.Random(0))
    pods = snap(
        state("warm", adapters=("sql", "chat"), max_lora=2),
        state("cold", adapters=("sql", "chat"), max_lora=2),
    )
    sched.on_routed(req(adapter="sql"), "warm")
    d = sched.pick(req(adapter="sql"), pods)
    assert d.scores["warm"]["lora-affinity"] == 1.0 and d.scores["cold"]["lora-affinity"] == 0.8
    assert d.ranked[0] == "warm"
    # Two newer adapters evicted it (max_lora 2): the pod no longer counts as holding it.
    sched.on_routed(req(adapter="chat"), "warm")
    sched.on_routed(req(adapter="other"), "warm")
    assert sched.pick(req(adapter="sql"), pods).scores["warm"]["lora-affinity"] == 0.8


async def test_the_model_matches_the_simulated_engines_slots() -> None:
    """Sequential LoRA traffic through the EPP's own picks to simulated vLLM pods with 2 GPU
    slots each: after every request the modelled GPU set of each pod equals modelsim's."""
    adapters = [f"lora-{i}" for i in range(5)]
    spec = {
        "time_scale": 50.0,
        "pods": [
            {"name": f"p{i}", "model": "m", "adapters": adapters, "max_loras": 2, "max_cpu_loras": 8}
            for i in range(3)
        ],
    }
    async with run_fleet(FleetSpec.from_dict(spec), host="127.0.0.1") as fleet:
        pods = [fleet.pod(f"p{i}") for i in range(3)]
        pool = Pool([Endpoint(p.address, frozenset({"m"}), frozenset(adapters)) for p in pods])
        scraper = Scraper(pool, interval_s=0.02, timeout_s=0.5)
        scraper.sync()
        sched = WeightedScheduler(
            {"default": profile("default", {"lora-affinity": 3, "queue": 1})}, rng=random.Random(3)
        )
        rng = random.Random(7)
        try:
            async with httpx.AsyncClient(timeout=10) as client:
                for _ in range(200):
                    if all(s.metrics is not None for s in pool.snapshot().endpoints):
                        break
                    await asyncio.sleep(0.02)
                for n in range(30):
                    request = req(adapter=rng.choice(adapters))
                    address = sched.pick(request, pool.snapshot()).ranked[0]
                    sched.on_routed(request, address)
                    body = {"model": request.adapter, "prompt": "hi", "max_tokens": 2}
                    r = await client.post(f"http://{address}/v1/completions", json=body)
                    assert r.status_code == 200, r.text
                    for pod in pods:
                        truth = (await client.get(f"http://{pod.address}/sim/state")).json()["lora_gpu"]
                        modelled = sched.residency.adapters(pod.address, 2)
                        assert sorted(modelled) == sorted(truth), (n, pod.address, modelled, truth)
        finally:
            await scraper.stop()
