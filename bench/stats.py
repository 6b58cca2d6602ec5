"""Pure summary statistics over load-generator results: percentiles, throughput, errors, deltas."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from bench.loadgen import RequestResult


def percentile(values: Iterable[float], q: float) -> float | None:
    """The q-th percentile (0..100) with linear interpolation between order statistics.

    Same definition as numpy's default ("linear"): rank = q/100 * (n-1). None when empty.
    """
    if not 0 <= q <= 100:
        raise ValueError(f"percentile q must be within 0..100, got {q}")
    data = sorted(values)
    if not data:
        return None
    rank = q / 100 * (len(data) - 1)
    lo = math.floor(rank)
    hi = min(lo + 1, len(data) - 1)
    return data[lo] + (data[hi] - data[lo]) * (rank - lo)


def mean(values: Iterable[float]) -> float | None:
    data = list(values)
    return sum(data) / len(data) if data else None


def change_pct(value: float | None, baseline: float | None) -> float | None:
    """Relative change of `value` vs `baseline` in percent (negative = lower); None if undefined."""
    if value is None or baseline is None or baseline == 0:
        return None
    return (value - baseline) / baseline * 100.0


def throughput(results: Sequence[RequestResult]) -> float:
    """Output tokens per second of successful requests, over the span from first send to last end."""
    done = [r for r in results if r.ok and r.e2e_s is not None]
    if not done:
        return 0.0
    start = min(r.sent_s for r in done)
    end = max(r.sent_s + (r.e2e_s or 0.0) for r in done)
    span = end - start
    return sum(r.output_tokens for r in done) / span if span > 0 else 0.0


def error_counts(results: Sequence[RequestResult]) -> dict[str, int]:
    """Failed requests grouped by HTTP status ("http-429") or error kind ("timeout", ...)."""
    counts: Counter[str] = Counter()
    for r in results:
        if r.ok:
            continue
        if r.status and r.status != 200:
            counts[f"http-{r.status}"] += 1
        else:
            counts[(r.error or "unknown").split(":")[0].split(" after")[0]] += 1
    return dict(counts)


@dataclass
class Summary:
    requests: int
    ok: int
    errors: int
    error_kinds: dict[str, int]
    ttft_p50: float | None
    ttft_p95: float | None
    ttft_p99: float | None
    ttft_mean: float | None
    e2e_p50: float | None
    e2e_p95: float | None
    itl_p50: float | None
    itl_p95: float | None
    output_tok_s: float
    lag_p99: float | None
    lag_max: float | None
    pods: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def summarize(results: Sequence[RequestResult]) -> Summary:
    ok = [r for r in results if r.ok]
    ttft = [r.ttft_s for r in ok if r.ttft_s is not None]
    e2e = [r.e2e_s for r in ok if r.e2e_s is not None]
    itl = [gap for r in ok for gap in r.itl_s]
    lag = [r.lag_s for r in results]
    pods = Counter(r.pod for r in ok if r.pod)
    return Summary(
        requests=len(results),
        ok=len(ok),
        errors=len(results) - len(ok),
        error_kinds=error_counts(results),
        ttft_p50=percentile(ttft, 50),
        ttft_p95=percentile(ttft, 95),
        ttft_p99=percentile(ttft, 99),
        ttft_mean=mean(ttft),
        e2e_p50=percentile(e2e, 50),
        e2e_p95=percentile(e2e, 95),
        itl_p50=percentile(itl, 50),
        itl_p95=percentile(itl, 95),
        output_tok_s=throughput(results),
        lag_p99=percentile(lag, 99),
        lag_max=max(lag) if lag else None,
        pods=dict(sorted(pods.items())),
    )


def compare(summary: Summary, baseline: Summary) -> dict[str, float | None]:
    """Percent change of the headline figures vs a baseline policy (usually round-robin)."""
    return {
        "ttft_p50": change_pct(summary.ttft_p50, baseline.ttft_p50),
        "ttft_p95": change_pct(summary.ttft_p95, baseline.ttft_p95),
        "ttft_p99": change_pct(summary.ttft_p99, baseline.ttft_p99),
        "e2e_p95": change_pct(summary.e2e_p95, baseline.e2e_p95),
        "output_tok_s": change_pct(summary.output_tok_s, baseline.output_tok_s),
    }
