"""The EPP's HTTP side port: Prometheus `/metrics`, `/debug/pool` JSON, `/healthz`."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from aiohttp import web
from prometheus_client import REGISTRY, generate_latest

from epp.datalayer.adapter_residency import AdapterResidency
from epp.datalayer.endpoint_records import PoolSnapshot
from epp.datalayer.kv_index import KVIndex
from epp.datalayer.pool import Pool
from epp.datalayer.tokenizer import PoolTokenizers
from epp.requestcontrol.telemetry import Telemetry
from gateway.admin_http import start_admin_http

if TYPE_CHECKING:
    from epp.app import EppApp


def adapters_resident(pool: Pool, residency: AdapterResidency) -> dict[str, list[str]]:
    """Per pod: the modelled GPU adapter set (epp/datalayer/adapter_residency.py), most recent first,
    for the capacity its last scrape reported (empty while unknown)."""
    out = {}
    for ep in pool.endpoints():
        metrics = pool.metrics(ep.address)
        max_lora = metrics.max_lora if metrics is not None else 0
        out[ep.address] = residency.adapters(ep.address, max_lora)
    return out


def prefix_scoring(pool: Pool, tokenizers: PoolTokenizers, kv_index: KVIndex) -> dict[str, dict[str, str]]:
    """Per pod and model: "precise" (precise-prefix-cache reads the pod's KV events) or
    "approximate: <why>" (it falls back to the routing-history prefix index)."""
    out: dict[str, dict[str, str]] = {}
    for ep in pool.endpoints():
        modes = {}
        for model in sorted(ep.models):
            if tokenizers.get(model) is None:
                why: str | None = "no tokenizer for the model"
            else:
                why = kv_index.not_precise_reason(ep.address, model)
            modes[model] = "precise" if why is None else f"approximate: {why}"
        out[ep.address] = modes
    return out


def pool_debug(app: EppApp) -> dict[str, Any]:
    """What /debug/pool shows beside the pool's records: the policy in force, the feeds' state,
    the flow-control queue, the modelled adapters, the workers, the shared state."""
    config = app.store.current()
    extra: dict[str, Any] = {
        # The scheduling policy in force: every profile (configured over the built-ins) with
        # its weights, picker, priority and resolved thresholds, and which one is the default.
        "default_profile": config.default_profile,
        "profiles": {name: p.to_dict() for name, p in config.scheduler_profiles().items()},
        "kv_events": app.kv_events.debug(),
        "tokenizers": app.tokenizers.debug(),
        "prefix_scoring": prefix_scoring(app.pool, app.tokenizers, app.kv_index),
        "flow_queue": len(app.flow.queue),
        "adapters_resident": adapters_resident(app.pool, app.scheduler.residency),
    }
    if app.workers_debug is not None:
        extra["workers"] = app.workers_debug()
    if app.shared_state is not None:
        extra["shared_state"] = app.shared_state.debug()
        extra["local_inflight"] = {pod: list(c) for pod, c in app.pool.local_inflight().items()}
    return extra


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


def pool_json(snapshot: PoolSnapshot) -> dict[str, Any]:
    endpoints = []
    for s in snapshot.endpoints:
        metrics = dataclasses.asdict(s.metrics) if s.metrics else None
        if metrics:
            metrics["running_adapters"] = sorted(metrics["running_adapters"])
            metrics["waiting_adapters"] = sorted(metrics["waiting_adapters"])
        endpoints.append(
            {
                "address": s.address,
                "name": s.endpoint.name,
                "models": sorted(s.endpoint.models),
                "adapters": sorted(s.endpoint.adapters),
                "engine": s.endpoint.engine,
                "healthy": s.healthy,
                "metrics_age_s": _finite(s.metrics_age),
                "metrics": metrics,
                "inflight_requests": s.inflight_requests,
                "inflight_tokens": s.inflight_tokens,
                "queue": s.queue,
                "backlog": s.backlog,
                "finished_since_scrape": s.finished_since_scrape,
                "routed_since_scrape": s.routed_since_scrape,
                "ttft_ewma_s": s.ttft_ewma,
                "tpot_ewma_s": s.tpot_ewma,
                "prefill_tps": s.prefill_tps,
                "uncached_fraction": s.uncached_fraction,
                "mean_prompt_tokens": s.mean_prompt_tokens,
            }
        )
    return {"endpoints": endpoints}


async def start_admin_server(
    host: str,
    port: int,
    telemetry: Telemetry,
    snapshot: Callable[[], PoolSnapshot],
    extra: Callable[[], dict] | None = None,
) -> tuple[web.AppRunner, int]:
    def debug_pool() -> dict[str, Any]:
        data = pool_json(snapshot())
        if extra:
            data.update(extra())
        return data

    return await start_admin_http(
        host,
        port,
        metrics=lambda: generate_latest(telemetry.registry) + generate_latest(REGISTRY),
        views={"/debug/pool": debug_pool},
    )
