"""SIGTERM drains the EPP: a request in flight finishes, new ones get a clean JSON error."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Iterator

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from devstack.launch import LocalGateway, grpc_serving, start_local_gateway, wait_until
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
    exited = wait_for(lambda: epp.poll() is not None, 30, "EPP exits after the drain")
    record_figures(
        "sigterm_drain",
        {"in_flight": first.status_code, "new_during_drain": late.status_code, "exit_s": round(exited, 3)},
    )


async def test_sigterm_releases_held_streams_and_their_answers_carry_on(gw: LocalGateway) -> None:
    """A streamed answer holds its EPP stream until it ends. On SIGTERM the EPP ends such
    streams with an OK status (Envoy then stops processing and the answer carries on) instead
    of letting the drain grace period (5 s) cancel them, which Envoy would answer with a reset:
    the EPP exits while the answer is still streaming, and the answer completes."""
    name = f"epp-{POOL}"
    if gw.procs[name].popen.poll() is not None:  # drained by the test above
        gw.restart(name)
    wait_until(lambda: grpc_serving(gw.epp_ports[POOL]), 60, "EPP serving again", gw.procs[name].popen)
    wait_for(lambda: all(e["metrics"] for e in debug_pool(gw, POOL).values()), 60, "pods scraped")
    epp = gw.procs[name].popen
    lines: list[str] = []
    exited_at_line = 0
    async with gw.client() as client:
        body = chat(LLAMA, "drain me", stream=True, max_tokens=10_000)  # ~3.5 s at time_scale 20
        async with client.stream("POST", "/v1/chat/completions", json=body) as r:
            assert r.status_code == 200
            async for line in r.aiter_lines():
                lines.append(line)
                if len(lines) == 20:
                    epp.send_signal(signal.SIGTERM)
                elif len(lines) > 20 and not exited_at_line and epp.poll() is not None:
                    exited_at_line = len(lines)
    assert lines[-2:] == ["data: [DONE]", ""] or lines[-1] == "data: [DONE]", lines[-3:]
    assert exited_at_line, "the EPP waited for the answer instead of releasing its stream"
    record_figures(
        "sigterm_held_stream",
        {"lines": len(lines), "epp_exited_at_line": exited_at_line, "exit_code": epp.returncode},
    )
