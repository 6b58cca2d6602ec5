"""Paths of the pickers (epp/scheduling/picker.py) and the scheduler's bounded memory of recent
picks that the broader tests did not reach (found by `make mutation`)."""

from __future__ import annotations

import random

from epp.scheduling.learning import _RECENT_HASHES
from epp.scheduling.picker import rank_weighted_random
from epp.scheduling.weighted import WeightedScheduler

from .factories import req, snap, state


def test_weighted_random_with_all_totals_zero_draws_uniformly_and_ranks_the_rest() -> None:
    rng = random.Random(7)
    firsts = set()
    for _ in range(60):
        order = rank_weighted_random([0.0, 0.0, 0.0], rng)
        assert sorted(order) == [0, 1, 2]
        firsts.add(order[0])
    assert firsts == {0, 1, 2}


def test_weighted_random_never_draws_a_pod_whose_total_is_zero_beside_a_positive_one() -> None:
    rng = random.Random(7)
    assert all(rank_weighted_random([0.5, 0.0], rng) == [0, 1] for _ in range(60))


def test_the_memory_of_recent_picks_is_bounded_and_forgets_the_oldest() -> None:
    scheduler = WeightedScheduler(rng=random.Random(0))
    pods = snap(state("a"))
    # prompts long enough for KV-memory checkpoints: both learners remember their picks
    requests = [req(f"prompt {i} " + "x" * 4096) for i in range(_RECENT_HASHES + 1)]
    for request in requests:
        scheduler.pick(request, pods)
    for recent in (scheduler._prefix._recent, scheduler._memory._recent):
        assert len(recent) == _RECENT_HASHES
        assert requests[0].request_id not in recent and requests[-1].request_id in recent
