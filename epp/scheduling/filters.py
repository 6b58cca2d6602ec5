"""Filters: which pods may take a request. Each returns the survivors in input order.

Every filter is `fn(request, candidates, ctx: FilterContext) -> survivors`, one row of the plugin
catalogue (gateway/plugin_catalogue.py); `WeightedScheduler` runs them in the catalogue's order.

The stale and saturation filters never refuse on their own: when every candidate fails
them the candidates are kept (a stale or saturated pod is still better than a 503), and the
saturation filter reports it so admission can shed load instead.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from epp.datalayer.adapter_residency import AdapterResidency
from epp.datalayer.endpoint_records import EndpointState
from epp.scheduling.adapter_slots import slot_runs
from epp.scheduling.request import InferenceRequest
from epp.scheduling.saturation import is_saturated
from gateway.scheduling_params import Thresholds


@dataclass(slots=True)
class FilterContext:
    """One decision's inputs to the filters, and what they report back."""

    thresholds: Thresholds
    residency: AdapterResidency | None = None
    saturated: bool = False  # set by `unsaturated`: every candidate was over a threshold
    # The candidates `unsaturated` was given (`adapter_slots` may take saturated ones back).
    before_saturation: Sequence[EndpointState] = field(default_factory=tuple)
    # Pods holding most of the prompt (the KV memory, epp/scheduling/weighted.py `_holders`),
    # set when the profile prices their wait: `unsaturated` keeps them even when saturated.
    holders: frozenset[str] = frozenset()


Filter = Callable[[InferenceRequest, Sequence[EndpointState], FilterContext], list[EndpointState]]


def serving(
    request: InferenceRequest, candidates: Sequence[EndpointState], ctx: FilterContext
) -> list[EndpointState]:
    """Pods that serve the request's base model and, for a LoRA request, its adapter."""
    model, adapter = request.target_model, request.adapter
    return [s for s in candidates if s.endpoint.serves(model, adapter)]


def healthy(
    request: InferenceRequest, candidates: Sequence[EndpointState], ctx: FilterContext
) -> list[EndpointState]:
    """Pods whose scrapes are not failing repeatedly (the pool's `healthy` flag).

    When no pod is healthy they are all kept: every scrape failing at once is far more often
    the EPP (or its node) being starved or partitioned than every model server being down,
    and a pod that really is down is skipped by Envoy's retry on the fallback list. Measured:
    refusing instead turned an overloaded benchmark machine's late scrapes into 105 x 503 in 3 s.
    """
    kept = [s for s in candidates if s.healthy]
    return kept if kept else list(candidates)


def fresh(
    request: InferenceRequest, candidates: Sequence[EndpointState], ctx: FilterContext
) -> list[EndpointState]:
    """Pods with metrics younger than `staleAfterMs`; never-scraped pods are stale.

    Stale metrics of an idle-looking pod would otherwise attract every request (herding);
    when all candidates are stale they are all kept and the scorers treat unknowns as bad.
    """
    stale_after = ctx.thresholds.stale_after
    kept = [s for s in candidates if s.metrics_age <= stale_after]
    return kept if kept else list(candidates)


def unsaturated(
    request: InferenceRequest, candidates: Sequence[EndpointState], ctx: FilterContext
) -> list[EndpointState]:
    """Pods under the queue and KV thresholds; when none is, all are kept and flagged saturated.

    The flag (`ctx.saturated`) is what admission reads to shed sheddable traffic. A saturated
    pod that holds most of the prompt (`ctx.holders`) is kept beside the unsaturated ones: a
    long conversation's home is worth its wait more often than a recompute elsewhere, and the
    profile's prediction weighs the two. It does not count as headroom for the flag.
    """
    ctx.before_saturation = candidates
    holders = ctx.holders
    kept = []
    fits = False
    for s in candidates:
        if not is_saturated(s, ctx.thresholds):
            kept.append(s)
            fits = True
        elif holders and s.endpoint.address in holders:
            kept.append(s)
    if fits or not candidates:
        ctx.saturated = False
        return kept
    ctx.saturated = True
    return list(candidates)


def adapter_slots(
    request: InferenceRequest, candidates: Sequence[EndpointState], ctx: FilterContext
) -> list[EndpointState]:
    """For a LoRA request under adapter placement, after `unsaturated`: when none of the kept
    pods can run the adapter now (every one of their GPU slots held by other adapters), the
    saturated ones that can (it holds a slot there, or one is free) are kept too.

    A saturated pod's queue is a wait of a few engine steps; a pod whose slots the adapter
    cannot get is a wait until one adapter there has no request left, seconds, and every
    request sent there meanwhile joins it. Without this, a busy adapter's pod dropped out as
    saturated and its requests went where they waited for a slot (issue #28)."""
    adapter, residency, before = request.adapter, ctx.residency, ctx.before_saturation or candidates
    if adapter is None or not ctx.thresholds.adapter_placement or residency is None:
        return list(candidates)
    runs = [s for s in candidates if _runs(adapter, s, residency)]
    if runs or len(candidates) == len(before):
        return list(candidates)
    ids = {id(s) for s in candidates}
    more = [s for s in before if id(s) not in ids and _runs(adapter, s, residency)]
    return [*candidates, *more] if more else list(candidates)


def _runs(adapter: str, state: EndpointState, residency: AdapterResidency) -> bool:
    m = state.metrics
    if m is None or m.max_lora <= 0:
        return True  # no slot state: nothing to tell
    return slot_runs(adapter, residency.slots(state.address, m.running_adapters, m.scraped_at), m.max_lora)
