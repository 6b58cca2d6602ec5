"""Pickers: order candidates by total score. They return the full ranking (best first) so
the servicer can send a fallback list.

Near-equal totals (within `tieBand` of the best) are told apart by what this EPP knows exactly
rather than by the scraped figures' noise: on identical pods a short prompt's prediction is one
engine step of its pod, smoothed over scrapes, so two requests close together both went to the
pod whose smoothed step read lowest. Among the near-equal, `exact_load` orders: this EPP's picks
whose prefill has not ended, then its requests in flight there (the pod's batch as far as this
EPP made it), then the pod picked longest ago (a rotation).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from itertools import groupby

from epp.datalayer.endpoint_records import EndpointState

# Totals closer than this are a tie: floating-point sums of equal scores can differ in the
# last bits, which must not defeat the random tie-break.
TIE_EPSILON = 1e-9


_TIE_SCALE = 1.0 / TIE_EPSILON

ExactLoad = tuple[float, ...]


def exact_load(s: EndpointState) -> ExactLoad:
    """A pod's work as this EPP committed it, lowest first: pending prefills, requests in flight,
    when it was last picked."""
    pending = s.pending_requests if s.pending_requests is not None else s.routed_since_scrape
    return (pending, s.inflight_requests, s.last_routed_at)


def rank_max(
    totals: Sequence[float],
    rng: random.Random,
    loads: Callable[[int], ExactLoad] | None = None,
    band: float = 0.0,
) -> list[int]:
    """Indices by descending total; ties broken uniformly at random (seedable via `rng`), and
    with `loads` (candidate index -> its load, read only for the near-equal ones) the totals within
    `band` x the best first, by ascending load.

    Totals are quantised to TIE_EPSILON and sorted in C; only runs of equal keys (rare
    among loaded pods, few among idle ones) are shuffled in Python.
    """
    keys = list(map(round, map(_TIE_SCALE.__mul__, totals)))
    order = sorted(range(len(keys)), key=keys.__getitem__, reverse=True)
    if len(set(keys)) != len(keys):
        out: list[int] = []
        for _, run in groupby(order, key=keys.__getitem__):
            tied = list(run)
            if len(tied) > 1:
                rng.shuffle(tied)
            out += tied
        order = out
    if loads is None or band <= 0.0 or len(order) < 2:
        return order
    return _settle_near_ties(order, totals, loads, band)


def _settle_near_ties(
    order: list[int], totals: Sequence[float], loads: Callable[[int], ExactLoad], band: float
) -> list[int]:
    """`order` with its near-equal head (totals within `band` x the best) sorted by load; the
    sort is stable, so equal loads keep the random tie order."""
    best = totals[order[0]]
    floor = best - band * abs(best) - TIE_EPSILON
    n = 0
    for i in order:
        if totals[i] < floor:
            break
        n += 1
    if n < 2:
        return order
    head = sorted(order[:n], key=loads)
    return head + order[n:]


def rank_weighted_random(
    totals: Sequence[float],
    rng: random.Random,
    loads: Callable[[int], ExactLoad] | None = None,
    band: float = 0.0,
) -> list[int]:
    """First pick drawn with probability proportional to its total (uniform if all are 0),
    the rest by descending total as fallbacks (near-equal ones by load, as `rank_max`)."""
    if not totals:
        return []
    weights = [max(t, 0.0) for t in totals]
    if sum(weights) <= 0:
        first = rng.randrange(len(totals))
    else:
        first = rng.choices(range(len(totals)), weights=weights)[0]
    rest = [i for i in rank_max(totals, rng, loads, band) if i != first]
    return [first, *rest]
