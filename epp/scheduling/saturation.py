"""Saturation: when a pod (or the whole pool) has no headroom left. Pure functions.

A pod's queue here is its scraped waiting count plus the requests this EPP routed to it that
the last scrape cannot have seen yet (see `scorers.effective_queue`), so a burst that lands
between two scrapes saturates a pod at once instead of one scrape later.
"""

from __future__ import annotations

from epp.pool import EndpointState, PoolSnapshot
from epp.scheduling.profiles import DEFAULT_THRESHOLDS, Thresholds

# GIE: metrics older than this count as saturated in the pool-level figure.
POOL_STALE_AFTER = 0.2


def unseen_inflight(state: EndpointState) -> float:
    """Requests routed here that the last scrape does not show yet: in-flight minus what the
    pod reported as waiting or running (never negative; other gateway replicas' requests
    only ever make the pod's counts larger, so this never double counts)."""
    m = state.metrics
    if m is None:
        return float(state.inflight_requests)
    return max(0.0, state.inflight_requests - (m.waiting or 0.0) - (m.running or 0.0))


def effective_queue(state: EndpointState) -> float:
    """waiting + unseen in-flight; the scrape's view corrected by the EPP's fresher one
    (an unknown waiting count contributes nothing: only what the EPP itself routed counts)."""
    m = state.metrics
    return ((m.waiting or 0.0) if m is not None else 0.0) + unseen_inflight(state)


def pod_saturation(state: EndpointState, thresholds: Thresholds = DEFAULT_THRESHOLDS) -> float:
    """max(q / queue_saturated, kv / kv_saturated), clamped to [0, 1]; unknown metrics (no
    scrape, or neither waiting nor KV known) -> 1; an unknown term is left out."""
    m = state.metrics
    if m is None or (m.waiting is None and m.kv_usage is None):
        return 1.0
    kv = m.kv_usage or 0.0
    level = max(effective_queue(state) / thresholds.queue_saturated, kv / thresholds.kv_saturated)
    return min(1.0, max(0.0, level))


def is_saturated(state: EndpointState, thresholds: Thresholds = DEFAULT_THRESHOLDS) -> bool:
    """Queue or KV at/over its threshold. Unknown metrics are not evidence of saturation
    here; distrusting them is the stale filter's job."""
    m = state.metrics
    if m is None:
        return False
    if m.kv_usage is not None and m.kv_usage >= thresholds.kv_saturated:
        return True
    waiting = m.waiting or 0.0  # effective_queue, inlined (hot)
    unseen = state.inflight_requests - waiting - (m.running or 0.0)
    return waiting + (unseen if unseen > 0 else 0.0) >= thresholds.queue_saturated


def saturation(
    snapshot: PoolSnapshot,
    thresholds: Thresholds = DEFAULT_THRESHOLDS,
    *,
    stale_after: float = POOL_STALE_AFTER,
    model: str | None = None,
) -> float:
    """Pool saturation for admission: mean over pods of max(q/5, kv/0.8) (GIE's formula).

    Each pod's term is clamped to 1 so one badly overloaded pod cannot make a pool with idle
    pods look saturated. Stale (older than `stale_after`), never-scraped and unhealthy pods
    count as fully saturated (1.0); an empty pool (or no pod serving `model`) is 1.0.
    """
    total = 0.0
    count = 0
    for state in snapshot.endpoints:
        if model is not None and model not in state.endpoint.models:
            continue
        count += 1
        if not state.healthy or state.metrics is None or state.metrics_age > stale_after:
            total += 1.0
        else:
            total += pod_saturation(state, thresholds)
    return 1.0 if count == 0 else total / count
