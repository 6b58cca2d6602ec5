"""Metric names and labels per dialect, parsed the way a Prometheus scraper would."""

from __future__ import annotations

import httpx
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from modelsim import metrics as metrics_module
from modelsim.fleet import Fleet


async def scrape(fleet: Fleet, pod: str) -> dict[str, list]:
    async with httpx.AsyncClient(base_url=fleet.pod(pod).url) as c:
        r = await c.get("/metrics")
    assert r.status_code == 200
    return {f.name: f.samples for f in text_string_to_metric_families(r.text)}


async def test_vllm_names_labels_and_counters_move(fleet: Fleet) -> None:
    async with httpx.AsyncClient(base_url=fleet.pod("llama-0").url) as c:
        body = {"model": "llama-sql", "prompt": "count the tables " * 20, "max_tokens": 4}
        assert (await c.post("/v1/completions", json=body)).status_code == 200
    fams = await scrape(fleet, "llama-0")
    for gauge in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"):
        (sample,) = fams[gauge]
        assert sample.labels == {"model_name": "llama", "engine": "0"}
    # The parser strips _total from counter family names; the wire carries it.
    for counter in ("vllm:prefix_cache_queries", "vllm:prefix_cache_hits", "vllm:prompt_tokens",
                    "vllm:generation_tokens", "vllm:num_preemptions", "vllm:request_success"):  # fmt: skip
        assert all(s.name == counter + "_total" for s in fams[counter])
    gen = fams["vllm:generation_tokens"][0].value
    assert gen == 4
    success = {s.labels["finished_reason"]: s.value for s in fams["vllm:request_success"]}
    assert success["length"] == 1
    for hist in ("vllm:time_to_first_token_seconds", "vllm:inter_token_latency_seconds",
                 "vllm:e2e_request_latency_seconds", "vllm:request_queue_time_seconds"):  # fmt: skip
        count = next(s.value for s in fams[hist] if s.name == hist + "_count")
        assert count >= 1

    # vLLM V1's per-request histograms, observed at finish: one request of N prompt tokens,
    # none cached on a fresh pod, that took some prefill time.
    def total(name: str, suffix: str) -> float:
        return next(s.value for s in fams[name] if s.name == name + suffix)

    prompt = total("vllm:request_prompt_tokens", "_sum")
    assert total("vllm:request_prompt_tokens", "_count") == 1 and prompt > 20
    assert total("vllm:request_prefill_kv_computed_tokens", "_sum") == prompt
    assert total("vllm:request_prefill_time_seconds", "_count") == 1
    assert total("vllm:request_prefill_time_seconds", "_sum") > 0
    (lora,) = fams["vllm:lora_requests_info"]
    assert set(lora.labels) == {"max_lora", "running_lora_adapters", "waiting_lora_adapters"}
    assert lora.value > 1e9  # a unix timestamp, as vLLM exports it
    (cache,) = fams["vllm:cache_config_info"]
    assert cache.labels["block_size"] == "16" and cache.labels["num_gpu_blocks"] == "28000"


async def test_other_dialects_export_their_names(fleet: Fleet) -> None:
    sglang = await scrape(fleet, "qwen")
    assert {"sglang:num_queue_reqs", "sglang:num_running_reqs", "sglang:token_usage",
            "sglang:cache_hit_rate"} <= set(sglang)  # fmt: skip
    assert not any(n.startswith("vllm:") for n in sglang)
    tgi = await scrape(fleet, "tgi")
    assert {"tgi_queue_size", "tgi_batch_current_size", "tgi_batch_current_max_tokens"} <= set(tgi)
    trt = await scrape(fleet, "trt")
    assert {
        "trtllm_num_requests_waiting",
        "trtllm_num_requests_running",
        "trtllm_kv_cache_utilization",
    } <= set(trt)


async def test_repeated_long_prompt_hits_prefix_cache_over_http(fleet: Fleet) -> None:
    pod = fleet.pod("llama-0")
    body = {"model": "llama", "prompt": "You are a careful assistant for invoices. " * 150, "max_tokens": 1}
    async with httpx.AsyncClient(base_url=pod.url) as c:
        first = (await c.post("/v1/completions", json=body)).json()["usage"]
        second = (await c.post("/v1/completions", json=body)).json()["usage"]
    assert first["prompt_tokens_details"]["cached_tokens"] == 0
    assert second["prompt_tokens_details"]["cached_tokens"] == (second["prompt_tokens"] - 1) // 16 * 16
    fams = await scrape(fleet, "llama-0")
    assert fams["vllm:prefix_cache_hits"][0].value == second["prompt_tokens_details"]["cached_tokens"]
    assert fams["vllm:prefix_cache_queries"][0].value == 2 * second["prompt_tokens"]
    ttft = {
        s.labels["le"]: s.value
        for s in fams["vllm:time_to_first_token_seconds"]
        if s.name.endswith("_bucket")
    }
    # Cold: ~2.4k tokens of prefill (~65 ms); warm: one decode-sized step (~6.5 ms). A loaded
    # machine only adds time, so the checks are lower bounds: the cold one is never in the
    # 10 ms bucket, and the two together took at least the cold prefill.
    ttft_sum = next(s.value for s in fams["vllm:time_to_first_token_seconds"] if s.name.endswith("_sum"))
    assert ttft["+Inf"] == 2 and ttft["0.01"] <= 1
    assert ttft_sum >= 0.05  # the cold prefill alone is ~65 ms of simulated time


async def test_the_fast_page_is_byte_for_byte_the_librarys(
    fleet: Fleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    """modelsim writes its pages itself (the library's per-sample escaping made a scraping
    router slow every simulated engine); the bytes must stay prometheus_client's, every dialect,
    with counters and histograms that moved, adapter names that need escaping, and an empty page."""
    monkeypatch.setattr(metrics_module.time, "time", lambda: 1_700_000_000.25)  # lora_requests_info
    async with httpx.AsyncClient(base_url=fleet.pod("llama-0").url) as c:
        body = {"model": "llama-sql", "prompt": "count the tables " * 20, "max_tokens": 4}
        assert (await c.post("/v1/completions", json=body)).status_code == 200
    for pod in fleet.pods:
        registry = pod._pod.registry
        assert metrics_module.render(registry) == generate_latest(registry), pod.name
    llama = fleet.pod("llama-0")._pod
    engine = llama.engine
    monkeypatch.setattr(engine, "running_adapters", lambda: ['a"b', "c\\d", "e\nf"])
    assert metrics_module.render(llama.registry) == generate_latest(llama.registry)
    empty = CollectorRegistry(auto_describe=False)
    assert metrics_module.render(empty) == generate_latest(empty) == b""
