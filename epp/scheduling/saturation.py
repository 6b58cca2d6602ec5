"""Saturation: when a pod has no headroom left. Pure.

A pod's queue here is `EndpointState.queue` (its scraped waiting count plus the requests this
EPP routed to it that the last scrape cannot have seen yet), so a burst that lands between
two scrapes saturates a pod at once instead of one scrape later.
"""

from __future__ import annotations

from epp.pool import EndpointState
from epp.scheduling.params import DEFAULT_THRESHOLDS, SaturationParams


def is_saturated(state: EndpointState, thresholds: SaturationParams = DEFAULT_THRESHOLDS) -> bool:
    """Queue or KV at/over its threshold. Unknown metrics are not evidence of saturation
    here (distrusting them is the stale filter's job); with the waiting count unknown the
    EPP's own in-flight count stands in for the queue."""
    m = state.metrics
    if m is None:
        return False
    if m.kv_usage is not None and m.kv_usage >= thresholds.kv_saturated:
        return True
    queue = state.queue if state.queue is not None else float(state.inflight_requests)
    return queue >= thresholds.queue_saturated
