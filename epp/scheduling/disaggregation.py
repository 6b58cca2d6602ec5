"""The P/D profile: disaggregated prefill/decode as the llm-d router splits requests.

Pods carry a role label (`llm-d.ai/role`: `prefill`, `decode`, `both`; no label = `both`).
Every request gets a decode pod, picked by the request's own profile among the `decode` and
`both` pods. It also gets a prefill pod, picked the same way among the `prefill` and `both`
pods other than the decode pod, when splitting is worth it:

- the prompt part the decode pod does not already cache is at least `minUncachedTokens`
  (a short or mostly cached prompt prefills faster in place than its KV moves), estimated from
  the decode pod's prefix score (matched blocks over the prompt's blocks); without a prefix
  scorer in the profile the whole prompt counts;
- and the best prefill pod is not saturated and its queue is at most `maxPrefillQueue`
  requests (a queued prefill pod would add more to the time to first token than it saves).

Otherwise the request stays aggregated on the decode pod. The decision names the prefill pod
in `Decision.prefill`; the processor sends it in the prefiller header (epp/requestcontrol/processor.py).

`Disaggregated` is the handler a pool with `disaggregation` gets (epp/app.py `build_scheduler`),
`SinglePick` the one every other pool gets: `WeightedScheduler.pick` runs its handler over its
own single ranking (`WeightedScheduler.rank`), so no caller branches on the pool's shape.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Protocol

from epp.datalayer.endpoint_records import PoolSnapshot
from epp.scheduling.decision import Decision
from epp.scheduling.registry import cached_share
from epp.scheduling.request import InferenceRequest
from gateway.pool_config import DisaggregationConfig

PREFILL, DECODE, BOTH = "prefill", "decode", "both"

# One ranking of a profile over a snapshot (`WeightedScheduler.rank`).
Rank = Callable[[InferenceRequest, PoolSnapshot], Decision]


class Handler(Protocol):
    def decide(self, rank: Rank, request: InferenceRequest, snapshot: PoolSnapshot) -> Decision:
        """The decision, from as many rankings as the pool's shape needs."""
        ...


class SinglePick:
    """One ranking over the whole pool: an aggregated pool."""

    def decide(self, rank: Rank, request: InferenceRequest, snapshot: PoolSnapshot) -> Decision:
        return rank(request, snapshot)


@dataclass(frozen=True, slots=True)
class Disaggregated:
    """The P/D profile (the module doc): a decode ranking, then maybe a prefill ranking."""

    config: DisaggregationConfig

    def decide(self, rank: Rank, request: InferenceRequest, snapshot: PoolSnapshot) -> Decision:
        return pick_disaggregated(rank, self.config, request, snapshot)


def with_roles(snapshot: PoolSnapshot, label: str, roles: tuple[str, ...]) -> PoolSnapshot:
    """The pods whose role (label value, `both` when unlabelled) is one of `roles`."""
    pods = tuple(e for e in snapshot.endpoints if e.endpoint.labels.get(label, BOTH) in roles)
    return PoolSnapshot(pods, snapshot.taken_at)


def uncached_tokens(request: InferenceRequest, decision: Decision) -> int:
    """The prompt tokens the chosen decode pod would have to prefill itself (estimate)."""
    hit = cached_share(decision.scores.get(decision.ranked[0], {})) or 0.0
    hit = min(max(hit, 0.0), 1.0)
    return round(request.prompt_tokens * (1.0 - hit))


def pick_disaggregated(
    rank: Rank, config: DisaggregationConfig, request: InferenceRequest, snapshot: PoolSnapshot
) -> Decision:
    """A decode pick, with a prefill pod when the split is worth it (see the module doc)."""
    label = config.role_label
    decision = rank(request, with_roles(snapshot, label, (DECODE, BOTH)))
    if not decision.ranked or uncached_tokens(request, decision) < config.min_uncached_tokens:
        return decision
    decode = decision.ranked[0]
    prefillers = with_roles(snapshot, label, (PREFILL, BOTH))
    prefillers = PoolSnapshot(
        tuple(e for e in prefillers.endpoints if e.address != decode), snapshot.taken_at
    )
    if not prefillers.endpoints:
        return decision
    prefill = rank(request, prefillers)
    if not prefill.ranked or prefill.saturated:
        return decision
    state = prefillers.by_address()[prefill.ranked[0]]
    if state.queue is not None and state.queue > config.max_prefill_queue:
        return decision
    return replace(decision, prefill=prefill.ranked[0])
