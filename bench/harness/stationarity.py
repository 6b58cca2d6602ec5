"""Is a trace's offered load stationary? First half vs second half, window by window.

A benchmark's steady-window statistics mean something only if the load offered in the window
does not drift: a trace whose prompts grow through the run (long-lived sessions) shows TTFT
growing with it, and the figure then depends on where the run stops. The check cuts the trace
into equal windows by arrival time and compares the first half with the second: the arrival
rate (window by window, so bursts count as noise) and, request by request, the mean prompt size
and the mean `max_tokens`.

A metric fails only when the halves differ by more than `tolerance` (relative) AND the
difference is well outside the sampling noise (a two-sample z score above `z_max`):
small seeded traces are noisy (10 % long prompts, bursty spikes), and long ones reveal tiny
drifts that do not matter. The per-request z assumes independent requests; session turns are
not (a session's prompt sizes move together), so for session traces the tolerance carries the
weight. Pure: trace in, verdict out.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from bench.harness.workloads import CHARS_PER_TOKEN, TraceRequest

WINDOWS = 10
TOLERANCE = 0.15
Z_MAX = 4.0


@dataclass(frozen=True)
class MetricCheck:
    name: str
    first: float  # mean over the first half's windows
    second: float
    change: float  # (second - first) / first
    z: float  # difference over its standard error from the windows' spread
    ok: bool


@dataclass(frozen=True)
class Stationarity:
    checks: tuple[MetricCheck, ...]

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    def describe(self) -> str:
        return "; ".join(
            f"{c.name} {c.first:,.1f} -> {c.second:,.1f} ({c.change * 100:+.0f} %, z {c.z:.1f})"
            + ("" if c.ok else " DRIFTS")
            for c in self.checks
        )


def prompt_tokens(req: TraceRequest) -> float:
    """Prompt size as the gateway estimates it: characters / 4."""
    messages = req.body.get("messages")
    text = sum(len(m["content"]) for m in messages) if messages else len(req.body.get("prompt", ""))
    return text / CHARS_PER_TOKEN


def _compare(name: str, first: Sequence[float], second: Sequence[float], tolerance: float, z_max: float):
    a, b = statistics.fmean(first), statistics.fmean(second)
    change = (b - a) / a if a else (0.0 if b == 0 else math.inf)
    var = statistics.variance(first) / len(first) + statistics.variance(second) / len(second)
    z = abs(b - a) / math.sqrt(var) if var > 0 else (0.0 if a == b else math.inf)
    return MetricCheck(name, a, b, change, z, abs(change) <= tolerance or z <= z_max)


def check_stationarity(
    trace: Sequence[TraceRequest],
    duration_s: float,
    *,
    windows: int = WINDOWS,
    tolerance: float = TOLERANCE,
    z_max: float = Z_MAX,
) -> Stationarity:
    """Compare arrival rate, mean prompt tokens and mean max_tokens between the trace's halves."""
    if windows < 4 or windows % 2:
        raise ValueError("windows must be an even number >= 4")
    if duration_s <= 0:
        raise ValueError("duration_s must be > 0")
    width = duration_s / windows
    buckets: list[list[TraceRequest]] = [[] for _ in range(windows)]
    for req in trace:
        buckets[min(windows - 1, max(0, int(req.at_s / width)))].append(req)
    if any(not b for b in buckets):
        raise ValueError(f"a window of {width:g} s has no arrivals: trace too short to judge")
    half = windows // 2
    first = [r for b in buckets[:half] for r in b]
    second = [r for b in buckets[half:] for r in b]
    rates = [len(b) / width for b in buckets]
    checks = [_compare("arrival rate (req/s)", rates[:half], rates[half:], tolerance, z_max)]
    sizes: dict[str, Callable[[TraceRequest], float]] = {
        "mean prompt tokens": prompt_tokens,
        "mean max_tokens": lambda r: float(r.body.get("max_tokens", 0)),
    }
    for name, size in sizes.items():  # per request: many samples, so a sharper test than windows
        checks.append(_compare(name, [size(r) for r in first], [size(r) for r in second], tolerance, z_max))
    return Stationarity(tuple(checks))
