"""Security fixtures: a local gateway with tight client limits (real Envoy, BBR, EPPs, pods)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from gateway.launch import LocalGateway, start_local_gateway
from tests.integration.conftest import FAST_FLEET

LLAMA, QWEN = "llama-3.1-8b-instruct", "qwen3-32b"
LLAMA_POOL = "llama-3-1-8b-instruct"
BODY_LIMIT = 512 * 1024
HEADERS_KB = 16
HEADERS_COUNT = 50


def tight_limits(config: dict[str, Any]) -> None:
    config["bbr"] = {"maxRequestBodyBytes": BODY_LIMIT}
    config["listener"] = {"maxRequestHeadersKb": HEADERS_KB, "maxHeadersCount": HEADERS_COUNT}


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalGateway]:
    gw = start_local_gateway(tmp_path_factory.mktemp("secgw"), fleet=FAST_FLEET, config_patch=tight_limits)
    try:
        yield gw
    finally:
        gw.stop()


def pool_inflight(gw: LocalGateway, pool: str, timeout_s: float = 5.0) -> list[int]:
    """The EPP's per-pod in-flight counts, once they are all 0 (or after the timeout)."""
    url = f"http://127.0.0.1:{gw.epp_metrics_ports[pool]}/debug/pool"
    deadline = time.monotonic() + timeout_s
    while True:
        counts = [e["inflight_requests"] for e in httpx.get(url, timeout=2).json()["endpoints"]]
        if not any(counts) or time.monotonic() > deadline:
            return counts
        time.sleep(0.05)
