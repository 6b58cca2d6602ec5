"""Pickers: order candidates by total score. They return the full ranking (best first) so
the servicer can send a fallback list."""

from __future__ import annotations

import random
from collections.abc import Sequence
from itertools import groupby

# Totals closer than this are a tie: floating-point sums of equal scores can differ in the
# last bits, which must not defeat the random tie-break.
TIE_EPSILON = 1e-9


_TIE_SCALE = 1.0 / TIE_EPSILON


def rank_max(totals: Sequence[float], rng: random.Random) -> list[int]:
    """Indices by descending total; ties broken uniformly at random (seedable via `rng`).

    Totals are quantised to TIE_EPSILON and sorted in C; only runs of equal keys (rare
    among loaded pods, few among idle ones) are shuffled in Python.
    """
    keys = list(map(round, map(_TIE_SCALE.__mul__, totals)))
    order = sorted(range(len(keys)), key=keys.__getitem__, reverse=True)
    if len(set(keys)) == len(keys):
        return order
    out: list[int] = []
    for _, run in groupby(order, key=keys.__getitem__):
        tied = list(run)
        if len(tied) > 1:
            rng.shuffle(tied)
        out += tied
    return out


def rank_weighted_random(totals: Sequence[float], rng: random.Random) -> list[int]:
    """First pick drawn with probability proportional to its total (uniform if all are 0),
    the rest by descending total as fallbacks."""
    if not totals:
        return []
    weights = [max(t, 0.0) for t in totals]
    if sum(weights) <= 0:
        first = rng.randrange(len(totals))
    else:
        first = rng.choices(range(len(totals)), weights=weights)[0]
    rest = [i for i in rank_max(totals, rng) if i != first]
    return [first, *rest]


PICKERS = {"max": rank_max, "weighted-random": rank_weighted_random}
