"""Pure summary statistics over load-generator results: percentiles, throughput, errors, deltas."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from bench.harness.loadgen import RequestResult


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


# ---------------------------------------------------------------- steady window

WARMUP_FRACTION = 0.1  # arrivals in the first 10 % of the trace's span are warm-up


@dataclass(frozen=True)
class Window:
    """The steady window of one run, by the trace: [start_s, end_s) in run seconds.

    end_s is the last arrival (scheduled send time); start_s = WARMUP_FRACTION x end_s. Warm-up
    = requests scheduled before start_s; drain = everything after end_s (no new load arrives).
    """

    start_s: float
    end_s: float

    @property
    def length_s(self) -> float:
        return self.end_s - self.start_s


def steady_window(results: Sequence[RequestResult], warmup_fraction: float = WARMUP_FRACTION) -> Window:
    last = max((r.scheduled_s for r in results), default=0.0)
    return Window(warmup_fraction * last, last)


def token_times(r: RequestResult) -> list[float]:
    """Run-relative times of a request's content chunks: first token, then each inter-token gap."""
    if r.ttft_s is None:
        return []
    t = r.sent_s + r.ttft_s
    out = [t]
    for gap in r.itl_s:
        t += gap
        out.append(t)
    return out


def tokens_between(results: Sequence[RequestResult], start_s: float, end_s: float) -> float:
    """Output tokens of successful requests emitted within [start_s, end_s), chunk by chunk
    (a chunk carries output_tokens / chunks tokens, so usage-counted totals are kept)."""
    total = 0.0
    for r in results:
        if not r.ok:
            continue
        times = token_times(r)
        if times:
            per_chunk = r.output_tokens / len(times)
            total += per_chunk * sum(start_s <= t < end_s for t in times)
    return total


def goodput(results: Sequence[RequestResult], slo_ttft_s: float | None) -> float | None:
    """Share of requests (failures included, as misses) whose TTFT is within the SLO."""
    if slo_ttft_s is None or not results:
        return None
    good = sum(1 for r in results if r.ok and r.ttft_s is not None and r.ttft_s <= slo_ttft_s)
    return good / len(results)


def slo_attainment(results: Sequence[RequestResult]) -> float | None:
    """Share of the requests that carry their own TTFT objective (`slo_ttft_s`) whose TTFT met
    it (failures and refusals count as misses); None when none carries one."""
    asked = [r for r in results if r.slo_ttft_s is not None]
    if not asked:
        return None
    met = sum(1 for r in asked if r.ok and r.ttft_s is not None and r.ttft_s <= (r.slo_ttft_s or 0.0))
    return met / len(asked)


def latency_stats(results: Sequence[RequestResult]) -> dict[str, Any]:
    """Counts, errors and TTFT / E2E / ITL P50-P95-P99 of a set of requests, JSON-ready."""
    ok = [r for r in results if r.ok]
    ttft = [r.ttft_s for r in ok if r.ttft_s is not None]
    e2e = [r.e2e_s for r in ok if r.e2e_s is not None]
    itl = [gap for r in ok for gap in r.itl_s]
    out: dict[str, Any] = {
        "requests": len(results),
        "ok": len(ok),
        "errors": len(results) - len(ok),
        "error_kinds": error_counts(results),
    }
    for name, values in (("ttft", ttft), ("e2e", e2e), ("itl", itl)):
        for q in (50, 95, 99):
            out[f"{name}_p{q}"] = percentile(values, q)
    out["ttft_mean"] = mean(ttft)
    return out


def by_tag(results: Sequence[RequestResult], max_tags: int = 12) -> dict[str, dict[str, Any]]:
    """`latency_stats` plus output tokens and 429 refusals per request tag, when the workload has
    few tags (priority classes x tenants); {} for workloads with many (sessions, groups)."""
    tags = sorted({r.tag for r in results})
    if len(tags) > max_tags:
        return {}
    out = {}
    for tag in tags:
        mine = [r for r in results if r.tag == tag]
        stats = latency_stats(mine)
        stats["refused_429"] = sum(1 for r in mine if r.status == 429)
        stats["output_tokens"] = sum(r.output_tokens for r in mine if r.ok)
        attained = slo_attainment(mine)
        if attained is not None:
            stats["slo_attainment"] = attained
        out[tag] = stats
    return out


def _session_of(tag: str) -> str | None:
    session, sep, _ = tag.partition("/turn-")
    return session if sep and session.startswith("session-") else None


def _group_of(tag: str) -> str | None:
    return tag if tag.startswith("group-") else None


def _stickiness(results: Sequence[RequestResult], key: Callable[[str], str | None]) -> float | None:
    """Share of requests served by the pod that served the previous request of the same key
    (in send order); None when no key repeats."""
    last: dict[str, str] = {}
    same = total = 0
    for r in sorted(results, key=lambda r: r.sent_s):
        k = key(r.tag)
        if k is None or not r.ok or not r.pod:
            continue
        if k in last:
            total += 1
            same += last[k] == r.pod
        last[k] = r.pod
    return same / total if total else None


def session_stickiness(results: Sequence[RequestResult]) -> float | None:
    """Share of a session's turns served by the pod that served its previous turn (tags
    `session-<n>/turn-<k>`); None when the workload has no sessions."""
    return _stickiness(results, _session_of)


