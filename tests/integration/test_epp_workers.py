"""A multi-core EPP behind the real Envoy (epp/workers/processes.py): two ext_proc worker processes share
the EPP's port (SO_REUSEPORT) and ask the one scheduling process for every decision.

Envoy opens a connection per few concurrent streams (`EXT_PROC_STREAMS_PER_CONNECTION`) and the
kernel spreads connections over the workers, so a burst of held streams reaches both. A worker
killed outright is replaced, the streams it held are released in the scheduling process (its
in-flight returns to zero), and requests after it are served. Both shapes: two-hop (`python -m
epp`) and single-hop (`python -m epp.single_hop`). The tests run in file order (the last kills).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest

from devstack.launch import LocalGateway, start_local_gateway
from tests.integration.conftest import chat

LLAMA, POOL = "llama-3.1-8b-instruct", "llama-3-1-8b-instruct"
FLEET = {
    "time_scale": 4.0,
    "pods": [{"name": "llama", "model": LLAMA, "profile": "h100-llama3.1-8b", "replicas": 2}],
}
# 48 held streams are 12 connections at 4 streams each: all 12 hashed onto one worker has odds
# of 2 in 4,096, so the spread check does not depend on luck in any practical sense.
HELD = 48


@pytest.fixture(scope="module", params=["two-hop", "single-hop"])
def gw(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Iterator[LocalGateway]:
    gw = start_local_gateway(
        tmp_path_factory.mktemp("workers"),
        fleet=FLEET,
        epp_workers=2,
        single_hop=request.param == "single-hop",
    )
    try:
        yield gw
    finally:
        gw.stop()


@pytest.fixture
async def admin(gw: LocalGateway) -> AsyncIterator[Admin]:
    async with httpx.AsyncClient(timeout=5) as client:
        yield Admin(f"http://127.0.0.1:{gw.epp_metrics_ports[POOL]}", client)


class Admin:
    def __init__(self, base: str, client: httpx.AsyncClient) -> None:
        self._base, self._client = base, client

    async def pool(self) -> dict[str, Any]:
        return (await self._client.get(f"{self._base}/debug/pool")).json()

    async def inflight(self) -> int:
        return sum(e["inflight_requests"] for e in (await self.pool())["endpoints"])

    async def workers(self) -> dict[str, Any]:
        return (await self.pool())["workers"]


async def until(check: Any, what: str, timeout_s: float = 30.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not await check():
        assert asyncio.get_running_loop().time() < deadline, f"{what}: not within {timeout_s} s"
        await asyncio.sleep(0.05)


@contextlib.asynccontextmanager
async def held_streams(client: httpx.AsyncClient, n: int) -> AsyncIterator[None]:
    """`n` streamed answers, each open past its first token until the block ends (then aborted)."""
    readers = []  # kept referenced: a line iterator garbage-collected mid-stream closes the stream
    async with contextlib.AsyncExitStack() as stack:

        async def open_one(i: int) -> None:
            body = chat(LLAMA, f"hold {i}", stream=True, max_tokens=3000)
            r = await stack.enter_async_context(client.stream("POST", "/v1/chat/completions", json=body))
            assert r.status_code == 200
            lines = r.aiter_lines()
            readers.append(lines)
            while not (await anext(lines)).startswith("data: "):
                pass

        await asyncio.gather(*(open_one(i) for i in range(n)))
        yield


async def test_streams_land_on_both_workers_and_are_counted_once(gw: LocalGateway, admin: Admin) -> None:
    async with gw.client() as client, held_streams(client, HELD):
        assert await admin.inflight() == HELD  # one picture: every worker's streams in it
        linked = (await admin.workers())["linked"]
        assert len(linked) == 2
        assert sorted(w["open_streams"] > 0 for w in linked) == [True, True], linked
        assert sum(w["open_streams"] for w in linked) == HELD
    await until(lambda: _equals(admin.inflight, 0), "in-flight back to 0")


async def test_bad_requests_get_openai_errors_from_the_workers_parse(gw: LocalGateway, admin: Admin) -> None:
    """The workers parse the body (epp/requestcontrol/parse.py): malformed JSON, a bad field and an unknown
    model still get the OpenAI-style errors, and nothing stays counted."""
    bad = [
        (b'{"model": "' + LLAMA.encode() + b'", "messages": [', 400, "invalid_json"),
        (b'{"model": "' + LLAMA.encode() + b'", "prompt": "hi", "stream": "yes"}', 400, None),
        (b'{"model": "no-such-model", "prompt": "hi"}', 404, "model_not_found"),
    ]
    async with gw.client() as client:
        for body, status, code in bad:
            r = await client.post(
                "/v1/chat/completions", content=body, headers={"content-type": "application/json"}
            )
            assert r.status_code == status, (body, r.text)
            error = r.json()["error"]
            assert error["message"], r.text
            if code is not None:
                assert error["code"] == code, r.text
        ok = await client.post("/v1/chat/completions", json=chat(LLAMA, "still served", max_tokens=4))
        assert ok.status_code == 200
    await until(lambda: _equals(admin.inflight, 0), "in-flight back to 0")


async def test_a_killed_worker_is_replaced_and_releases_its_streams(gw: LocalGateway, admin: Admin) -> None:
    async with gw.client() as client:
        async with held_streams(client, HELD):
            linked = (await admin.workers())["linked"]
            victim = max(linked, key=lambda w: w["open_streams"])
            assert victim["open_streams"] > 0
            os.kill(victim["pid"], signal.SIGKILL)
            # Its streams are released at once (the link's end), the others stay counted.
            await until(
                lambda: _equals(admin.inflight, HELD - victim["open_streams"]),
                "the dead worker's streams released",
            )

            async def replaced() -> bool:
                workers = await admin.workers()
                pids = {w["pid"] for w in workers["linked"]}
                return workers["restarts"] >= 1 and len(pids) == 2 and victim["pid"] not in pids

            await until(replaced, "a new worker linked in the dead one's place")
        await until(lambda: _equals(admin.inflight, 0), "in-flight back to 0")
        for i in range(10):
            assert (
                await client.post("/v1/chat/completions", json=chat(LLAMA, f"after {i}"))
            ).status_code == 200
    await until(lambda: _equals(admin.inflight, 0), "in-flight back to 0 after the new requests")


async def _equals(read: Any, value: int) -> bool:
    return bool(await read() == value)


async def test_sigterm_drains_the_workers_then_stops(gw: LocalGateway, admin: Admin) -> None:
    """A clean stop: each worker drains (its held streams released, their responses carry on
    to the end), then the workers and the scheduling process exit."""
    epp = gw.procs["epp" if gw.single_hop else f"epp-{POOL}"].popen
    pids = [w["pid"] for w in (await admin.workers())["linked"]]
    async with gw.client() as client:
        body = chat(LLAMA, "drain me", stream=True, max_tokens=200)
        async with client.stream("POST", "/v1/chat/completions", json=body) as reply:
            assert reply.status_code == 200
            lines = reply.aiter_lines()
            while not (await anext(lines)).startswith("data: "):
                pass
            epp.send_signal(signal.SIGTERM)
            rest = [line async for line in lines]
    assert "data: [DONE]" in rest  # not cut by the drain
    assert await asyncio.to_thread(epp.wait, 30) == 0
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
