"""The KV-memory model of whole conversations (epp/datalayer/session_memory.py) and what the
prediction does with it: a long session's history is seen at any length, and a pick that would
evict live conversations is priced (issue #51)."""

from __future__ import annotations

import dataclasses
import random

from epp.datalayer.session_memory import DEFAULT_HORIZON_S, SessionMemory, checkpoints
from epp.scheduling.weighted import WeightedScheduler
from gateway.profiles import BUILTIN_PROFILES

from .factories import req, snap, state

STRIDE = 4096


def text(n: int, seed: int) -> str:
    rng = random.Random(seed)
    return "".join(rng.choice("abcdefghij ") for _ in range(n))


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def routed(memory: SessionMemory, address: str, prompt: str, output: float = 100.0) -> tuple[int, ...]:
    cps, per = checkpoints("m", None, prompt, memory.stride)
    memory.routed(address, cps, per, len(prompt) / 4, output)
    return cps


def test_a_pod_holds_a_long_history_past_the_prefix_index_horizon() -> None:
    """The prefix index hashes 16 KB; the memory sees a 100 KB history to within a stride."""
    memory = SessionMemory(STRIDE)
    history = text(100_000, 1)
    routed(memory, "a", history)
    routed(memory, "b", history[:20_000])
    turn = history + text(3_000, 2)
    cps, _ = checkpoints("m", None, turn, STRIDE)
    held = memory.depths(cps, ["a", "b", "c"])
    assert held == [100_000 // STRIDE, 20_000 // STRIDE, 0]
    # another adapter or model shares nothing
    other, _ = checkpoints("m", "lora", turn, STRIDE)
    assert memory.depths(other, ["a", "b"]) == [0, 0]


def test_the_next_turn_continues_its_entry_and_capacity_evicts_least_recently_used() -> None:
    memory = SessionMemory(STRIDE)
    memory.set_capacity("a", 60_000.0)
    s1, s2 = text(80_000, 3), text(80_000, 4)  # 20,000 tokens each
    routed(memory, "a", s1)
    routed(memory, "a", s2)
    routed(memory, "a", s1 + text(8_000, 5))  # s1's next turn supersedes its entry
    assert memory.entries("a") == 2
    assert memory.used_tokens("a") == 20_000 + 100 + 22_000 + 100
    routed(memory, "a", text(80_000, 6))  # a third session: s2, the least recently used, goes
    assert memory.entries("a") == 2
    cps2, _ = checkpoints("m", None, s2, STRIDE)
    assert memory.depths(cps2, ["a"]) == [0]


def test_eviction_counts_live_conversations_only_and_never_the_requests_own() -> None:
    clock = Clock()
    memory = SessionMemory(STRIDE, clock=clock)
    memory.set_capacity("a", 50_000.0)
    old, live = text(80_000, 7), text(80_000, 8)
    routed(memory, "a", old)  # 20,100 tokens
    clock.t = DEFAULT_HORIZON_S + 10.0
    routed(memory, "a", live)  # 20,100 tokens; `old` is now idle past the horizon
    # 9,800 free: 30,000 needed evicts all of `old` (dead: free) and 100 more of `live`
    assert memory.eviction_tokens("a", 30_000.0, None) == 100.0
    assert memory.eviction_tokens("a", 9_000.0, None) == 0.0
    cps, _ = checkpoints("m", None, live + "x" * STRIDE, STRIDE)
    own = memory.entry_key("a", cps, memory.depths(cps, ["a"])[0])
    assert own is not None
    assert memory.eviction_tokens("a", 30_000.0, own) == 0.0  # its own history is no loss


def test_retain_forgets_pods_that_left() -> None:
    memory = SessionMemory(STRIDE)
    prompt = text(40_000, 9)
    cps = routed(memory, "a", prompt)
    memory.retain(["b"])
    assert memory.depths(cps, ["a"]) == [0]
    assert memory.entries("a") == 0


def pod(address: str, waiting: int = 0, kv: float = 0.0) -> object:
    """A pod at 30k prefill tokens/s whose queued prompts are 15k uncached tokens each."""
    return dataclasses.replace(
        state(address, waiting=waiting, kv=kv, block_size=16, num_gpu_blocks=16_000),
        prefill_tps=30_000.0,
        mean_prompt_tokens=15_000.0,
        uncached_fraction=1.0,
    )


def test_a_session_stays_where_its_long_history_is_despite_a_short_queue() -> None:
    """The warm pod has 2 s of prefill queued; the idle pod would prefill the whole 52k-token
    prompt (1.7 s). The prefix index sees only the first 16 KB held on the warm pod, predicts
    3.5 s there and moves the session (what the earlier default did); the memory sees the
    history held (2.1 s there, and the prefix term keeps it). Fails without the memory."""
    sched = WeightedScheduler(BUILTIN_PROFILES, rng=random.Random(0))
    history = text(200_000, 10)
    first = req(history)
    pods = snap(pod("warm"), pod("cold"))
    sched.pick(first, pods)
    sched.on_routed(first, "warm")
    turn = req(history + text(8_000, 11))
    busy = snap(pod("warm", waiting=4), pod("cold"))  # under the saturation queue (5)
    decision = sched.pick(turn, busy)
    assert decision.ranked[0] == "warm"


def test_a_new_session_goes_where_it_evicts_no_live_conversation() -> None:
    """Pod `full` holds five live 50k-token sessions (its 256k-token cache); `free` holds none
    but has 0.5 s queued. Greedy TTFT picks `full` (1.7 s vs 2.2 s) and would evict ~45k tokens
    of live history (1.5 s of others' prefill); priced, the new session goes to `free`.
    Fails with `evictionWeight: 0`."""
    sched = WeightedScheduler(BUILTIN_PROFILES, rng=random.Random(0))
    idle = snap(pod("full"), pod("free"))
    for i in range(5):
        session = req(text(200_000, 20 + i))
        sched.pick(session, idle)
        sched.on_routed(session, "full")
    fresh = req(text(200_000, 30))
    decision = sched.pick(fresh, snap(pod("full"), pod("free", waiting=1)))
    assert decision.ranked[0] == "free"
    unpriced = {
        "default": BUILTIN_PROFILES["default"].model_copy(
            update={
                "thresholds": BUILTIN_PROFILES["default"].thresholds.model_copy(
                    update={"eviction_weight": 0.0}
                )
            }
        )
    }
    sched.profiles = unpriced
    assert sched.pick(req(text(200_000, 30)), snap(pod("full"), pod("free", waiting=1))).ranked[0] == "full"


def test_a_new_conversation_seeds_an_idle_pod_with_a_popular_system_prompt() -> None:
    """Twenty conversations share a 40 KB system prompt, all on `warm`, which has a short
    queue; `idle` lacks the prompt. Greedy, the new conversation joins `warm` (0.1 s against a
    0.37 s cold prefill) and `idle` stays idle for good; charged its share of the seeding
    (1 pod / 20 conversations), it goes to `idle`. Fails without the seeding credit."""
    sched = WeightedScheduler(BUILTIN_PROFILES, rng=random.Random(0))
    system = text(40_000, 40)
    idle = snap(pod("warm"), pod("idle"))
    for i in range(20):
        conversation = req(system + text(4_000, 41 + i))
        sched.pick(conversation, idle)
        sched.on_routed(conversation, "warm")
    new = req(system + text(4_000, 99))
    short_queue = dataclasses.replace(pod("warm"), mean_prompt_tokens=2_000.0)  # type: ignore[type-var]
    short_queue = dataclasses.replace(
        short_queue, metrics=dataclasses.replace(short_queue.metrics, waiting=1)
    )  # type: ignore[arg-type, union-attr]
    decision = sched.pick(new, snap(short_queue, pod("idle")))  # type: ignore[arg-type]
    assert decision.ranked[0] == "idle"


def test_a_conversation_that_moved_is_no_shared_prefix() -> None:
    """Copies of one conversation on two pods (it moved) earn no seeding credit for a third:
    only conversations that diverge after a prefix, on one pod, make it shared."""
    memory = SessionMemory(STRIDE)
    history = text(60_000, 70)
    routed(memory, "a", history)
    routed(memory, "b", history + text(4_000, 71))  # its next turn went to b: two copies
    cps, _ = checkpoints("m", None, history + text(8_000, 72), STRIDE)
    assert memory.shared_prefix(cps) == (0, 0, 0)
    routed(memory, "a", history[:20_000] + text(40_000, 73))  # another conversation shares 20 KB on a
    depth, n, pods = memory.shared_prefix(cps)
    assert depth == 20_000 // STRIDE and (n, pods) == (3, 2)


def test_the_decision_header_shows_each_pods_predicted_milliseconds() -> None:
    """`x-gateway-decision` names the prediction behind `predicted-ttft` (issue #55's smaller
    item): the warm pod's predicted milliseconds, lower than the cold pod's."""
    from epp.requestcontrol.processor import explain

    sched = WeightedScheduler(BUILTIN_PROFILES, rng=random.Random(0))
    history = text(200_000, 90)
    first = req(history)
    sched.pick(first, snap(pod("warm"), pod("cold")))
    sched.on_routed(first, "warm")
    decision = sched.pick(req(history + text(4_000, 91)), snap(pod("warm"), pod("cold")))
    assert decision.predicted is not None
    assert decision.predicted["warm"] < decision.predicted["cold"]
    header = explain(decision)
    warm_ms = round(decision.predicted["warm"] * 1000)
    assert f"predicted-ms={warm_ms}" in header and header.count("predicted-ms=") == 2


def test_a_saturated_pod_holding_the_conversation_stays_a_candidate() -> None:
    """`warm` holds the 50k-token history and reads 85 % KV use (over the 0.8 saturation
    threshold); `cold` is idle. The saturation filter alone drops `warm` and the turn
    recomputes its whole history on `cold` (1.7 s, and the misses then snowball: the
    agentic-coding meltdown of docs/benchmarks/agentic.md); kept, the prediction sees ~0.1 s
    on `warm`. The pool is not flagged saturated (`cold` has headroom), and a profile without
    a wait-pricing scorer still filters. Fails without `FilterContext.holders`."""
    sched = WeightedScheduler(BUILTIN_PROFILES, rng=random.Random(0))
    history = text(200_000, 40)
    first = req(history)
    sched.pick(first, snap(pod("warm"), pod("cold")))
    sched.on_routed(first, "warm")
    hot = pod("warm", kv=0.85)
    turn = req(history + text(8_000, 41))
    decision = sched.pick(turn, snap(hot, pod("cold")))
    assert decision.ranked[0] == "warm"
    assert not decision.saturated
    # a short prompt (no history held) still leaves the saturated pod out
    assert sched.pick(req(text(2_000, 42)), snap(hot, pod("cold"))).ranked == ("cold",)
    gie = WeightedScheduler(BUILTIN_PROFILES, default_profile="gie", rng=random.Random(0))
    gie.pick(first, snap(pod("warm"), pod("cold")))
    gie.on_routed(first, "warm")
    assert gie.pick(req(history + text(8_000, 41)), snap(hot, pod("cold"))).ranked == ("cold",)