def group_stickiness(results: Sequence[RequestResult]) -> float | None:
    """The same for prompt groups (tags `group-<n>`: requests sharing a system prompt), how
    often a group stays where its prefix was just cached; None without groups."""
    return _stickiness(results, _group_of)


def by_arrival_window(
    results: Sequence[RequestResult], end_s: float, windows: int = 10
) -> list[dict[str, float | int | None]]:
    """TTFT P50/P95 and counts per equal slice of arrival time: shows whether latency drifts."""
    width = end_s / windows if end_s > 0 else 1.0
    buckets: list[list[RequestResult]] = [[] for _ in range(windows)]
    for r in results:
        buckets[min(windows - 1, int(r.scheduled_s / width))].append(r)
    out = []
    for b in buckets:
        ttft = [r.ttft_s for r in b if r.ok and r.ttft_s is not None]
        out.append({"requests": len(b), "ttft_p50": percentile(ttft, 50), "ttft_p95": percentile(ttft, 95)})
    return out


def phase_stats(
    results: Sequence[RequestResult],
    slo_ttft_s: float | None = None,
    warmup_fraction: float = WARMUP_FRACTION,
) -> dict[str, Any]:
    """Warm-up, steady window and drain of one run, as the summary stores them.

    Latency of the steady window = requests *arriving* in it (not cut by completion time:
    dropping late completions would drop exactly the requests a backlog slows down).
    Sustained output tok/s = tokens *emitted* in the window / its length; drain tokens (after
    the last arrival) and warm-up tokens are shown apart.
    """
    w = steady_window(results, warmup_fraction)
    warm = [r for r in results if r.scheduled_s < w.start_s]
    steady = [r for r in results if r.scheduled_s >= w.start_s]
    ends = [r.sent_s + r.e2e_s for r in results if r.ok and r.e2e_s is not None]
    last_end = max(ends, default=w.end_s)
    steady_stats = latency_stats(steady)
    steady_stats["output_tok_s"] = (
        tokens_between(results, w.start_s, w.end_s) / w.length_s if w.length_s > 0 else 0.0
    )
    steady_stats["goodput"] = goodput(steady, slo_ttft_s)
    good = None if steady_stats["goodput"] is None else steady_stats["goodput"] * len(steady)
    steady_stats["goodput_rps"] = good / w.length_s if good is not None and w.length_s > 0 else None
    attained = slo_attainment(steady)
    if attained is not None:  # requests with their own objectives: met / all, and met per second
        steady_stats["slo_attainment"] = attained
        met = attained * sum(1 for r in steady if r.slo_ttft_s is not None)
        steady_stats["slo_goodput_rps"] = met / w.length_s if w.length_s > 0 else None
    lag = [r.lag_s for r in steady]
    steady_stats["lag_p99"] = percentile(lag, 99)
    steady_stats["lag_max"] = max(lag, default=None)
    probe = [r.probe_s for r in steady if r.probe_s is not None]
    if probe:  # the oracle's probe time, already taken out of its TTFT (loadgen.without_probe_time)
        for q in (50, 95, 99):
            steady_stats[f"probe_p{q}"] = percentile(probe, q)
    pods = Counter(r.pod for r in steady if r.ok and r.pod)
    total = sum(pods.values())
    steady_stats["pod_share"] = {p: n / total for p, n in sorted(pods.items())} if total else {}
    tags = by_tag(steady)
    if tags:
        steady_stats["by_tag"] = tags
    sticky = session_stickiness(results)
    if sticky is not None:
        steady_stats["session_stickiness"] = sticky
    grouped = group_stickiness(results)
    if grouped is not None:
        steady_stats["group_stickiness"] = grouped
    warm_stats = latency_stats(warm)
    warm_stats["output_tok_s"] = tokens_between(results, 0.0, w.start_s) / w.start_s if w.start_s > 0 else 0.0
    drain_tokens = tokens_between(results, w.end_s, math.inf)
    return {
        "window": {"start_s": w.start_s, "end_s": w.end_s, "warmup_fraction": warmup_fraction},
        "warmup": {k: warm_stats[k] for k in ("requests", "errors", "ttft_p50", "ttft_p95", "output_tok_s")},
        "steady": steady_stats,
        "drain": {
            "duration_s": max(0.0, last_end - w.end_s),
            "output_tokens": drain_tokens,
            "requests_completing": sum(1 for e in ends if e > w.end_s),
        },
        "by_window": by_arrival_window(results, w.end_s),
        "whole_run": {
            "requests": len(results),
            "ttft_p95": latency_stats(results)["ttft_p95"],
            "output_tok_s_incl_drain": throughput(results),
        },
    }


@dataclass(frozen=True)
class Spread:
    """One figure over seeds: the median and the min-max range."""

    median: float
    lo: float
    hi: float
    n: int

    @classmethod
    def of(cls, values: Iterable[float | None]) -> Spread | None:
        data = sorted(v for v in values if v is not None)
        if not data:
            return None
        middle = len(data) // 2
        median = data[middle] if len(data) % 2 else (data[middle - 1] + data[middle]) / 2
        return cls(median, data[0], data[-1], len(data))

    def below(self, other: Spread) -> bool:
        """Lower with no overlap: every seed of self under every seed of other."""
        return self.hi < other.lo
