"""Helpers for fault tests against a whole local gateway."""

from __future__ import annotations

import functools
import re
import time
from collections.abc import Callable
from typing import Any

import grpc
import httpx

from devstack.launch import LocalGateway
from tests.integration.conftest import chat

ADDRESS = re.compile(r"\[?[0-9a-f.:]+\]?:\d+")


def pod_fault(gw: LocalGateway, name: str, **knobs: Any) -> dict[str, Any]:
    address = next(p["address"] for p in gw.pods if p["name"] == name)
    return httpx.post(f"http://{address}/sim/fault", json=knobs, timeout=5).json()


def pod_address(gw: LocalGateway, name: str) -> str:
    return next(p["address"] for p in gw.pods if p["name"] == name)


def debug_pool(gw: LocalGateway, pool: str) -> dict[str, dict[str, Any]]:
    url = f"http://127.0.0.1:{gw.epp_metrics_ports[pool]}/debug/pool"
    return {e["address"]: e for e in httpx.get(url, timeout=2).json()["endpoints"]}


def wait_for(check: Callable[[], bool], timeout_s: float, what: str) -> float:
    """Seconds until `check()` held; AssertionError naming `what` after the timeout."""
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        try:
            if check():
                return time.monotonic() - started
        except (httpx.HTTPError, OSError, KeyError, grpc.RpcError):  # not up yet
            pass
        time.sleep(0.02)
    raise AssertionError(f"{what}: not within {timeout_s} s")


def ranked_addresses(decision_header: str) -> list[str]:
    """Addresses in the EPP's `x-gateway-decision` header, best first."""
    _, _, ranking = decision_header.partition(";")
    return [m.group(0) for part in ranking.split(",") if (m := ADDRESS.search(part))]


def metric_value(text: str, name: str, **labels: str) -> float:
    """Sum of the samples of one Prometheus metric whose labels include `labels`."""
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name):
            continue
        head, _, value = line.rpartition(" ")
        if all(f'{k}="{v}"' in head for k, v in labels.items()):
            total += float(value)
    return total


def rejected_reloads(metrics_url: str) -> float:
    text = httpx.get(metrics_url, timeout=2).text
    return metric_value(text, "gateway_config_reloads_total", result="rejected")


async def charged_where_served(
    gw: LocalGateway, pool: str, model: str, failing: str, headers: dict[str, str]
) -> str:
    """Stream long answers until the EPP ranks `failing` (a pod that fails before the response
    starts) first; mid-stream, the pod that serves holds the request's in-flight slot and
    `failing` none, and the slot is returned once the answer ends. Returns the pod that served.

    A long answer (~0.7 s of wall time at time_scale 20), so that Envoy, which reads the
    upstream without waiting for this client, is still streaming it when the pool is read."""
    by_pod = {p["name"]: p["address"] for p in gw.pods}
    body = chat(model, stream=True, max_tokens=2000)
    async with gw.client() as client:
        for _ in range(30):  # the EPP ranks `failing` first only some of the time
            asked = {"x-gateway-decision": "true", **headers}
            async with client.stream("POST", "/v1/chat/completions", json=body, headers=asked) as r:
                assert r.status_code == 200
                if ranked_addresses(r.headers["x-gateway-decision"])[0] != failing:
                    continue
                served = by_pod[r.headers["x-modelsim-pod"]]
                chunks = r.aiter_bytes()
                await anext(chunks)  # mid-stream: the slot is on the serving pod
                now = debug_pool(gw, pool)
                assert now[failing]["inflight_requests"] == 0, now[failing]
                assert now[served]["inflight_requests"] == 1, now[served]
                async for _ in chunks:
                    pass
            wait_for(functools.partial(_idle, gw, pool, served), 10, "slot returned")
            return served
    raise AssertionError(f"the EPP never ranked {failing} first in 30 requests")


def _idle(gw: LocalGateway, pool: str, address: str) -> bool:
    return bool(debug_pool(gw, pool)[address]["inflight_requests"] == 0)
