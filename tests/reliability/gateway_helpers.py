"""Helpers for fault tests against a whole local gateway."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from typing import Any

import grpc
import httpx

from devstack.launch import LocalGateway

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
