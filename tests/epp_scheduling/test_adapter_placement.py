"""Adapter placement (issue #28): each LoRA adapter stays on the few pods that run it, priced by
the GPU slots its requests hold (epp/datalayer/adapter_residency.py `AdapterResidency.slots`, `slot_cost`;
the `predicted-ttft` scorer adds that cost; the `adapter_slots` filter)."""

from __future__ import annotations

import dataclasses

import pytest

from epp.datalayer.adapter_residency import AdapterResidency, Slot
from epp.datalayer.endpoint_records import EndpointState
from epp.scheduling.adapter_slots import slot_cost, slot_runs, slot_scarcity
from epp.scheduling.filters import FilterContext, adapter_slots, unsaturated
from epp.scheduling.scorers import ScoringContext
from epp.scheduling.ttft_prediction import predicted_ttft
from epp.scheduling.weighted import WeightedScheduler
from gateway.profiles import DEFAULT, profile
from gateway.scheduling_params import DEFAULT_THRESHOLDS

from .factories import req, snap, state

PROMPT = "y" * 1600  # 400 estimated tokens


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def pod(address: str, typical: float | None = 400.0, **kw: object) -> EndpointState:
    """A pod at 10,000 prefill tokens/s, 10 ms per output token, two adapter slots."""
    kw.setdefault("max_lora", 2)
    kw.setdefault("tpot", 0.01)
    base = state(address, **kw)  # type: ignore[arg-type]
    return dataclasses.replace(base, prefill_tps=10_000.0, mean_prompt_tokens=typical)


def waiting(p: EndpointState, n: float) -> EndpointState:
    assert p.metrics is not None
    return dataclasses.replace(p, metrics=dataclasses.replace(p.metrics, waiting=n))


# The prediction alone (no prefix term: every test prompt is the same), saturation relaxed
# unless a test is about it, placement on or off.
PLACED = profile("placed", {"predicted-ttft": 1}, thresholds={"queue": 100})
GREEDY = profile("greedy", {"predicted-ttft": 1}, thresholds={"queue": 100, "adapterPlacement": False})


def scheduler(p: object = PLACED) -> WeightedScheduler:
    return WeightedScheduler({"default": p}, residency=AdapterResidency(clock=Clock()))  # type: ignore[dict-item]


def route(s: WeightedScheduler, adapter: str, address: str, n: int = 1) -> None:
    for _ in range(n):
        s.on_routed(req(PROMPT, adapter=adapter), address)


# -- what holds a slot ------------------------------------------------------------------------


def test_slots_count_this_epps_requests_in_flight_until_each_one_finishes() -> None:
    clock = Clock()
    r = AdapterResidency(clock=clock)
    r.on_routed("p", "sql", 100)
    r.on_routed("p", "sql", 100)
    assert r.in_flight("p") == {"sql": 2}
    r.on_finished("p", "sql")
    assert r.in_flight("p") == {"sql": 1}
    r.on_finished("p", "sql")
    r.on_finished("p", "sql")  # one too many: ignored, never negative
    assert r.in_flight("p") == {}
    assert r.resident("p", "sql", 2)  # still in its GPU slot (lora-affinity's model)
    r.retain([])
    assert r.in_flight("p") == {} and r.slots("p", (), 0.0) == []


def test_running_adapters_hold_slots_first_then_this_epps_by_when_they_began() -> None:
    clock = Clock()
    r = AdapterResidency(clock=clock)
    r.on_routed("p", "late", 10)
    clock.t += 1
    r.on_routed("p", "later", 10)
    r.on_routed("p", "shown", 10)
    names = [s.adapter for s in r.slots("p", {"foreign", "shown"}, scraped_at=clock.t)]
    assert names == ["foreign", "shown", "late", "later"]
    # With two slots "late" and "later" wait: neither runs there now, a third adapter neither.
    slots = r.slots("p", {"foreign", "shown"}, scraped_at=clock.t)
    assert slot_runs("shown", slots, 2) and not slot_runs("late", slots, 2)
    assert not slot_runs("new", slots, 2) and slot_runs("new", slots, 5)


def test_a_page_older_than_the_end_of_this_epps_last_request_of_an_adapter_shows_its_slot_free() -> None:
    clock = Clock()
    r = AdapterResidency(clock=clock)
    r.on_routed("p", "sql", 10)
    page_at = clock.t + 0.5
    clock.t += 1.0
    r.on_finished("p", "sql")
    assert r.slots("p", {"sql"}, scraped_at=page_at) == []
    later_page = r.slots("p", {"sql"}, scraped_at=clock.t + 0.1)  # another client runs it now
    assert [s.adapter for s in later_page] == ["sql"] and later_page[0].requests == 0


# -- what a slot costs ------------------------------------------------------------------------


