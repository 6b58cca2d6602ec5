"""The EPP's HTTP side port: Prometheus `/metrics`, `/debug/pool` JSON, `/healthz`."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

from aiohttp import web
from prometheus_client import REGISTRY, generate_latest

from epp.datalayer.endpoint_records import PoolSnapshot
from epp.requestcontrol.telemetry import Telemetry
from gateway.admin_http import start_admin_http


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
