"""A scenario fleet of real engines: llama.cpp's llama-server processes instead of modelsim pods.

A scenario says `fleet: {engine: llama.cpp, pods: [{threads: 1, replicas: 2}, ...]}` (fields:
`LLAMA_POD_KEYS`); `bench run` then starts fresh llama-server processes for every policy and seed
(as it starts a fresh simulated fleet: pods kept from the previous policy would still hold its
prompts in their caches) with devstack/llamacpp/server.py, on the tiny model `make llama-server`
built. The engines tokenize with the model's tokenizer, the shipped one
(modelsim/tokenizer_files/sim-llama3-12k), so a run counts as on the tokenizing fleet (`+tok`).

The summary of each run records the engine (`engine_record`) and the engine's own counters per
pod (`engine_counters`: llama-server's `/metrics`), read after the run: prompt tokens computed
and taken from the prompt cache, tokens generated. The processes start fresh, so the counters
cover exactly the run (warm-up and drain included).
"""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from devstack.llamacpp.build import read_build_info
from devstack.llamacpp.model import MODEL_NAME
from devstack.llamacpp.server import ServerSpec, engine_version, missing_engine, start_llama_servers

ENGINE = "llama.cpp"
LLAMA_POD_KEYS: dict[str, type] = {
    "name": str,
    "threads": int,
    "parallel": int,
    "ctx_per_slot": int,
    "cache_ram_mib": int,
    "replicas": int,
}
# llama-server's counters (`llamacpp:` prefix) a summary keeps, by their short name.
COUNTERS = (
    "prompt_tokens_total",
    "prompt_tokens_cached_total",
    "prompt_seconds_total",  # wall seconds of prefill steps: the run's own prefill cost per token
    "tokens_predicted_total",
    "tokens_predicted_seconds_total",
    "n_decode_total",
)


def is_llama_fleet(fleet: Mapping[str, Any]) -> bool:
    return fleet.get("engine") == ENGINE


def server_specs(fleet: Mapping[str, Any]) -> list[ServerSpec]:
    """One ServerSpec per process, `replicas` expanded."""
    specs = []
    for pod in fleet["pods"]:
        spec = ServerSpec(
            threads=int(pod.get("threads", 1)),
            parallel=int(pod.get("parallel", 2)),
            ctx_per_slot=int(pod.get("ctx_per_slot", 4096)),
            cache_ram_mib=pod.get("cache_ram_mib"),
        )
        specs.extend([spec] * int(pod.get("replicas", 1)))
    return specs


def check_llama_pod(pod: dict[str, Any]) -> dict[str, Any]:
    """A validated pod entry gets the model the engines serve (the tiny model's name)."""
    return {**pod, "model": MODEL_NAME, "replicas": pod.get("replicas", 1)}


class EngineUnavailable(RuntimeError):
    """llama-server is not built here (the message names `make llama-server`)."""


@contextlib.asynccontextmanager
async def running_llama_fleet(fleet: Mapping[str, Any]) -> AsyncIterator[list[dict[str, Any]]]:
    """Start the fleet's llama-server processes; yield their pod entries (address, threads)."""
    why = missing_engine()
    if why:
        raise EngineUnavailable(why)
    with tempfile.TemporaryDirectory(prefix="bench-llama-") as tmp:
        procs, pods = await asyncio.to_thread(start_llama_servers, Path(tmp), server_specs(fleet))
        try:
            yield pods
        finally:
            for proc in procs.values():
                await asyncio.to_thread(proc.stop)


def engine_record() -> dict[str, Any]:
    """The engine as every summary of a run on it records it."""
    info = read_build_info() or {}
    return {
        "name": ENGINE,
        "version": engine_version(),
        "llama_cpp_commit": info.get("llama_cpp_commit"),
        "sdist": info.get("sdist"),
        "server_version": info.get("engine_version"),
    }


def parse_counters(page: str) -> dict[str, float]:
    """The COUNTERS from one llama-server /metrics page (absent ones left out). On a vLLM-dialect
    page (modelsim's, for the twin scenarios) the same two prompt figures from its prefix-cache
    counters: hits are cached tokens, queries less hits computed ones."""
    out: dict[str, float] = {}
    vllm: dict[str, float] = {}
    for family in text_string_to_metric_families(page):
        for sample in family.samples:
            name = sample.name.removeprefix("llamacpp:")
            if name in COUNTERS:
                out[name] = float(sample.value)
            elif sample.name in ("vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total"):
                vllm[sample.name] = vllm.get(sample.name, 0.0) + float(sample.value)
    if not out and len(vllm) == 2:
        hits = vllm["vllm:prefix_cache_hits_total"]
        out = {
            "prompt_tokens_total": vllm["vllm:prefix_cache_queries_total"] - hits,
            "prompt_tokens_cached_total": hits,
        }
    return out


async def engine_counters(urls: Sequence[str]) -> dict[str, Any] | None:
    """Each pod's counters and the fleet's prompt-cache hit share (cached / (cached + computed)
    prompt tokens); None when a page cannot be read or has neither llama-server's counters nor
    vLLM's prefix-cache ones."""
    pods: dict[str, dict[str, float]] = {}
    try:
        async with httpx.AsyncClient(timeout=5) as client:
            for url in urls:
                reply = await client.get(url.rstrip("/") + "/metrics")
                reply.raise_for_status()
                pods[url.split("://", 1)[-1]] = parse_counters(reply.text)
    except (httpx.HTTPError, ValueError):
        return None
    if not pods or not all("prompt_tokens_total" in c for c in pods.values()):
        return None
    return {"pods": pods, **cache_share(pods.values())}


def cache_share(pods: Any) -> dict[str, Any]:
    """Prompt tokens computed and from the cache, summed over pods, and the cached share."""
    computed = sum(c.get("prompt_tokens_total", 0.0) for c in pods)
    cached = sum(c.get("prompt_tokens_cached_total", 0.0) for c in pods)
    total = computed + cached
    return {
        "prompt_tokens_computed": computed,
        "prompt_tokens_cached": cached,
        "prompt_cache_hit_share": cached / total if total else None,
    }