def holder(name: str, requests: int = 1, routed: float | None = 100.0, out: int = 100) -> Slot:
    return Slot(name, requests, routed, out, since=0.0)


COST = {"now": 100.0, "tpot_s": 0.01, "output_tokens": 100, "load_s": 0.2, "slot_s": 0.5}


def test_an_adapter_costs_nothing_on_its_main_pod_and_a_share_of_the_slot_price_on_another() -> None:
    assert slot_cost("sql", [holder("sql", 4)], 2, **COST, peak=4) == 0.0
    assert slot_cost("sql", [holder("sql", 1)], 2, **COST, peak=4) == pytest.approx(0.5 * 0.75)
    # Held there only by another client's requests: sending more there holds nothing new.
    assert slot_cost("sql", [holder("sql", 0, routed=None)], 2, **COST, peak=4) == 0.0


def test_a_free_slot_costs_the_load_and_the_slot_price_unless_the_adapter_sits_in_it() -> None:
    assert slot_cost("sql", [holder("a")], 2, **COST) == pytest.approx(0.2 + 0.5)
    assert slot_cost("sql", [holder("a")], 2, **{**COST, "load_s": 0.0}, resident=True) == 0.0


def test_full_slots_cost_the_wait_until_the_soonest_holder_drains() -> None:
    # Holders' newest requests end at 100 + 100 x 0.01 = 101 s (1 s from now) and 100.5 + 3 s.
    slots = [holder("a", routed=100.0), holder("b", routed=100.5, out=300)]
    assert slot_cost("sql", slots, 2, **COST) == pytest.approx(0.2 + 0.5 + 1.0)
    # One adapter already waits there: this one waits for the second drain (3.5 s).
    waiting = [*slots, holder("c", routed=99.0)]
    assert slot_cost("sql", waiting, 2, **COST) == pytest.approx(0.2 + 0.5 + 3.5)
    # A holder whose projected end passed but is still in flight: half its decode at least.
    stuck = [holder("a", routed=90.0), holder("b", routed=90.0)]
    assert slot_cost("sql", stuck, 2, **COST) == pytest.approx(0.2 + 0.5 + 0.5)


# -- the placement that follows ---------------------------------------------------------------


def test_a_busy_adapter_stays_on_its_pod_until_its_queue_there_outweighs_the_slot_price() -> None:
    s = scheduler()
    route(s, "sql", "home", 6)
    home = pod("home", running=6, running_adapters=("sql",), waiting=1)
    # home: 1 queued 400-token prompt + its own = 0.08 s; idle: 0.04 s + 0.2 s load + 0.5 s
    # adapterSlotMs for a slot another adapter may need = 0.74 s.
    assert s.pick(req(PROMPT, adapter="sql"), snap(home, pod("idle"))).ranked[0] == "home"
    # Twenty queued (0.84 s) outweigh that: the adapter spills.
    assert s.pick(req(PROMPT, adapter="sql"), snap(waiting(home, 20), pod("idle"))).ranked[0] == "idle"


def test_an_adapter_that_spilled_returns_to_its_main_pod_as_its_demand_falls() -> None:
    s = scheduler()
    route(s, "sql", "main", 4)
    route(s, "sql", "spill", 1)
    main = pod("main", running=4, running_adapters=("sql",))
    spill = pod("spill", running=1, running_adapters=("sql",))
    # spill: 0.5 s x (1 - 1 / 4) on top of the same 0.04 s.
    assert predicted_ttft(
        req(PROMPT, adapter="sql"),
        [main, spill],
        ScoringContext(thresholds=PLACED.thresholds, residency=s.residency),
    ) == [1.0, pytest.approx(0.04 / 0.415)]
    assert s.pick(req(PROMPT, adapter="sql"), snap(main, spill)).ranked[0] == "main"


def test_a_new_adapter_takes_a_free_slot_rather_than_wait_behind_full_ones() -> None:
    s = scheduler()
    route(s, "a", "full", 3)
    route(s, "b", "full", 3)
    route(s, "a", "roomy", 1)
    full = pod("full", running=6, running_adapters=("a", "b"))
    roomy = pod("roomy", running=1, running_adapters=("a",), waiting=2)
    # full: a drains in 1 s (100 output tokens x 10 ms), + load, slot price and the eviction
    # of a resident adapter = 1.94 s; roomy: 0.12 s + 0.7 s.
    assert s.pick(req(PROMPT, adapter="new"), snap(full, roomy)).ranked[0] == "roomy"


