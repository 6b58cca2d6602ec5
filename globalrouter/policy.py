"""Which member cluster takes a request: cheapest that meets the TTFT objective, else fastest.

TTFT estimate per cluster and model (all inputs from heartbeats plus what this replica routed
there since, so a burst between two heartbeats still spreads):

    service = ttft + tpot * assumed_output_tokens    how long one request holds a slot
    ours    = n * min(1, service / W)                our n routes of the last W s still running
                                                     (Little's law: rate n/W times duration)
    load    = max(reported in-flight, running + queue) + ours
    excess  = max(0, load + 1 - capacity)           requests that would queue ahead of this one
    ttft^   = ttft + excess / capacity * service (+ one service time when KV is saturated)
            + network RTT from the client's region

Cost mode (objective set): walk members from cheapest (then nearest) and take the first whose
estimate meets the objective; a member ramping back after an outage is taken only with
probability equal to its ramp weight, so its share grows linearly. If none meets the objective,
take the lowest estimate (ramp-weighted). Balanced mode (no objective): weighted random with
weight ramp / estimate.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from globalrouter.config import RouterConfig
from globalrouter.members import MemberBook, ModelLoad


@dataclass(frozen=True, slots=True)
class Candidate:
    name: str
    cost: float
    rtt_s: float
    ttft_s: float  # estimated, network included
    ramp: float  # 0..1


@dataclass(frozen=True, slots=True)
class Choice:
    name: str
    reason: str  # "cheapest-meeting-objective" | "best-effort" | "balanced"
    estimated_ttft_s: float


def estimate_ttft(
    load: ModelLoad, our_recent: int, config: RouterConfig, observed_ttft_s: float | None = None
) -> float:
    """TTFT from the cluster's report, else what our observer measured, else the assumption."""
    ttft = load.ttft_s or observed_ttft_s or config.assumed_ttft_s
    tpot = load.tpot_s or config.assumed_tpot_s
    capacity = load.capacity or load.ready_pods * config.slots_per_pod
    capacity = max(1, capacity)
    service = ttft + tpot * config.assumed_output_tokens
    ours = our_recent * min(1.0, service / config.burst_window_s)
    busy = max(float(load.inflight_requests), load.running + load.avg_queue * load.ready_pods) + ours
    excess = max(0.0, busy + 1 - capacity)
    estimate = ttft + excess / capacity * service
    if load.avg_kv_usage >= config.kv_saturated:
        estimate += service
    return estimate


def candidates(book: MemberBook, model: str | None, client_region: str | None, now: float) -> list[Candidate]:
    out = []
    for state in book.members.values():
        if not book.available(state, now):
            continue
        load = book.serves(state, model)
        if load is None:
            continue
        rtt = book.config.rtt_s(client_region, state.region)
        out.append(
            Candidate(
                name=state.name,
                cost=state.cost_per_1k_tokens,
                rtt_s=rtt,
                ttft_s=estimate_ttft(load, book.recent_routed(state, now), book.config, state.observed_ttft_s)
                + rtt,
                ramp=book.ramp(state, now),
            )
        )
    return out


def choose(
    cands: list[Candidate], objective_s: float | None, rand: Callable[[], float] = random.random
) -> Choice | None:
    if not cands:
        return None
    if objective_s is None:
        weights = [c.ramp / max(c.ttft_s, 1e-3) for c in cands]
        point = rand() * sum(weights)
        for c, w in zip(cands, weights, strict=True):
            point -= w
            if point <= 0:
                return Choice(c.name, "balanced", c.ttft_s)
        return Choice(cands[-1].name, "balanced", cands[-1].ttft_s)
    for c in sorted(cands, key=lambda c: (c.cost, c.rtt_s, c.ttft_s, c.name)):
        if c.ttft_s <= objective_s and (c.ramp >= 1.0 or rand() < c.ramp):
            return Choice(c.name, "cheapest-meeting-objective", c.ttft_s)
    best = min(cands, key=lambda c: (c.ttft_s / max(c.ramp, 1e-3), c.cost, c.name))
    return Choice(best.name, "best-effort", best.ttft_s)
