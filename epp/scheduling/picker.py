"""Pickers: order candidates by total score. They return the full ranking (best first) so
the servicer can send a fallback list."""

from __future__ import annotations

import random
from collections.abc import Sequence

# Totals closer than this are a tie: floating-point sums of equal scores can differ in the
# last bits, which must not defeat the random tie-break.
TIE_EPSILON = 1e-9


def rank_max(totals: Sequence[float], rng: random.Random) -> list[int]:
    """Indices by descending total; ties broken uniformly at random (seedable via `rng`)."""
    rand = rng.random
    return sorted(range(len(totals)), key=lambda i: (-round(totals[i] / TIE_EPSILON), rand()))


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
