"""Realistic model-server /metrics pages, produced by prometheus_client itself.

Used by the parser tests and `bench/micro/parse_metrics_bench.py`: each page carries a dialect's
scheduling gauges (several label sets, awkward label values) buried among many histogram
and counter series, as a real vLLM page is (~38 KB with the defaults, the size of a real
vLLM page; `histogram_models` scales it).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)
TOKEN_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000)
# A model name with a quote, a comma, a backslash and braces: label parsing must survive it.
AWKWARD_MODEL = 'org/model "v2", {ft}\\x'


@dataclass(frozen=True)
class PageSpec:
    """The gauge values a generated page carries, per (model_name, engine) series."""

    waiting: tuple[float, ...] = (3.0, 1.0)
    running: tuple[float, ...] = (7.0, 2.0)
    kv: tuple[float, ...] = (0.42, 0.58)
    # (timestamp value, max_lora, running adapters, waiting adapters); newest must win
    lora: tuple[tuple[float, int, str, str], ...] = (
        (1_700_000_000.0, 4, "old-a", ""),
        (1_700_000_050.5, 4, "sql-lora,chat-lora", "math-lora"),
        (1_700_000_020.0, 4, "mid-a,mid-b", "mid-c"),
    )
    block_size: int = 16
    num_gpu_blocks: int = 28_000
    models: tuple[str, ...] = field(default=("meta-llama/Llama-3.1-8B-Instruct", AWKWARD_MODEL))
    histogram_models: int = 1  # model_name values per histogram family (x 2 engines)
    legacy_kv_name: bool = False  # old vLLM: vllm:gpu_cache_usage_perc


def _noise(registry: CollectorRegistry, prefix: str, spec: PageSpec, rng: random.Random) -> None:
    names = [f"model-{i}" for i in range(spec.histogram_models)]
    histograms = [
        ("time_to_first_token_seconds", LATENCY_BUCKETS),
        ("inter_token_latency_seconds", LATENCY_BUCKETS),
        ("e2e_request_latency_seconds", LATENCY_BUCKETS),
        ("request_queue_time_seconds", LATENCY_BUCKETS),
        ("request_prefill_time_seconds", LATENCY_BUCKETS),
        ("request_decode_time_seconds", LATENCY_BUCKETS),
        ("request_prompt_tokens", TOKEN_BUCKETS),
        ("request_generation_tokens", TOKEN_BUCKETS),
        ("request_params_max_tokens", TOKEN_BUCKETS),
        ("iteration_tokens_total", TOKEN_BUCKETS),
    ]
    for name, buckets in histograms:
        h = Histogram(f"{prefix}{name}", f"Histogram of {name}.", ["model_name", "engine"], buckets=buckets,
                      registry=registry)  # fmt: skip
        for m in names:
            for engine in ("0", "1"):
                child = h.labels(m, engine)
                for _ in range(5):
                    child.observe(rng.expovariate(1.0 / buckets[len(buckets) // 2]))
    for name in ("prompt_tokens", "generation_tokens", "num_preemptions", "prefix_cache_queries",
                 "prefix_cache_hits", "request_success"):  # fmt: skip
        c = Counter(f"{prefix}{name}", f"Counter {name}.", ["model_name", "engine"], registry=registry)
        for m in names:
            c.labels(m, "0").inc(rng.randrange(1, 10**6))


def _gauge(registry: CollectorRegistry, name: str, spec: PageSpec, values: tuple[float, ...]) -> None:
    g = Gauge(name, f"Gauge {name}.", ["model_name", "engine"], registry=registry)
    for i, value in enumerate(values):
        g.labels(spec.models[i % len(spec.models)], str(i)).set(value)


def vllm_page(spec: PageSpec = PageSpec(), seed: int = 0) -> bytes:
    registry = CollectorRegistry()
    rng = random.Random(seed)
    _noise(registry, "vllm:", spec, rng)
    _gauge(registry, "vllm:num_requests_waiting", spec, spec.waiting)
    _gauge(registry, "vllm:num_requests_running", spec, spec.running)
    kv_name = "vllm:gpu_cache_usage_perc" if spec.legacy_kv_name else "vllm:kv_cache_usage_perc"
    _gauge(registry, kv_name, spec, spec.kv)
    lora = Gauge("vllm:lora_requests_info", "Running stats on lora requests.",
                 ["max_lora", "running_lora_adapters", "waiting_lora_adapters"], registry=registry)  # fmt: skip
    for ts, max_lora, running, waiting in spec.lora:
        lora.labels(str(max_lora), running, waiting).set(ts)
    cache = Gauge("vllm:cache_config_info", "Information of the LLMEngine CacheConfig",
                  ["block_size", "cache_dtype", "num_gpu_blocks", "enable_prefix_caching"], registry=registry)  # fmt: skip
    cache.labels(str(spec.block_size), "auto", str(spec.num_gpu_blocks), "True").set(1)
    return generate_latest(registry)


def _per_rank_page(
    prefix: str, waiting: str, running: str, kv: str, spec: PageSpec, seed: int, extra: dict[str, float]
) -> bytes:
    """A page whose queue, batch and KV gauges have one series per rank (SGLang, TRT-LLM)."""
    registry = CollectorRegistry()
    _noise(registry, prefix, spec, random.Random(seed))
    _gauge(registry, prefix + waiting, spec, spec.waiting)
    _gauge(registry, prefix + running, spec, spec.running)
    _gauge(registry, prefix + kv, spec, spec.kv)
    for name, value in extra.items():
        _gauge(registry, prefix + name, spec, (value,))
    return generate_latest(registry)


def sglang_page(spec: PageSpec = PageSpec(), seed: int = 0) -> bytes:
    return _per_rank_page(
        "sglang:", "num_queue_reqs", "num_running_reqs", "token_usage", spec, seed, {"cache_hit_rate": 0.3}
    )


def tgi_page(spec: PageSpec = PageSpec(), seed: int = 0, max_tokens: float = 12_000) -> bytes:
    registry = CollectorRegistry()
    _noise(registry, "tgi_", spec, random.Random(seed))
    Gauge("tgi_queue_size", "Queue size", registry=registry).set(sum(spec.waiting))
    Gauge("tgi_batch_current_size", "Batch size", registry=registry).set(sum(spec.running))
    Gauge("tgi_batch_current_max_tokens", "Max tokens", registry=registry).set(max_tokens)
    return generate_latest(registry)


def trtllm_page(spec: PageSpec = PageSpec(), seed: int = 0) -> bytes:
    return _per_rank_page(
        "trtllm_", "num_requests_waiting", "num_requests_running", "kv_cache_utilization", spec, seed, {}
    )


PAGES = {"vllm": vllm_page, "sglang": sglang_page, "tgi": tgi_page, "trtllm": trtllm_page}
