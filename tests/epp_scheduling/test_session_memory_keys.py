"""The KV memory of whole conversations keyed by session (epp/datalayer/session_memory.py,
epp/requestcontrol/agent_session.py): a keyed conversation's next turn supersedes its entry on
the pod even when the agent compacted or rewrote its prompt (issue #51)."""

from __future__ import annotations

import dataclasses
import random

from epp.datalayer.session_memory import SessionMemory, checkpoints
from epp.scheduling.weighted import WeightedScheduler
from gateway.profiles import BUILTIN_PROFILES

from .factories import req, snap, state

STRIDE = 4096


def text(n: int, seed: int) -> str:
    rng = random.Random(seed)
    return "".join(rng.choice("abcdefghij ") for _ in range(n))


def routed(memory: SessionMemory, address: str, prompt: str, session: str | None = None) -> tuple[int, ...]:
    cps, per = checkpoints("m", None, prompt, memory.stride)
    memory.routed(address, cps, per, len(prompt) / 4, 100.0, session)
    return cps


def test_a_keyed_conversation_whose_prompt_is_rewritten_keeps_one_entry() -> None:
    memory = SessionMemory(STRIDE)
    system = text(8_000, 1)
    routed(memory, "a", system + text(40_000, 2), "s1")
    compacted = system + text(10_000, 3)  # the agent summarised its history: a new prompt past the system
    routed(memory, "a", compacted, "s1")
    assert memory.entries("a") == 1
    assert memory.used_tokens("a") == len(compacted) / 4 + 100.0  # the old history's tokens are gone
    # without the key the rewritten prompt is another conversation: two entries
    unkeyed = SessionMemory(STRIDE)
    routed(unkeyed, "a", system + text(40_000, 2))
    routed(unkeyed, "a", compacted)
    assert unkeyed.entries("a") == 2


def test_keyed_conversations_sharing_a_prompt_hold_an_entry_each() -> None:
    memory = SessionMemory(STRIDE)
    shared = text(40_000, 4)
    routed(memory, "a", shared, "s1")
    routed(memory, "a", shared, "s2")
    assert memory.entries("a") == 2
    # the second counts only what the first did not already hold
    assert memory.used_tokens("a") == len(shared) / 4 + 100.0 + (len(shared) - 36_864) / 4 + 100.0


def test_a_keyed_turn_continues_an_unkeyed_entry_it_extends() -> None:
    """A peer's routing (learned without the key) or an earlier unkeyed turn: the keyed turn
    supersedes it as an unkeyed one would."""
    memory = SessionMemory(STRIDE)
    history = text(40_000, 5)
    routed(memory, "a", history)
    routed(memory, "a", history + text(8_000, 6), "s1")
    assert memory.entries("a") == 1


def test_the_keyed_entry_is_the_requests_own_for_eviction() -> None:
    memory = SessionMemory(STRIDE)
    memory.set_capacity("a", 12_000.0)
    cps = routed(memory, "a", text(40_000, 7), "s1")  # 10,000 + 100 tokens
    rewritten, _ = checkpoints("m", None, text(40_000, 8), STRIDE)
    depth = memory.depths(rewritten, ["a"])[0]
    own = memory.entry_key("a", rewritten, depth, "s1")
    assert own is not None and memory.entry_key("a", rewritten, depth) is None
    assert memory.eviction_tokens("a", 10_000.0, own) == 0.0  # its own history is not a loss
    assert memory.eviction_tokens("a", 10_000.0, None) > 0.0
    assert cps


def test_the_scheduler_keys_the_memory_by_the_requests_session() -> None:
    sched = WeightedScheduler(BUILTIN_PROFILES, rng=random.Random(0))
    pods = snap(state("warm"), state("cold"))
    system = text(8_000, 9)
    for seed in (10, 11, 12):  # three turns, each rewritten (compacted) by the agent
        turn = dataclasses.replace(req(system + text(30_000, seed)), session_key="agent-session")
        sched.pick(turn, pods)
        sched.on_routed(turn, "warm")
    assert sched.memory.entries("warm") == 1
