"""Run the real BBR and EPP servicers on real gRPC ports in a background event loop.

Fuzz tests drive them with a synchronous gRPC client from hypothesis (which has no asyncio
support), so the servers live on their own loop in a daemon thread.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from bbr.router import BodyRouter
from bbr.service import BbrProcessor
from epp.app import build_scheduler
from epp.datalayer.discovery.static import static_endpoints
from epp.datalayer.pool import Pool
from epp.requestcontrol.context import EppContext
from epp.requestcontrol.processor import EppProcessor
from epp.requestcontrol.telemetry import Telemetry
from extproc.server import GrpcService, start_grpc_service
from extproc.stream import ExtProcServicer
from gateway.config import GatewayConfig, parse_config

T = TypeVar("T")

POOL = "llama"
MODEL = "llama-3.1-8b-instruct"
OTHER_MODEL = "qwen3-32b"
MAX_BODY = 4096  # small, so fuzzed bodies cross it often

CONFIG: dict[str, Any] = {
    "bbr": {"maxRequestBodyBytes": MAX_BODY},
    "pools": [
        {
            "name": POOL,
            "models": [{"name": MODEL, "adapters": ["sql-lora"]}],
            "endpoints": [{"address": "127.0.0.1:1"}, {"address": "127.0.0.1:2"}],
            "fallbackEndpoints": 1,
        },
        {"name": "qwen", "models": [{"name": OTHER_MODEL}], "endpoints": [{"address": "127.0.0.1:3"}]},
    ],
}


class LoopThread:
    """An asyncio loop in a daemon thread; `run` executes a coroutine there and waits."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout_s: float = 10.0) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout_s)

    def call(self, fn: Callable[[], T]) -> T:
        async def wrapped() -> T:
            return fn()

        return self.run(wrapped())

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5)


@dataclass
class Services:
    """Both servicers, their ports, and the EPP's pool (for in-flight checks)."""

    loop: LoopThread
    config: GatewayConfig
    bbr: ExtProcServicer
    epp: ExtProcServicer
    pool: Pool
    bbr_service: GrpcService
    epp_service: GrpcService

    def port(self, which: str) -> int:
        return self.bbr_service.port if which == "bbr" else self.epp_service.port

    def servicer(self, which: str) -> ExtProcServicer:
        return self.bbr if which == "bbr" else self.epp

    def stop(self) -> None:
        self.loop.run(self.bbr_service.server.stop(0))
        self.loop.run(self.epp_service.server.stop(0))
        self.loop.stop()


def start_services() -> Services:
    loop = LoopThread()
    config = parse_config(CONFIG)
    pool = Pool(static_endpoints(config, POOL))
    ctx = EppContext(POOL, pool, build_scheduler(config), lambda: config, Telemetry(POOL))
    ctx.fallback_endpoints = 1
    bbr = ExtProcServicer(lambda: BbrProcessor(BodyRouter(lambda: config), lambda: config), name="bbr")
    epp = ExtProcServicer(lambda: EppProcessor(ctx), name="epp")
    bbr_service = loop.run(start_grpc_service(bbr, host="127.0.0.1", port=0))
    epp_service = loop.run(start_grpc_service(epp, host="127.0.0.1", port=0))
    return Services(loop, config, bbr, epp, pool, bbr_service, epp_service)


def exchange(
    port: int,
    messages: list[pb.ProcessingRequest],
    *,
    cancel_after: int | None = None,
    timeout_s: float = 30.0,  # a hang guard, generous for a loaded machine
) -> tuple[list[pb.ProcessingResponse], grpc.StatusCode]:
    """Send `messages` on one stream; collect responses and the final status.

    `cancel_after` responses, the client cancels the call (an early close by Envoy).
    """
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = pb_grpc.ExternalProcessorStub(channel)
        call = stub.Process(iter(messages), timeout=timeout_s)
        responses: list[pb.ProcessingResponse] = []
        try:
            for response in call:
                responses.append(response)
                if cancel_after is not None and len(responses) >= cancel_after:
                    call.cancel()
                    break
        except grpc.RpcError as exc:
            return responses, exc.code()
        if cancel_after is not None and len(responses) >= cancel_after:
            return responses, grpc.StatusCode.CANCELLED
        return responses, call.code()


def health_status(port: int) -> int:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=""), timeout=2
        )
        return int(reply.status)


SERVING = int(health_pb2.HealthCheckResponse.SERVING)
