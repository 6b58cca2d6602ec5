"""Counters and histograms an engine keeps, in simulated seconds, exported by ``metrics``."""

from __future__ import annotations

import bisect
from collections import Counter
from dataclasses import dataclass, field

# Bucket bounds as vLLM publishes them for these histograms.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)  # fmt: skip
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
               40.0, 80.0)  # fmt: skip
REQUEST_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
                   240.0, 480.0, 960.0, 1920.0, 7680.0)  # fmt: skip

NIXL_XFER_BUCKETS = (0.001, 0.005, 0.0125, 0.025, 0.05, 0.075, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 5.0)
NIXL_BYTES_BUCKETS = tuple(float(2**k) for k in range(20, 36, 2))  # 1 MiB .. 32 GiB


def buckets_1_2_5(max_value: int) -> tuple[float, ...]:
    """1, 2, 5, 10, 20, 50, ... up to `max_value`: vLLM's bounds for its per-request token
    histograms (`vllm:request_prompt_tokens`, `vllm:request_prefill_kv_computed_tokens`)."""
    out: list[float] = []
    scale = 1
    while True:
        for mantissa in (1, 2, 5):
            if mantissa * scale > max_value:
                return tuple(out)
            out.append(float(mantissa * scale))
        scale *= 10


class Histogram:
    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value
        self.count += 1

    def cumulative(self) -> list[tuple[str, float]]:
        out, acc = [], 0
        for bound, n in zip((*self.bounds, float("inf")), self.counts, strict=True):
            acc += n
            out.append(("+Inf" if bound == float("inf") else repr(float(bound)), float(acc)))
        return out


@dataclass
class EngineStats:
    prompt_tokens: int = 0
    generation_tokens: int = 0
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    # Prompt tokens a KV connector offered / supplied (vLLM's external prefix cache counters).
    external_prefix_cache_queries: int = 0
    external_prefix_cache_hits: int = 0
    # The decode side's KV reads (vLLM's NIXL connector metrics).
    nixl_xfer_time: Histogram = field(default_factory=lambda: Histogram(NIXL_XFER_BUCKETS))
    nixl_bytes: Histogram = field(default_factory=lambda: Histogram(NIXL_BYTES_BUCKETS))
    nixl_failed_transfers: int = 0
    nixl_expired_reqs: int = 0  # the prefill side: held KV nobody read in time
    num_preemptions: int = 0
    request_success: Counter[str] = field(default_factory=Counter)
    steps: int = 0
    ttft: Histogram = field(default_factory=lambda: Histogram(TTFT_BUCKETS))
    itl: Histogram = field(default_factory=lambda: Histogram(ITL_BUCKETS))
    e2e: Histogram = field(default_factory=lambda: Histogram(REQUEST_BUCKETS))
    queue_time: Histogram = field(default_factory=lambda: Histogram(REQUEST_BUCKETS))
    # Observed when a request finishes, as vLLM V1 does: its prefill time (first scheduled to
    # first token), its prompt tokens, and the prompt tokens it computed (not cached).
    prefill_time: Histogram = field(default_factory=lambda: Histogram(REQUEST_BUCKETS))
    max_model_len: int = 131072  # bounds of the token histograms below (set by the engine)
    request_prompt_tokens: Histogram = field(init=False)
    prefill_computed_tokens: Histogram = field(init=False)

    def __post_init__(self) -> None:
        bounds = buckets_1_2_5(self.max_model_len)
        self.request_prompt_tokens = Histogram(bounds)
        self.prefill_computed_tokens = Histogram(bounds)

    def finished(self, prompt_tokens: int, cached_tokens: int, prefill_s: float | None) -> None:
        """A request finished: the per-request histograms vLLM records at that moment."""
        self.request_prompt_tokens.observe(prompt_tokens)
        self.prefill_computed_tokens.observe(max(0, prompt_tokens - cached_tokens))
        if prefill_s is not None:
            self.prefill_time.observe(max(0.0, prefill_s))