def test_a_saturated_pod_that_runs_the_adapter_beats_pods_where_it_would_wait_for_a_slot() -> None:
    s = scheduler(DEFAULT)
    route(s, "sql", "home", 5)
    route(s, "a", "other", 2)
    route(s, "b", "other", 2)
    home = pod("home", waiting=6, running=5, running_adapters=("sql",))  # queue over 5: saturated
    other = pod("other", running=4, running_adapters=("a", "b"))
    filtered = FilterContext(DEFAULT_THRESHOLDS, s.residency)
    kept = unsaturated(req(PROMPT, adapter="sql"), [home, other], filtered)
    assert [p.address for p in kept] == ["other"] and not filtered.saturated
    assert [p.address for p in adapter_slots(req(PROMPT, adapter="sql"), kept, filtered)] == ["other", "home"]
    assert s.pick(req(PROMPT, adapter="sql"), snap(home, other)).ranked[0] == "home"
    # Base-model requests are not affected.
    assert s.pick(req(PROMPT), snap(home, other)).ranked == ("other",)


def test_finished_requests_free_the_slot_for_another_adapter() -> None:
    s = scheduler()
    route(s, "a", "p", 1)
    route(s, "b", "p", 1)
    ctx = ScoringContext(thresholds=PLACED.thresholds, residency=s.residency)
    full = pod("p", running=2, running_adapters=("a", "b"))  # a page from before either ended
    before = predicted_ttft(req(PROMPT, adapter="c"), [full, pod("q")], ctx)
    s.on_finished(req(PROMPT, adapter="a"), "p")
    after = predicted_ttft(req(PROMPT, adapter="c"), [full, pod("q")], ctx)
    # Before: a 1 s wait for a drain; after: a free slot, as on the idle q (plus an eviction).
    assert before[0] == pytest.approx(0.74 / 1.94)
    assert after[0] == pytest.approx(0.74 / 0.94)


def test_placement_off_keeps_the_per_request_adapter_terms() -> None:
    s = scheduler(GREEDY)
    route(s, "sql", "home", 6)
    home = pod("home", running=6, running_adapters=("sql",))
    # Without placement only the load (0.2 s) holds sql on its pod: 4 queued (0.2 s with its
    # own prefill) stay, 8 (0.36 s) go to the idle pod (0.24 s).
    assert s.pick(req(PROMPT, adapter="sql"), snap(waiting(home, 4), pod("idle"))).ranked[0] == "home"
    assert s.pick(req(PROMPT, adapter="sql"), snap(waiting(home, 8), pod("idle"))).ranked[0] == "idle"
    s.profiles = {"default": PLACED}
    assert s.pick(req(PROMPT, adapter="sql"), snap(waiting(home, 8), pod("idle"))).ranked[0] == "home"


def test_placement_is_configured_per_profile_and_bounded() -> None:
    th = profile("p", {"predicted-ttft": 1}, thresholds={"adapterSlotMs": 1500, "adapterPlacement": False})
    assert th.thresholds.adapter_slot_s == 1.5 and not th.thresholds.adapter_placement
    assert DEFAULT.thresholds.adapter_placement and DEFAULT.thresholds.adapter_slot_ms == 500.0
    for bad in ({"adapterSlotMs": -1}, {"adapterSlotMs": 4_000_000}, {"adapterPlacement": "yes"}):
        with pytest.raises(ValueError, match="adapter"):
            profile("p", {"predicted-ttft": 1}, thresholds=bad)


def test_the_slot_price_applies_as_far_as_free_slots_are_scarce_for_adapters_without_one() -> None:
    s = scheduler()
    route(s, "a", "p", 1)
    route(s, "b", "q", 1)

    def serving(address: str, adapters: tuple[str, ...], running: tuple[str, ...]) -> EndpointState:
        return pod(address, adapters=adapters, running_adapters=running)

    many = ("a", "b", "c", "d", "e", "f")
    pods = [serving("p", many, ("a",)), serving("q", many, ("b",))]
    both = [s.residency.slots(p.address, p.metrics.running_adapters, 0.0) for p in pods]  # type: ignore[union-attr]
    # Two slots free (one per pod) for four adapters without one: 1 - 2 / 4.
    assert slot_scarcity(pods, both) == pytest.approx(0.5)
    # Two adapters served, both holding a slot: nothing needs the free ones.
    few = [serving("p", ("a", "b"), ("a",)), serving("q", ("a", "b"), ("b",))]
    assert slot_scarcity(few, both) == 0.0
    # No free slot, or pods that load any adapter (unknown): the full price.
    assert slot_scarcity(pods, [[holder("a"), holder("x")], [holder("b"), holder("y")]]) == 1.0
    anything = [pod("p", running_adapters=("a",)), pod("q", running_adapters=("b",))]
    assert slot_scarcity(anything, both) == 1.0
    # So a new adapter on plentiful slots pays only its load: 0.04 + 0.2 s on either pod.
    ctx = ScoringContext(thresholds=PLACED.thresholds, residency=s.residency)
    assert predicted_ttft(req(PROMPT, adapter="c"), few, ctx) == [1.0, 1.0]
