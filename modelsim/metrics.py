"""Prometheus exposition of an engine's state under a model server's metric dialect.

``vllm`` uses vLLM V1's names and labels (``model_name``, ``engine``); ``sglang``, ``tgi`` and
``trtllm`` export the gauges routers read from those servers. One CollectorRegistry per pod.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.utils import floatToGoString

from modelsim.stats import EngineStats, Histogram

if TYPE_CHECKING:
    from modelsim.engine import Engine

DIALECTS = ("vllm", "sglang", "tgi", "trtllm")


def _hist(name: str, doc: str, labels: dict[str, str], h: Histogram) -> HistogramMetricFamily:
    fam = HistogramMetricFamily(name, doc, labels=list(labels))
    fam.add_metric(list(labels.values()), buckets=h.cumulative(), sum_value=h.sum)
    return fam


def _gauge(name: str, doc: str, labels: dict[str, str], value: float) -> GaugeMetricFamily:
    fam = GaugeMetricFamily(name, doc, labels=list(labels))
    fam.add_metric(list(labels.values()), value)
    return fam


def _counter(name: str, doc: str, labels: dict[str, str], value: float) -> CounterMetricFamily:
    fam = CounterMetricFamily(name, doc, labels=list(labels))
    fam.add_metric(list(labels.values()), value)
    return fam


class EngineCollector:
    """Reads the engine on every scrape; nothing is cached between scrapes.

    A data-parallel pod has several engines (ranks): vLLM labels each engine's samples with its
    rank (``engine="1"``) under one family per metric; a family without that label (the config
    info gauges) is rank 0's. Other dialects show rank 0."""

    def __init__(self, engines: Engine | Sequence[Engine], model_name: str, dialect: str) -> None:
        if dialect not in DIALECTS:
            raise ValueError(f"unknown dialect {dialect!r}; known: {', '.join(DIALECTS)}")
        self.engines = list(engines) if isinstance(engines, Sequence) else [engines]
        self.engine = self.engines[0]
        self.model_name = model_name
        self.dialect = dialect

    def collect(self) -> Iterator[Metric]:
        if self.dialect != "vllm" or len(self.engines) == 1:
            return getattr(self, f"_{self.dialect}")()
        merged: dict[str, Metric] = {}
        for rank, engine in enumerate(self.engines):
            for fam in self._vllm(engine, str(rank)):
                first = merged.setdefault(fam.name, fam)
                if first is not fam and any("engine" in sample.labels for sample in fam.samples):
                    first.samples.extend(fam.samples)
        return iter(merged.values())

    def _vllm(self, engine: Engine | None = None, rank: str = "0") -> Iterator[Metric]:
        e = engine or self.engine
        s = e.stats
        lab = {"model_name": self.model_name, "engine": rank}
        yield _gauge("vllm:num_requests_running", "Requests in model execution batches.", lab, len(e.running))
        yield _gauge("vllm:num_requests_waiting", "Requests waiting to be processed.", lab, len(e.waiting))
        yield _gauge(
            "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", lab, e.kv_usage()
        )
        lora = GaugeMetricFamily(
            "vllm:lora_requests_info",
            "Running stats on lora requests.",
            labels=["max_lora", "running_lora_adapters", "waiting_lora_adapters"],
        )
        lora.add_metric(
            [str(e.profile.max_loras), ",".join(e.running_adapters()), ",".join(e.waiting_adapters())],
            time.time(),
        )
        yield lora
        cache = {
            "block_size": str(e.block_size),
            "cache_dtype": "auto",
            "enable_prefix_caching": str(e.kv.enable_prefix_caching),
            "gpu_memory_utilization": "0.9",
            "num_cpu_blocks": "0",
            "num_gpu_blocks": str(e.kv.num_blocks),
        }
        yield _gauge("vllm:cache_config_info", "Information of the LLMEngine CacheConfig", cache, 1.0)
        yield _counter(
            "vllm:prefix_cache_queries", "Prefix cache queries, in tokens.", lab, s.prefix_cache_queries
        )
        yield _counter("vllm:prefix_cache_hits", "Prefix cache hits, in tokens.", lab, s.prefix_cache_hits)
        yield _counter("vllm:prompt_tokens", "Number of prefill tokens processed.", lab, s.prompt_tokens)
        yield _counter(
            "vllm:generation_tokens", "Number of generation tokens processed.", lab, s.generation_tokens
        )
        yield _counter("vllm:num_preemptions", "Cumulative number of preemptions.", lab, s.num_preemptions)
        success = CounterMetricFamily(
            "vllm:request_success",
            "Count of successfully processed requests.",
            labels=[*lab, "finished_reason"],
        )
        for reason in ("stop", "length", "abort"):
            success.add_metric([*lab.values(), reason], s.request_success.get(reason, 0))
        yield success
        yield _hist("vllm:time_to_first_token_seconds", "Histogram of time to first token.", lab, s.ttft)
        yield _hist("vllm:inter_token_latency_seconds", "Histogram of inter-token latency.", lab, s.itl)
        yield _hist("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency.", lab, s.e2e)
        yield _hist("vllm:request_queue_time_seconds", "Time spent in WAITING phase.", lab, s.queue_time)
        yield _hist(
            "vllm:request_prefill_time_seconds",
            "Histogram of time spent in PREFILL phase for request.",
            lab,
            s.prefill_time,
        )
        yield _hist(
            "vllm:request_prompt_tokens", "Number of prefill tokens processed.", lab, s.request_prompt_tokens
        )
        yield _hist(
            "vllm:request_prefill_kv_computed_tokens",
            "Histogram of new KV tokens computed during prefill (excluding cached tokens).",
            lab,
            s.prefill_computed_tokens,
        )
        if e.kv_connector:
            yield from self._vllm_kv_connector(s, lab)

    def _vllm_kv_connector(self, s: EngineStats, lab: dict[str, str]) -> Iterator[Metric]:
        """What a vLLM engine with the NIXL connector adds (prefill and decode pods)."""
        yield _counter(
            "vllm:external_prefix_cache_queries",
            "External prefix cache queries from KV connector cross-instance cache sharing, in terms of number of queried tokens.",
            lab,
            s.external_prefix_cache_queries,
        )
        yield _counter(
            "vllm:external_prefix_cache_hits",
            "External prefix cache hits from KV connector cross-instance cache sharing, in terms of number of cached tokens.",
            lab,
            s.external_prefix_cache_hits,
        )
        yield _hist(
            "vllm:nixl_xfer_time_seconds",
            "Histogram of transfer duration for NIXL KV Cache transfers.",
            lab,
            s.nixl_xfer_time,
        )
        yield _hist(
            "vllm:nixl_bytes_transferred",
            "Histogram of bytes transferred per NIXL KV Cache transfers.",
            lab,
            s.nixl_bytes,
        )
        yield _counter(
            "vllm:nixl_num_failed_transfers",
            "Number of failed NIXL KV Cache transfers.",
            lab,
            s.nixl_failed_transfers,
        )
        yield _counter(
            "vllm:nixl_num_kv_expired_reqs",
            "Number of requests that had their KV expire.",
            lab,
            s.nixl_expired_reqs,
        )

    def _sglang(self) -> Iterator[Metric]:
        e, s = self.engine, self.engine.stats
        lab = {"model_name": self.model_name}
        hit_rate = s.prefix_cache_hits / s.prefix_cache_queries if s.prefix_cache_queries else 0.0
        yield _gauge(
            "sglang:num_queue_reqs", "The number of requests in the waiting queue.", lab, len(e.waiting)
        )
        yield _gauge("sglang:num_running_reqs", "The number of running requests.", lab, len(e.running))
        yield _gauge("sglang:token_usage", "The token usage.", lab, e.kv_usage())
        yield _gauge("sglang:cache_hit_rate", "The prefix cache hit rate.", lab, hit_rate)
        yield _counter("sglang:prompt_tokens", "Number of prefill tokens processed.", lab, s.prompt_tokens)
        yield _counter("sglang:generation_tokens", "Number of generation tokens.", lab, s.generation_tokens)
        yield _hist("sglang:time_to_first_token_seconds", "Histogram of time to first token.", lab, s.ttft)

    def _tgi(self) -> Iterator[Metric]:
        e = self.engine
        max_tokens = sum(s.num_tokens for s in e.running)
        yield _gauge("tgi_queue_size", "Requests waiting in the queue.", {}, len(e.waiting))
        yield _gauge("tgi_batch_current_size", "Current batch size.", {}, len(e.running))
        yield _gauge("tgi_batch_current_max_tokens", "Tokens held by the current batch.", {}, max_tokens)

    def _trtllm(self) -> Iterator[Metric]:
        e = self.engine
        lab = {"model_name": self.model_name, "engine_type": "trtllm"}
        yield _gauge("trtllm_num_requests_waiting", "Requests waiting.", lab, len(e.waiting))
        yield _gauge("trtllm_num_requests_running", "Requests running.", lab, len(e.running))
        yield _gauge("trtllm_kv_cache_utilization", "KV cache utilization (0..1).", lab, e.kv_usage())


