"""The EPP holds a request's in-flight slot until the response ends, through the real Envoy.

Streamed answers send their headers at once; if Envoy closed the EPP's ext_proc stream after
the response-headers reply (its behaviour when neither response body nor trailers are asked
for), the slot would be freed at the first token. Both pool kinds run here: the static pool's
OverrideHost cluster and the ORIGINAL_DST cluster that Kubernetes-discovered pools get
(the launcher's `pool_kind="original_dst"`, so Envoy routes to the metadata's address exactly
as in a cluster); a FailOpen pool, whose EPP runs in BUFFERED mode (there
Envoy kept the stream to the response's end even without trailers: measured, its cases pass
with either trailer mode, while the other kinds' all fail without trailers); and single-hop
mode, where the one EPP's stream takes its response settings from the entry route.

Every check ends with the exactly-once invariant: the EPP's running-requests gauge (never
clamped, so a double release shows as -1) is 0 and as many requests finished as were routed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import httpx
import pytest

from devstack.launch import LocalGateway, start_local_gateway
from tests.integration.conftest import chat
from tests.reliability.gateway_helpers import metric_value, pod_fault

LLAMA, POOL = "llama-3.1-8b-instruct", "llama-3-1-8b-instruct"
# ~7 simulated ms per token: at time_scale 4 a 300-token answer lasts ~0.5 s of wall time.
FLEET = {
    "time_scale": 4.0,
    "pods": [{"name": "llama", "model": LLAMA, "profile": "h100-llama3.1-8b", "replicas": 3}],
}


def _fail_open(config: dict[str, Any]) -> None:
    config["pools"][0]["failureMode"] = "FailOpen"


@pytest.fixture(scope="module", params=["static", "original_dst", "static_failopen", "single_hop"])
def gw(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalGateway]:
    gw = start_local_gateway(
        tmp_path_factory.mktemp(f"inflight-{request.param}"),
        fleet=FLEET,
        config_patch=_fail_open if request.param == "static_failopen" else None,
        pool_kind="original_dst" if request.param == "original_dst" else "static",
        single_hop=request.param == "single_hop",
    )
    try:
        bootstrap = json.dumps(gw.envoy_config())  # what Envoy runs
        assert ('"ORIGINAL_DST"' in bootstrap) == (request.param == "original_dst")
        assert ('"BUFFERED"' in bootstrap) == (request.param == "static_failopen")
        assert ('"gateway.bbr"' in bootstrap) == (request.param != "single_hop")
        yield gw
    finally:
        gw.stop()


class Epp:
    """The pool's EPP seen from its admin port, through one plain-HTTP client: a new httpx
    client builds a TLS context (hundreds of ms on a loaded machine), which would stall the
    stream being read meanwhile."""

    def __init__(self, gw: LocalGateway, client: httpx.AsyncClient) -> None:
        self._base = f"http://127.0.0.1:{gw.epp_metrics_ports[POOL]}"
        self._client = client

    async def inflight(self) -> int:
        r = await self._client.get(f"{self._base}/debug/pool")
        return sum(e["inflight_requests"] for e in r.json()["endpoints"])

    async def at_least(self, n: int) -> bool:
        return await self.inflight() >= n

    async def settled(self) -> None:
        """In-flight back to 0 everywhere, and every routed request released exactly once."""

        async def zero() -> bool:
            return await self.inflight() == 0

        await until(zero, "in-flight back to 0")
        running, routed, finished = await self.counts()
        assert running == 0
        assert routed > 0 and finished == routed

    async def counts(self) -> tuple[float, float, float]:
        """The EPP's running requests (never clamped: a double release shows as -1), and how
        many it routed and saw finish."""
        text = (await self._client.get(f"{self._base}/metrics")).text
        running = metric_value(text, "inference_objective_running_requests", model_name=LLAMA)
        routed = metric_value(text, "inference_objective_request_total", model_name=LLAMA)
        finished = metric_value(text, "inference_objective_request_duration_seconds_count", model_name=LLAMA)
        return running, routed, finished


@pytest.fixture
async def epp(gw: LocalGateway) -> AsyncIterator[Epp]:
    async with httpx.AsyncClient(timeout=5) as client:
        yield Epp(gw, client)


async def until(check: Callable[[], Awaitable[bool]], what: str, timeout_s: float = 20.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not await check():
        assert asyncio.get_running_loop().time() < deadline, f"{what}: not within {timeout_s} s"
        await asyncio.sleep(0.02)


@pytest.mark.parametrize("http2", [False, True], ids=["h1", "h2"])
async def test_streamed_and_plain_requests_hold_their_slots_until_the_end(
    gw: LocalGateway, epp: Epp, http2: bool
) -> None:
    async with gw.client(http2=http2) as client:
        # A plain request several times as long as the stream: it runs for the whole stream.
        plain = asyncio.create_task(
            client.post("/v1/chat/completions", json=chat(LLAMA, "plain", max_tokens=2000))
        )
        try:
            await until(lambda: epp.at_least(1), "plain request routed")
            samples: list[int] = []
            # A long answer (~5 s of wall time) read for its first 300 tokens only: the pod is
            # surely still generating then, however far a loaded machine lets the reader lag
            # (near an answer's end the rest may sit in socket buffers, the stream done).
            body = chat(LLAMA, "streamed", stream=True, max_tokens=3000)
            async with client.stream("POST", "/v1/chat/completions", json=body) as r:
                assert r.status_code == 200
                tokens = 0
                async for line in r.aiter_lines():
                    if not line.startswith("data: "):
                        continue
                    tokens += 1
                    if tokens % 50 == 1:  # from the first token: the headers are long gone
                        samples.append(await epp.inflight())
                    if tokens == 300:
                        break  # leaving the block aborts the stream; the abort tests cover that
            # Both slots held throughout: the stream's, and the plain request's, still running.
            assert not plain.done(), "the plain request should still be running"
            assert len(samples) == 6 and min(samples) >= 2, samples
            assert (await plain).status_code == 200
        finally:
            plain.cancel()
    await epp.settled()


async def test_client_abort_mid_stream_returns_the_slot(gw: LocalGateway, epp: Epp) -> None:
    async with gw.client() as client:
        body = chat(LLAMA, "abort me", stream=True, max_tokens=3000)
        async with client.stream("POST", "/v1/chat/completions", json=body) as r:
            lines = 0
            async for line in r.aiter_lines():
                lines += line.startswith("data: ")
                if lines == 10 and line:  # the 10th data line itself, not the blank after it
                    await until(lambda: epp.at_least(1), "slot held mid-stream")
                    break  # leaving the block closes the connection mid-body
    await epp.settled()


async def test_upstream_reset_mid_stream_returns_the_slot(gw: LocalGateway, epp: Epp) -> None:
    """Runs last: the crashed pod stays down for the rest of the module."""
    seen: list[str] = []
    async with gw.client() as client:
        body = chat(LLAMA, "reset me", stream=True, max_tokens=3000)
        async with client.stream("POST", "/v1/chat/completions", json=body) as r:
            lines = 0
            with contextlib.suppress(httpx.HTTPError):  # a reset mid-body may surface as one
                async for line in r.aiter_lines():
                    seen.append(line)
                    lines += line.startswith("data: ")
                    if lines == 10 and line:  # once: blank separator lines keep the count
                        await until(lambda: epp.at_least(1), "slot held mid-stream")
                        pod_fault(gw, r.headers["x-modelsim-pod"], crash=True)
    assert "data: [DONE]" not in seen, "the stream should have been cut"
    await epp.settled()
