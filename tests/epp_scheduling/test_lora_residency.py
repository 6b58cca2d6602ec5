"""LoRA residency: the EPP's model of each pod's GPU adapter slots, and the scorer that uses it."""

from __future__ import annotations

import asyncio
import random

import httpx
import pytest

from epp.datalayer.adapter_residency import AdapterResidency, LoraIds, event_time
from epp.datalayer.endpoint_records import Endpoint
from epp.datalayer.pool import Pool
from epp.datalayer.scrape import Scraper
from epp.scheduling.weighted import WeightedScheduler
from gateway.profiles import profile
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


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_a_scrape_touches_its_running_adapters_at_its_send_time() -> None:
    """Another gateway made the pod load `x`: the scrape shows it running, so it is resident
    and counts as used when the scrape was sent; waiting adapters are not in a slot yet."""
    clock = Clock()
    r = AdapterResidency(clock=clock)
    r.on_routed("pod", "a")  # t=100
    clock.t = 101.0
    r.on_scrape("pod", ["x"], sent_at=100.5)
    assert r.adapters("pod", 2) == ["x", "a"]
    clock.t = 102.0
    r.on_routed("pod", "b")
    assert r.adapters("pod", 2) == ["b", "x"]  # a, the oldest use, was evicted for b


def test_a_stale_scrape_does_not_re_promote_an_adapter_evicted_since() -> None:
    """The scrape was sent before `b` and `c` were routed (max_lora 2): by the time it lands,
    vLLM has evicted `a` for them; the scrape's `a` must stay behind both."""
    clock = Clock()
    r = AdapterResidency(clock=clock)
    r.on_routed("pod", "a")  # 100
    clock.t = 101.0
    r.on_routed("pod", "b")
    clock.t = 102.0
    r.on_routed("pod", "c")
    r.on_scrape("pod", ["a"], sent_at=100.5)  # a was still running at 100.5
    assert r.adapters("pod", 2) == ["c", "b"]
    assert r.adapters("pod", 3) == ["c", "b", "a"]  # its use at 100.5 is kept, in order
    r.on_scrape("pod", ["b"], sent_at=99.0)  # older than what is known of b: no change
    assert r.adapters("pod", 3) == ["c", "b", "a"]
    r.on_scrape("pod", ["a"], sent_at=103.0)  # a fresh scrape: a ran after c
    assert r.adapters("pod", 2) == ["a", "c"]


def test_kv_events_touch_by_name_at_the_engine_time() -> None:
    clock = Clock()
    r = AdapterResidency(clock=clock)
    r.on_routed("pod", "a")  # 100
    clock.t = 101.0
    r.on_routed("pod", "b")
    assert r.on_stored("pod", "x", None, at=100.5, max_lora=2) == "x"
    assert r.adapters("pod", 2) == ["b", "x"]
    assert r.on_stored("pod", None, None, at=102.0, max_lora=2) is None  # a base-model block


def test_event_time_subtracts_the_lag_and_never_runs_ahead() -> None:
    assert event_time(batch_ts=1000.0, wall_now=1000.25, mono_now=50.0) == 49.75
    assert event_time(batch_ts=1002.0, wall_now=1000.0, mono_now=50.0) == 50.0  # pod clock ahead


def test_lora_ids_are_learned_from_events_that_name_them() -> None:
    r = AdapterResidency()
    r.on_stored("pod", "sql", 3, at=1.0, max_lora=2)
    assert r.ids.names("pod") == {3: "sql"}
    r.on_routed("pod", "chat")
    assert r.on_stored("pod", None, 3, at=r.clock(), max_lora=2) == "sql"
    assert r.adapters("pod", 2) == ["sql", "chat"]
    assert r.ids.names("other") == {}  # ids are per pod (per vLLM process)


def test_an_id_only_event_narrows_to_the_one_adapter_routed_there_every_time() -> None:
    """Older vLLM sends lora_id alone: each event's id was in a slot, so intersecting the sets
    this EPP's routing holds resident at its events leaves its name."""
    clock = Clock()
    r = AdapterResidency(clock=clock)
    r.on_routed("pod", "a")
    clock.t = 101.0
    r.on_routed("pod", "b")
    assert r.on_stored("pod", None, 7, at=101.5, max_lora=2) is None  # a or b
    r.on_scrape("pod", ["x"], sent_at=101.7)  # in the model, but not a candidate: not routed
    clock.t = 102.0
    r.on_routed("pod", "c")  # routed resident now: c, b
    assert r.on_stored("pod", None, 7, at=102.5, max_lora=2) == "b"
    assert r.ids.names("pod") == {7: "b"}
    assert r.adapters("pod", 2) == ["b", "c"]  # the event touched b at 102.5