def make_registry(engines: Engine | Sequence[Engine], model_name: str, dialect: str) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(EngineCollector(engines, model_name, dialect))
    return registry


# Rendered label sets, `{a="x",b="y"}` by the sample's (name, value) pairs: one page repeats the
# same few dozen (a histogram's buckets), and adapter names make the set grow only slowly.
_LABEL_TEXT: dict[tuple[tuple[str, str], ...], str] = {}
_LABEL_TEXT_MAX = 4096
# prometheus_client's exposition types, by the family type (its OpenMetrics-to-text munging).
_TEXT_TYPE = {"info": "gauge", "stateset": "gauge", "gaugehistogram": "histogram", "unknown": "untyped"}


def _label_text(labels: dict[str, str]) -> str:
    key = tuple(labels.items())
    text = _LABEL_TEXT.get(key)
    if text is None:
        if len(_LABEL_TEXT) >= _LABEL_TEXT_MAX:
            _LABEL_TEXT.clear()
        inner = ",".join(
            '{}="{}"'.format(k, v.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\""))
            for k, v in sorted(labels.items())
        )
        text = _LABEL_TEXT[key] = f"{{{inner}}}" if inner else ""
    return text


def render(registry: CollectorRegistry) -> bytes:
    """The text exposition `prometheus_client.generate_latest` writes, byte for byte
    (tests/modelsim/test_modelsim_metrics.py), for this module's collectors: their names and
    label names are plain Prometheus names, and they have no timestamps or OpenMetrics-only
    samples. ~3x cheaper per page (its label escaping and name validation ran per sample); the
    simulated fleet renders every pod's page in one process, where a scraping router's cost
    slowed every engine's steps (a real pod renders in its own API server)."""
    out: list[str] = []
    for metric in registry.collect():
        name, kind = metric.name, metric.type
        if kind == "counter":
            name += "_total"
        elif kind == "info":
            name += "_info"
        doc = metric.documentation.replace("\\", r"\\").replace("\n", r"\n")
        out.append(f"# HELP {name} {doc}\n# TYPE {name} {_TEXT_TYPE.get(kind, kind)}\n")
        for sample in metric.samples:
            if sample.timestamp is not None or sample.name.endswith(("_created", "_gsum", "_gcount")):
                return generate_latest(registry)  # not written by this module: the library's way
            out.append(f"{sample.name}{_label_text(sample.labels)} {floatToGoString(sample.value)}\n")
    return "".join(out).encode("utf-8")
