"""bench.reports.herding: same-pod pairs within a window and the queue each request joined."""

from __future__ import annotations

import pytest

from bench.harness.loadgen import RequestResult
from bench.reports.herding import herding


def _r(index: int, sent_s: float, pod: str, ttft_s: float = 0.1) -> RequestResult:
    return RequestResult(
        index=index, tag="t", scheduled_s=sent_s, sent_s=sent_s, ttft_s=ttft_s, status=200, pod=pod
    )


def test_a_burst_on_one_pod_counts_as_herding_and_a_spread_one_does_not() -> None:
    herd = [_r(0, 0.000, "a"), _r(1, 0.005, "a"), _r(2, 0.010, "a")]
    spread = [_r(0, 0.000, "a"), _r(1, 0.005, "b"), _r(2, 0.010, "c")]
    assert herding(herd, 0.02) == (3, 1.0, pytest.approx(1.9))  # pairs (0,1) (0,2) (1,2); 0, 1, 2 ahead
    assert herding(spread, 0.02) == (0, 0.0, 0)
    # Outside the window, and after the earlier request's first token: neither counts.
    assert herding([_r(0, 0.0, "a", ttft_s=0.01), _r(1, 0.5, "a")], 0.02) == (0, 0.0, 0)
    assert herding([], 0.02) == (0, 0.0, 0)
