"""Security fixtures: a local gateway with tight client limits (real Envoy, BBR, EPPs, pods),
on either pool kind, and a trap listener that records any request smuggled to it."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest

from devstack.launch import POOL_KINDS, LocalGateway, start_local_gateway
from gateway.config import ListenerConfig
from tests.integration.conftest import FAST_FLEET

LLAMA, QWEN = "llama-3.1-8b-instruct", "qwen3-32b"
LLAMA_POOL = "llama-3-1-8b-instruct"
BODY_LIMIT = 512 * 1024
# The default header limit, kept: it must refuse what the pods would (their own plain-text 400).
HEADERS_KB = ListenerConfig().max_request_headers_kb
HEADERS_COUNT = 50


def tight_limits(config: dict[str, Any]) -> None:
    config["bbr"] = {"maxRequestBodyBytes": BODY_LIMIT}
    config["listener"] = {"maxHeadersCount": HEADERS_COUNT}


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalGateway]:
    gw = start_local_gateway(tmp_path_factory.mktemp("secgw"), fleet=FAST_FLEET, config_patch=tight_limits)
    try:
        yield gw
    finally:
        gw.stop()


@pytest.fixture(scope="session")
def original_dst_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalGateway]:
    """The same gateway with its pools rendered as ORIGINAL_DST, the Kubernetes cluster kind."""
    gw = start_local_gateway(
        tmp_path_factory.mktemp("secgw-odst"),
        fleet=FAST_FLEET,
        config_patch=tight_limits,
        pool_kind="original_dst",
    )
    try:
        yield gw
    finally:
        gw.stop()


@pytest.fixture(scope="module", params=POOL_KINDS)
def kind_gateway(request: pytest.FixtureRequest) -> LocalGateway:
    """Each pool kind in turn: static (OverrideHost over the listed pods), ORIGINAL_DST."""
    name = "gateway" if request.param == "static" else "original_dst_gateway"
    gw: LocalGateway = request.getfixturevalue(name)
    assert gw.pool_kind == request.param
    return gw


class Trap:
    """A tiny HTTP server on loopback outside every pool: any request it sees is a leak."""

    def __init__(self) -> None:
        hits: list[str] = []

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self._record()

            def do_POST(self) -> None:
                self._record()

            def _record(self) -> None:
                hits.append(f"{self.command} {self.path} {dict(self.headers)}")
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("x-modelsim-pod", "trap")
                self.end_headers()
                self.wfile.write(b'{"trap": true}')

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.hits = hits
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.address = f"127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


@pytest.fixture
def trap() -> Iterator[Trap]:
    t = Trap()
    try:
        yield t
    finally:
        t.close()


def pool_inflight(gw: LocalGateway, pool: str, timeout_s: float = 5.0) -> list[int]:
    """The EPP's per-pod in-flight counts, once they are all 0 (or after the timeout)."""
    url = f"http://127.0.0.1:{gw.epp_metrics_ports[pool]}/debug/pool"
    deadline = time.monotonic() + timeout_s
    while True:
        counts = [e["inflight_requests"] for e in httpx.get(url, timeout=2).json()["endpoints"]]
        if not any(counts) or time.monotonic() > deadline:
            return counts
        time.sleep(0.05)
