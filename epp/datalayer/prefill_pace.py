"""A pod's prefill pace, learned from the server's own per-request histograms. I/O-free.

vLLM V1 records, as each request finishes, its prefill time (first scheduled to first token,
`vllm:request_prefill_time_seconds`), its prompt tokens (`vllm:request_prompt_tokens`) and,
on recent versions, the prompt tokens it computed rather than found in the prefix cache
(`vllm:request_prefill_kv_computed_tokens`). Between two scrapes the change of the three
histograms' `_sum` covers the same requests, so

    pace     = d computed tokens / d prefill seconds    (tokens per second, cache hits excluded)
    uncached = d computed tokens / d prompt tokens       (the share of a typical prompt it prefills)
    mean     = d prompt tokens / d requests              (a typical prompt's length on this pod)

Without the computed-tokens histogram (older vLLM) the prompt tokens stand in and the uncached
share is unknown: the pace then counts cached tokens as prefilled (it reads faster than the
GPU is on cached traffic). The prefill time of a request that shared its steps with others'
prefills is longer than its own compute, so under concurrent prefills the summed seconds
exceed the wall time they took (Little's law: their sum over the interval is the mean number
of requests prefilling at once); the seconds are capped at the interval's wall time, else a
pod that just took a burst read up to 7x slower than its identical neighbours (bursty, seen
in /debug/pool) and was starved until the figure aged out.

llama.cpp's server keeps the same figures as counters, updated after every engine step that
prefilled: `llamacpp:prompt_seconds_total` (the steps' wall time, so overlapping prefills are
not counted twice), `llamacpp:prompt_tokens_total` (computed) and
`llamacpp:prompt_tokens_cached_total` (taken from a slot's prompt cache); the prompt tokens are
their sum. It counts no requests, so its pods have no typical prompt length (`mean` unknown).

`PrefillTracker` turns cumulative totals into one `PrefillSample` per interval that saw
requests finish; the pool (epp/datalayer/pool.py) smooths the samples per pod and puts them into each
`EndpointState`. A server restart (any total going down) re-baselines without a sample. The
scraper reads these series at most every `PREFILL_READ_INTERVAL_S` per pod (`due`): four
more names in a scrape's pass over a 38 KB vLLM page cost ~20 us (~25 %), and a pace that
is a property of the GPU and the prompt mix needs no 50 ms resolution.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from epp.datalayer.endpoint_records import MAX_COUNT, count_problem
from epp.datalayer.metric_lines import Sample

PREFILL_READ_INTERVAL_S = 1.0


@dataclass(frozen=True, slots=True)
class PrefillSeries:
    """Where a dialect's cumulative prefill figures are, each a series name (summed over its
    samples). `prompt` or else computed + `cached` gives the prompt tokens; `computed` is
    optional only when `prompt` is given; without `requests` the typical prompt is unknown."""

    seconds: str
    requests: str | None = None
    prompt: str | None = None
    computed: str | None = None
    cached: str | None = None
    # Where the figures are recorded as requests finish, not as steps run: the same requests'
    # summed end-to-end seconds (see `PrefillTracker.sample`).
    e2e: str | None = None

    def names(self) -> tuple[str, ...]:
        names = (self.seconds, self.requests, self.prompt, self.computed, self.cached, self.e2e)
        return tuple(n for n in names if n)


PREFILL_SERIES: dict[str, PrefillSeries] = {
    "vllm": PrefillSeries(
        seconds="vllm:request_prefill_time_seconds_sum",
        requests="vllm:request_prefill_time_seconds_count",
        prompt="vllm:request_prompt_tokens_sum",
        computed="vllm:request_prefill_kv_computed_tokens_sum",
        e2e="vllm:e2e_request_latency_seconds_sum",
    ),
    "llamacpp": PrefillSeries(
        seconds="llamacpp:prompt_seconds_total",
        computed="llamacpp:prompt_tokens_total",
        cached="llamacpp:prompt_tokens_cached_total",
    ),
}


@dataclass(frozen=True, slots=True)
class PrefillTotals:
    """Cumulative totals of one scrape (summed over the page's series)."""

    requests: float | None  # request_prefill_time_seconds_count; None where not counted
    seconds: float  # request_prefill_time_seconds_sum
    prompt_tokens: float  # request_prompt_tokens_sum
    computed_tokens: float | None = None  # request_prefill_kv_computed_tokens_sum, when exported
    e2e_seconds: float | None = None  # e2e_request_latency_seconds_sum, when recorded at finish


@dataclass(frozen=True, slots=True)
class PrefillSample:
    """What the requests that finished in one interval say about the pod."""

    tokens_per_s: float
    uncached_fraction: float | None  # None without the computed-tokens histogram
    mean_prompt_tokens: float | None  # None where the engine counts no requests


def _sum(found: Mapping[str, list[Sample] | None], name: str) -> float | None:
    """Sum of a metric's series; None when absent, malformed or not a sane count."""
    samples = found.get(name)
    if not samples:
        return None
    total = 0.0
    for s in samples:
        if count_problem(s.value):
            return None
        total += s.value
    return total if total <= MAX_COUNT else None


def prefill_totals(found: Mapping[str, list[Sample] | None], dialect: str) -> PrefillTotals | None:
    """The totals of a scraped page's collected samples (`prefill_metric_names`); None when
    the dialect or the page does not carry the prefill time and prompt tokens (and, where the
    dialect counts them, requests)."""
    series = PREFILL_SERIES.get(dialect)
    if series is None:
        return None
    seconds = _sum(found, series.seconds)
    requests = _sum(found, series.requests) if series.requests else None
    computed = _sum(found, series.computed) if series.computed else None
    if series.prompt:
        prompt = _sum(found, series.prompt)
    else:
        cached = _sum(found, series.cached) if series.cached else None
        prompt = computed + cached if computed is not None and cached is not None else None
    if seconds is None or prompt is None or (series.requests and requests is None):
        return None
    e2e = _sum(found, series.e2e) if series.e2e else None
    return PrefillTotals(requests, seconds, prompt, computed, e2e)


def prefill_metric_names(dialect: str) -> tuple[str, ...]:
    """The series `prefill_totals` reads, to collect in the scrape's pass."""
    series = PREFILL_SERIES.get(dialect)
    return series.names() if series is not None else ()


class PrefillTracker:
    """One pod's previous totals; `sample` returns the interval's figures, if any."""

    def __init__(self, interval_s: float = PREFILL_READ_INTERVAL_S) -> None:
        self.interval_s = interval_s
        self._last: PrefillTotals | None = None
        self._last_at: float | None = None
        self._next_at = -math.inf

    def due(self, now: float) -> bool:
        """Whether the scrape at `now` should read the prefill series."""
        return now >= self._next_at

    def sample(self, totals: PrefillTotals | None, now: float = 0.0) -> PrefillSample | None:
        """The figures since the previous totals (read at `now`; the next read is due one
        interval later)."""
        self._next_at = now + self.interval_s
        if totals is None:
            return None
        previous, self._last = self._last, totals
        previous_at, self._last_at = self._last_at, now
        if previous is None:
            return None
        d_requests: float | None = None
        if totals.requests is not None and previous.requests is not None:
            d_requests = totals.requests - previous.requests
        d_seconds = totals.seconds - previous.seconds
        d_prompt = totals.prompt_tokens - previous.prompt_tokens
        d_computed: float | None = None
        if totals.computed_tokens is not None and previous.computed_tokens is not None:
            d_computed = totals.computed_tokens - previous.computed_tokens
        if (
            (d_requests is not None and d_requests < 0)
            or d_seconds < 0
            or d_prompt < 0
            or (d_computed is not None and d_computed < 0)
        ):
            return None  # the server restarted: its counters began again from zero
        if (d_requests is not None and d_requests <= 0) or d_seconds <= 0:
            return None  # nothing finished, or no measurable prefill time
        computed = d_computed if d_computed is not None else d_prompt
        if computed <= 0:
            return None  # every token cached: says nothing about the pace
        uncached = None
        if d_computed is not None and d_prompt > 0:
            uncached = min(1.0, d_computed / d_prompt)
        # Prefills that overlapped (a burst admitted together, chunks sharing steps) each count
        # their whole span: their seconds add up past the wall time they took, so the wall
        # time they ran in bounds them. Figures counted per step (llama.cpp) ran within the
        # interval; figures recorded as requests finish (vLLM) ran before their requests'
        # decodes, within the interval stretched back by a typical request's end-to-end time.
        # Bounded by the interval alone, a pod with long prompts and long answers read twice
        # its pace (six 8k-token prefills of 0.3 s finishing within 1 s: 49k tokens/s where
        # the GPU does 27k), and its prefills were priced as ending when half was done.
        if previous_at is not None and now > previous_at:
            wall = now - previous_at
            if totals.e2e_seconds is not None and previous.e2e_seconds is not None and d_requests:
                d_e2e = totals.e2e_seconds - previous.e2e_seconds
                if d_e2e > 0.0:
                    wall += d_e2e / d_requests
            if wall < d_seconds:
                d_seconds = wall
        mean = d_prompt / d_requests if d_requests is not None else None
        return PrefillSample(computed / d_seconds, uncached, mean)
