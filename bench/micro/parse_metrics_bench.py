"""Microbenchmark: epp.datalayer.metric_dialects.parse_metrics vs prometheus_client's parser on realistic pages.

    python -m bench.micro.parse_metrics_bench [--repeat N]

Prints microseconds per parse for generated vLLM pages of several sizes (see
bench/micro/metric_pages.py); the reference does what a scraper using prometheus_client would:
parse every family, then pick the few series it needs.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

from prometheus_client.parser import text_string_to_metric_families

from bench.micro.metric_pages import PageSpec, vllm_page
from epp.datalayer.metric_dialects import parse_metrics

WANTED = {
    "vllm:num_requests_waiting",
    "vllm:num_requests_running",
    "vllm:kv_cache_usage_perc",
    "vllm:lora_requests_info",
    "vllm:cache_config_info",
}


def _reference(page: bytes) -> dict[str, float]:
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(page.decode()):
        if family.name in WANTED:
            out[family.name] = sum(s.value for s in family.samples)
    return out


def per_call_us(fn: Callable[[], object], repeat: int) -> float:
    """Best of 5 rounds of `repeat` calls: the least-disturbed figure on a shared machine."""
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(repeat):
            fn()
        best = min(best, (time.perf_counter() - start) / repeat)
    return best * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=200)
    args = parser.parse_args()
    print(
        f"{'page':>22} {'bytes':>8} {'lines':>6} {'parse_metrics us':>17} {'prometheus_client us':>21} {'speedup':>8}"
    )
    for models in (1, 2, 4):
        page = vllm_page(PageSpec(histogram_models=models))
        text = page.decode()
        ours = per_call_us(lambda p=page: parse_metrics(p, "vllm", 0.0), args.repeat)
        ours_str = per_call_us(lambda t=text: parse_metrics(t, "vllm", 0.0), args.repeat)
        ref = per_call_us(lambda p=page: _reference(p), max(5, args.repeat // 20))
        label = f"vllm x{models * 2} series"
        lines = text.count("\n")
        print(f"{label:>22} {len(page):>8} {lines:>6} {ours:>17.1f} {ref:>21.0f} {ref / ours:>7.0f}x")
        print(f"{'(str input)':>22} {'':>8} {'':>6} {ours_str:>17.1f}")


if __name__ == "__main__":
    main()
