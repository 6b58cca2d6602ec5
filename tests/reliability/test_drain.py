"""SIGTERM drains the EPP: a request in flight finishes, new ones get a clean JSON error."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Iterator

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from gateway.launch import LocalGateway, start_local_gateway
from tests.integration.conftest import FAST_FLEET, chat
from tests.reliability.conftest import record_figures
from tests.reliability.gateway_helpers import debug_pool, pod_fault, wait_for

LLAMA, POOL = "llama-3.1-8b-instruct", "llama-3-1-8b-instruct"


def epp_serving(port: int) -> bool:
    """The EPP's gRPC health; a refused connection (already stopped) is not serving either."""
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=2)
        except grpc.RpcError:
            return False
    return reply.status == health_pb2.HealthCheckResponse.SERVING


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalGateway]:
    gateway = start_local_gateway(tmp_path_factory.mktemp("drain"), fleet=FAST_FLEET)
    try:
        yield gateway
    finally:
        gateway.stop()


async def test_sigterm_lets_the_in_flight_request_finish(gw: LocalGateway) -> None:
    for name in ("llama-0", "llama-1"):
        pod_fault(gw, name, stall_s=60.0)  # 3 s wall at time_scale 20, within the 5 s drain grace
    epp = gw.procs[f"epp-{POOL}"].popen
    async with gw.client() as client:
        in_flight = asyncio.create_task(client.post("/v1/chat/completions", json=chat(LLAMA)))
        # The request has been routed and is held by a stalled pod ...
        await asyncio.to_thread(
            wait_for,
            lambda: any(e["inflight_requests"] >= 1 for e in debug_pool(gw, POOL).values()),
            30, "request in flight",
        )  # fmt: skip
        epp.send_signal(signal.SIGTERM)
        assert not in_flight.done()  # the drain below is tested on a request still running
        # ... and the EPP has begun draining (its gRPC health says NOT_SERVING).
        await asyncio.to_thread(wait_for, lambda: not epp_serving(gw.epp_ports[POOL]), 30, "EPP draining")
        late = await client.post("/v1/chat/completions", json=chat(LLAMA))
        first = await in_flight
    for name in ("llama-0", "llama-1"):
        pod_fault(gw, name, stall_s=0.0)
    assert first.status_code == 200, first.text  # drained, not cut
    assert late.status_code == 503 and late.json()["error"]["type"] == "server_error"
    exited = wait_for(lambda: epp.poll() is not None, 10, "EPP exits after the drain")
    record_figures(
        "sigterm_drain",
        {"in_flight": first.status_code, "new_during_drain": late.status_code, "exit_s": round(exited, 3)},
    )
