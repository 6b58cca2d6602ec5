"""SIGTERM drains the EPP: a request in flight finishes, new ones get a clean JSON error."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Iterator

import pytest

from gateway.launch import LocalGateway, start_local_gateway
from tests.integration.conftest import FAST_FLEET, chat
from tests.reliability.conftest import record_figures
from tests.reliability.gateway_helpers import pod_fault, wait_for

LLAMA, POOL = "llama-3.1-8b-instruct", "llama-3-1-8b-instruct"


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalGateway]:
    gateway = start_local_gateway(tmp_path_factory.mktemp("drain"), fleet=FAST_FLEET)
    try:
        yield gateway
    finally:
        gateway.stop()


async def test_sigterm_lets_the_in_flight_request_finish(gw: LocalGateway) -> None:
    for name in ("llama-0", "llama-1"):
        pod_fault(gw, name, stall_s=30.0)  # 1.5 s wall at time_scale 20
    epp = gw.procs[f"epp-{POOL}"].popen
    async with gw.client() as client:
        in_flight = asyncio.create_task(client.post("/v1/chat/completions", json=chat(LLAMA)))
        await asyncio.sleep(0.4)
        epp.send_signal(signal.SIGTERM)
        await asyncio.sleep(0.2)
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
