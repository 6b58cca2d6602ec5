"""The pool's saturation for autoscalers (epp/scheduling/saturation.py): each pod's level is
clamped to 1, and pods the EPP cannot read (unscraped, unhealthy, stale) count as full."""

from __future__ import annotations

import pytest

from epp.scheduling.saturation import pod_level, pool_saturation
from gateway.scheduling_params import DEFAULT_THRESHOLDS

from .factories import snap, state


def test_an_overloaded_pod_counts_as_full_not_more() -> None:
    queue = DEFAULT_THRESHOLDS.queue_saturated
    assert pod_level(state("a", waiting=queue * 1.5), DEFAULT_THRESHOLDS) == 1.0
    assert pod_level(state("a", waiting=queue / 2), DEFAULT_THRESHOLDS) == pytest.approx(0.5)


def test_every_unreadable_pod_counts_one() -> None:
    pods = snap(
        state("never", scraped=False),
        state("down", healthy=False),
        state("stale", age=60.0),
        state("idle"),
    )
    assert pool_saturation(pods, DEFAULT_THRESHOLDS, stale_after=1.0) == pytest.approx(3 / 4)
    assert (
        pool_saturation(snap(state("idle"), state("at-limit", age=1.0)), DEFAULT_THRESHOLDS, stale_after=1.0)
        == 0.0
    )
