"""Saturation: when a pod, or the whole pool, has no headroom left. Pure.

The queue term is a pod's backlog, `EndpointState.backlog`: the scraped waiting count plus the
requests this EPP routed to it that the last scrape cannot have seen yet (so a burst that lands
between two scrapes saturates a pod at once instead of one scrape later), less as many of
those unseen ones as its free KV cache can still admit. The KV term is the committed KV
(`EndpointState.committed_kv`): the page's use plus what this EPP routed since the page (prompt +
expected output), so flow control stops releasing once the picks it released fill the cache,
not one scrape later when they show on the page and are already queued inside vLLM. Counting every routed-but-unseen
request as queued made a pod with half its KV free read as saturated at a queue threshold of
1 (one request in transit is enough), and flow control then released about one request per
pod per scrape (measured: docs/scheduling.md, "Flow control").
"""

from __future__ import annotations

from epp.datalayer.endpoint_records import EndpointState, PoolSnapshot
from gateway.scheduling_params import DEFAULT_THRESHOLDS, SaturationParams, Thresholds


def _backlog(state: EndpointState) -> float:
    return state.backlog if state.backlog is not None else float(state.inflight_requests)


def is_saturated(state: EndpointState, thresholds: SaturationParams = DEFAULT_THRESHOLDS) -> bool:
    """Backlog or KV at/over its threshold. Unknown metrics are not evidence of saturation
    here (distrusting them is the stale filter's job); with the waiting count unknown the
    EPP's own in-flight count stands in for the backlog."""
    m = state.metrics
    if m is None:
        return False
    kv = state.kv_level(thresholds.kv_measure)
    if kv is not None and kv >= thresholds.kv_saturated:
        return True
    return _backlog(state) >= thresholds.queue_saturated


def pod_level(state: EndpointState, thresholds: SaturationParams) -> float:
    """min(1, max(backlog / queue threshold, KV / KV threshold)) for one fresh pod; unknown
    terms count 0 (the backlog falls back to the in-flight count, as in `is_saturated`)."""
    kv = state.kv_level(thresholds.kv_measure) or 0.0
    level = max(_backlog(state) / thresholds.queue_saturated, kv / thresholds.kv_saturated)
    return level if level < 1.0 else 1.0


def pool_saturation(snapshot: PoolSnapshot, thresholds: Thresholds, *, stale_after: float) -> float:
    """The pool's headroom for autoscalers: the mean of `pod_level` over pods (GIE's formula),
    each pod clamped to 1 so one overloaded pod cannot make a pool with idle pods look full.
    Stale (older than `stale_after` s), never-scraped and unhealthy pods count 1; no pods is 1."""
    pods = snapshot.endpoints
    if not pods:
        return 1.0
    total = 0.0
    for state in pods:
        if not state.healthy or state.metrics is None or state.metrics_age > stale_after:
            total += 1.0
        else:
            total += pod_level(state, thresholds)
    return total / len(pods)
