"""Statistics: percentiles against an independent reference, throughput, errors, deltas."""

from __future__ import annotations

import statistics

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bench.harness.loadgen import RequestResult
from bench.harness.stats import change_pct, compare, error_counts, percentile, summarize, throughput


@given(st.lists(st.floats(-1e6, 1e6, allow_nan=False), min_size=2, max_size=60))
def test_percentile_matches_statistics_inclusive_quantiles(values: list[float]) -> None:
    cuts = statistics.quantiles(values, n=100, method="inclusive")  # cut k = k-th percentile
    for q in (1, 25, 50, 95, 99):
        assert percentile(values, q) == pytest.approx(cuts[q - 1], rel=1e-9, abs=1e-6)
    assert percentile(values, 0) == min(values)
    assert percentile(values, 100) == max(values)


def test_percentile_small_cases() -> None:
    assert percentile([], 50) is None
    assert percentile([3.0], 99) == 3.0
    assert percentile([4, 1, 3, 2], 50) == 2.5
    assert percentile(range(101), 95) == 95
    with pytest.raises(ValueError):
        percentile([1], 101)


def test_change_pct() -> None:
    assert change_pct(50, 200) == -75
    assert change_pct(110, 100) == pytest.approx(10)
    assert change_pct(None, 1) is None and change_pct(1, 0) is None


def _ok(sent: float, ttft: float, e2e: float, tokens: int, pod: str = "p0") -> RequestResult:
    return RequestResult(0, "t", sent, sent, 0.0, ttft, e2e, [0.01], tokens, tokens, 200, None, pod)


def test_throughput_counts_successes_over_their_span() -> None:
    results = [_ok(0.0, 0.1, 2.0, 100), _ok(1.0, 0.1, 3.0, 300)]  # span 0 .. 4 s
    failed = RequestResult(1, "t", 5.0, 5.0, status=500, error="HTTP 500: x", output_tokens=999, e2e_s=9)
    assert throughput([*results, failed]) == pytest.approx(400 / 4)
    assert throughput([failed]) == 0.0


def test_error_counts_by_kind() -> None:
    results = [
        RequestResult(0, "t", 0, status=429, error="HTTP 429: busy"),
        RequestResult(1, "t", 0, status=429, error="HTTP 429: busy"),
        RequestResult(2, "t", 0, error="timeout after 5s"),
        RequestResult(3, "t", 0, error="ConnectError: refused"),
        RequestResult(4, "t", 0, status=200, error="no content in stream"),
        _ok(0, 0.1, 1, 5),
    ]
    assert error_counts(results) == {
        "http-429": 2,
        "timeout": 1,
        "ConnectError": 1,
        "no content in stream": 1,
    }


def test_summarize_and_compare() -> None:
    fast = [_ok(i, 0.1 * (i + 1), 1.0, 10, pod=f"p{i % 2}") for i in range(10)]
    slow = [_ok(i, 0.2 * (i + 1), 2.0, 10) for i in range(10)]
    s = summarize([*fast, RequestResult(99, "t", 0, status=503, error="HTTP 503: x")])
    assert (s.requests, s.ok, s.errors, s.error_kinds) == (11, 10, 1, {"http-503": 1})
    assert s.ttft_p50 == pytest.approx(0.55)
    assert s.ttft_p99 == pytest.approx(percentile([0.1 * (i + 1) for i in range(10)], 99))
    assert s.pods == {"p0": 5, "p1": 5}
    delta = compare(summarize(fast), summarize(slow))
    assert delta["ttft_p95"] == pytest.approx(-50)
    assert delta["e2e_p95"] == pytest.approx(-50)
    empty = summarize([])
    assert empty.ttft_p50 is None and empty.output_tok_s == 0 and empty.requests == 0


def test_spread_is_median_and_range_and_below_means_no_overlap() -> None:
    from bench.harness.stats import Spread

    s = Spread.of([3.0, None, 1.0, 2.0])
    assert s == Spread(2.0, 1.0, 3.0, 3)
    assert Spread.of([1.0, 4.0]) == Spread(2.5, 1.0, 4.0, 2)
    assert Spread.of([None]) is None
    assert Spread.of([1, 2]).below(Spread.of([2.5, 9]))  # type: ignore[union-attr]
    assert not Spread.of([1, 3]).below(Spread.of([2.5, 9]))  # type: ignore[union-attr,arg-type]