def test_a_restarted_pod_starts_with_empty_slots_and_new_ids() -> None:
    r = AdapterResidency()
    for pod in ("pod", "other"):
        r.on_routed(pod, "a")
        r.on_stored(pod, "a", 1, at=r.clock(), max_lora=2)
    r.forget("pod")
    assert r.adapters("pod", 2) == [] and r.ids.names("pod") == {}
    assert r.adapters("other", 2) == ["a"] and r.ids.names("other") == {1: "a"}


def test_a_single_event_settles_no_guess() -> None:
    ids = LoraIds()
    assert ids.narrow("pod", 1, ["a"]) is None  # one routed adapter, but one event only
    assert ids.narrow("pod", 1, ["a"]) == "a"


def test_lora_ids_recover_from_a_wrong_guess_and_stay_one_to_one() -> None:
    ids = LoraIds()
    assert ids.narrow("pod", 1, ["a", "b"]) is None
    assert ids.narrow("pod", 1, ["c", "d"]) is None  # no overlap: traffic unseen, start again
    assert ids.narrow("pod", 1, ["c"]) == "c"
    assert ids.narrow("pod", 2, ["c", "e"]) is None  # c is id 1's: e, after one more event
    assert ids.narrow("pod", 2, ["e", "c"]) == "e"
    assert ids.narrow("pod", 2, ["f"]) == "e"  # one disagreeing event: kept
    assert ids.narrow("pod", 2, ["e"]) == "e"  # agreeing again: the miss count restarts
    assert ids.narrow("pod", 2, ["f"]) == "e"
    assert ids.narrow("pod", 2, ["f"]) is None  # two in a row: dropped, candidates start over
    assert ids.names("pod") == {1: "c"}
    ids.learn("pod", 5, "c")  # read from an event: a restarted pod registered c under id 5
    assert ids.names("pod") == {5: "c"}
    assert ids.narrow("pod", 5, ["z"]) == "c"  # a name read from an event is never dropped
    assert ids.narrow("pod", 5, ["z"]) == "c"
    ids.retain({"other"})
    assert ids.names("pod") == {}


def test_out_of_order_touches_stay_bounded() -> None:
    r = AdapterResidency(max_tracked=3)
    for i in range(10):
        r.touch("pod", f"a{i}", float(10 - i))  # every touch older than the last
    assert r.adapters("pod", 10) == ["a0", "a1", "a2"]  # the three newest uses (10, 9, 8)


def test_touches_in_any_order_keep_the_newest_use_of_each_in_time_order() -> None:
    """Against a reference (sort by time, a later touch after an equal time), bound included."""
    rng = random.Random(5)
    for _ in range(200):
        r = AdapterResidency(max_tracked=4)
        ref: dict[str, tuple[float, int]] = {}
        for i in range(rng.randrange(1, 30)):
            name, at = f"a{rng.randrange(8)}", float(rng.randrange(10))
            r.touch("pod", name, at)
            if name not in ref or ref[name][0] < at:
                ref[name] = (at, i)
            if len(ref) > 4:
                del ref[min(ref, key=lambda n: ref[n])]
        assert r.adapters("pod", 10) == sorted(ref, key=lambda n: ref[n], reverse=True)


def test_a_scraped_idle_adapter_counts_as_resident_for_lora_affinity() -> None:
    """Another gateway's request made `sql` run on `warm` (seen by one scrape); it is idle
    now, so the current metrics name it nowhere, but the model still holds it."""
    sched = WeightedScheduler({"default": profile("default", {"lora-affinity": 1})}, rng=random.Random(0))
    pods = snap(
        state("warm", adapters=("sql",), max_lora=2),
        state("cold", adapters=("sql",), max_lora=2),
    )
    sched.residency.on_scrape("warm", ["sql"], sent_at=sched.residency.clock())
    d = sched.pick(req(adapter="sql"), pods)
    assert d.scores["warm"]["lora-affinity"] == 1.0 and d.scores["cold"]["lora-affinity"] == 0.8


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
