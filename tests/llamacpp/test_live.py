"""The gateway over real llama-server processes: Envoy, the single-hop EPP, two llama.cpp engines.

Skipped, with the reason, where `make llama-server` has not built the engine and model (the
build takes ~8-10 minutes on two cores); CI builds them once per machine (.ci/run, into a cache
outside the clone), so there a missing engine is a failure, not a skip. What they show:
the llamacpp dialect parses the live page and the EPP keeps every pod fresh with it; a request
through Envoy is answered by the engine the EPP named in its decision header (read from the
engines' own token counters); the EPP's in-flight count, and the engine's busy slots, return to
zero after a completed request and after a client abort mid-stream.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import ssl
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from bench.harness.gateway_policies import describe_pods
from bench.harness.targets import TargetContext
from devstack.launch import LocalGateway, Proc, dev_trust, pool_name_for, start_local_gateway
from devstack.llamacpp.model import MODEL_NAME
from devstack.llamacpp.server import ServerSpec, missing_engine, start_llama_servers, with_model_tokenizer
from epp.datalayer.metric_dialects import parse_metrics
from tests.integration.test_make_run import read_until, start_make_run
from tests.reliability.gateway_helpers import metric_value

MISSING = missing_engine()
if MISSING is not None and os.environ.get("CI"):
    raise RuntimeError(f"{MISSING}: .ci/run builds it before the tests")
pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(MISSING is not None, reason=f"{MISSING} (~8-10 min on 2 cores)"),
]
POOL = pool_name_for(MODEL_NAME)


def _patch(config: dict[str, Any]) -> None:
    dev_trust(config)
    with_model_tokenizer(config)


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalGateway]:
    workdir = tmp_path_factory.mktemp("llamacpp")
    engines: dict[str, Proc]
    engines, pods = start_llama_servers(workdir, [ServerSpec(threads=1, parallel=2)] * 2)
    try:
        gw = start_local_gateway(workdir, pods=pods, config_patch=_patch, single_hop=True)
    except BaseException:
        for proc in engines.values():
            proc.stop()
        raise
    gw.procs.update(engines)
    try:
        yield gw
    finally:
        gw.stop()


def _chat(content: str, **extra: object) -> dict[str, object]:
    return {"model": MODEL_NAME, "messages": [{"role": "user", "content": content}], **extra}


async def _engine_page(client: httpx.AsyncClient, address: str) -> str:
    return (await client.get(f"http://{address}/metrics")).text


async def _until(check: Callable[[], Awaitable[bool]], what: str, timeout_s: float = 30.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not await check():
        assert asyncio.get_running_loop().time() < deadline, f"{what}: not within {timeout_s} s"
        await asyncio.sleep(0.05)


class Epp:
    """The single-hop EPP's admin port: its pool view and its own request metrics."""

    def __init__(self, gw: LocalGateway, client: httpx.AsyncClient) -> None:
        self.base = f"http://127.0.0.1:{gw.epp_metrics_ports[POOL]}"
        self.client = client

    async def endpoints(self) -> list[dict[str, Any]]:
        return list((await self.client.get(f"{self.base}/debug/pool")).json()["endpoints"])

    async def inflight(self) -> int:
        return sum(e["inflight_requests"] for e in await self.endpoints())

    async def settled(self, engines: list[str]) -> None:
        """In-flight 0 in the EPP, every routed request finished exactly once, and the engines'
        own slots idle again."""

        async def idle() -> bool:
            if await self.inflight():
                return False
            for address in engines:
                m = parse_metrics(await _engine_page(self.client, address), "llamacpp", 0.0)
                if m.running or m.waiting:
                    return False
            return True

        await _until(idle, "in-flight and the engines' busy slots back to 0")
        text = (await self.client.get(f"{self.base}/metrics")).text
        assert metric_value(text, "inference_objective_running_requests", model_name=MODEL_NAME) == 0
        routed = metric_value(text, "inference_objective_request_total", model_name=MODEL_NAME)
        finished = metric_value(
            text, "inference_objective_request_duration_seconds_count", model_name=MODEL_NAME
        )
        assert routed > 0 and finished == routed


async def test_the_dialect_parses_the_live_page_and_the_epp_keeps_both_pods_fresh(gw: LocalGateway) -> None:
    async with httpx.AsyncClient(timeout=10) as client:
        for address in gw.pods_of(MODEL_NAME):
            m = parse_metrics(await _engine_page(client, address), "llamacpp", 1.0)
            assert (m.waiting, m.running, m.kv_usage) == (0.0, 0.0, None)
        epp = Epp(gw, client)

        async def fresh() -> bool:
            eps = await epp.endpoints()
            return len(eps) == 2 and all(
                e["healthy"] and e["metrics"] is not None and e["metrics_age_s"] < 1.0 for e in eps
            )

        await _until(fresh, "both llama-server pods scraped and fresh")
        for e in await epp.endpoints():
            assert e["engine"] == "llamacpp"
            assert (e["metrics"]["waiting"], e["metrics"]["running"], e["metrics"]["kv_usage"]) == (
                0,
                0,
                None,
            )


async def test_the_benchmark_harness_describes_running_llama_servers(
    gw: LocalGateway, tmp_path: Path
) -> None:
    """`python -m bench run --worker-urls` over llama-server processes: the harness did not start
    them, so their dialect comes from `/v1/models` (`owned_by: llamacpp`)."""
    urls = [f"http://{a}" for a in gw.pods_of(MODEL_NAME)]
    pods = await describe_pods(TargetContext(worker_urls=urls, work_dir=tmp_path))
    assert [(p["model"], p["dialect"], p["adapters"]) for p in pods] == [(MODEL_NAME, "llamacpp", [])] * 2


CHOSEN = re.compile(r"^chosen=(\S+) ")


async def test_each_request_is_answered_by_the_engine_the_epp_chose(gw: LocalGateway) -> None:
    engines = gw.pods_of(MODEL_NAME)
    chosen: list[str] = []
    async with gw.client() as client, httpx.AsyncClient(timeout=10) as plain:
        for i in range(6):
            before = {
                a: metric_value(await _engine_page(plain, a), "llamacpp:tokens_predicted_total")
                for a in engines
            }
            # A distinct output length per request, generated in full (ignore_eos: llama.cpp's
            # own option), so the engine whose counter grew by exactly that much answered it.
            tokens = 5 + i
            r = await client.post(
                "/v1/chat/completions",
                json=_chat(f"question {i}", max_tokens=tokens, ignore_eos=True),
                headers={"x-gateway-decision": "true"},
            )
            assert r.status_code == 200, r.text
            assert r.json()["usage"]["completion_tokens"] == tokens
            match = CHOSEN.match(r.headers["x-gateway-decision"])
            assert match, r.headers["x-gateway-decision"]
            after = {
                a: metric_value(await _engine_page(plain, a), "llamacpp:tokens_predicted_total")
                for a in engines
            }
            grew = {a: after[a] - before[a] for a in engines}
            assert grew == {a: (tokens if a == match.group(1) else 0) for a in engines}, (
                match.group(1),
                grew,
            )
            chosen.append(match.group(1))
        # Keep one engine busy with a long answer: the EPP must send the next request elsewhere.
        # The `chat` profile, whose in-flight and observed-speed scorers see the running request:
        # the default profile tells two engines with free slots apart only by their deferred
        # requests, prefix and pace (llama.cpp has no KV usage to break the tie; docs/llamacpp.md).
        long = asyncio.create_task(
            client.post("/v1/chat/completions", json=_chat("long", max_tokens=2500, ignore_eos=True))
        )
        try:
            busy: dict[str, float] = {}

            async def one_busy() -> bool:
                for a in engines:
                    busy[a] = parse_metrics(await _engine_page(plain, a), "llamacpp", 0.0).running or 0.0
                return sum(busy.values()) == 1

            await _until(one_busy, "the long answer running on one engine")
            r = await client.post(
                "/v1/chat/completions",
                json=_chat("while busy", max_tokens=4),
                headers={"x-gateway-decision": "true", "x-gateway-inference-objective": "chat"},
            )
            assert r.status_code == 200
            decision = r.headers["x-gateway-decision"]
            match = CHOSEN.match(decision)
            assert match and "profile=chat" in decision and busy[match.group(1)] == 0, (decision, busy)
        finally:
            long.cancel()
        epp = Epp(gw, plain)
        await epp.settled(engines)

        async def learned() -> bool:  # from llama.cpp's counters (no histograms on its page)
            return any(e["tpot_ewma_s"] and e["prefill_tps"] for e in await epp.endpoints())

        await _until(learned, "a time per output token and a prefill pace learned from the counters")


async def test_streamed_answer_carries_usage_and_inflight_returns_to_zero(gw: LocalGateway) -> None:
    engines = gw.pods_of(MODEL_NAME)
    async with gw.client() as client, httpx.AsyncClient(timeout=10) as plain:
        body = _chat(
            "stream", max_tokens=12, ignore_eos=True, stream=True, stream_options={"include_usage": True}
        )
        usage = None
        chunks = 0
        async with client.stream("POST", "/v1/chat/completions", json=body) as r:
            assert r.status_code == 200
            async for line in r.aiter_lines():
                if line.startswith("data: {"):
                    chunks += 1
                    usage = httpx.Response(200, content=line[6:]).json().get("usage") or usage
        assert chunks >= 12 and usage is not None and usage["completion_tokens"] == 12
        await Epp(gw, plain).settled(engines)


async def test_client_abort_mid_stream_frees_the_epp_slot_and_the_engine_slot(gw: LocalGateway) -> None:
    engines = gw.pods_of(MODEL_NAME)
    async with gw.client() as client, httpx.AsyncClient(timeout=10) as plain:
        epp = Epp(gw, plain)
        # ~3,000 tokens: seconds of generation, far from done when the client leaves.
        body = _chat("abort me", max_tokens=3000, ignore_eos=True, stream=True)
        async with client.stream("POST", "/v1/chat/completions", json=body) as r:
            assert r.status_code == 200
            lines = 0
            async for line in r.aiter_lines():
                lines += line.startswith("data: ")
                if lines == 10:
                    assert await epp.inflight() == 1
                    break  # leaving the block closes the stream: the client is gone
        await epp.settled(engines)


def test_make_run_with_llama_cpp_answers_the_printed_request() -> None:
    """`make run ARGS="--engine llama.cpp"`: the gateway over two llama-server processes; the
    request it prints gets a real completion with usage, and Ctrl-C stops the engines too."""
    proc, lines = start_make_run("--engine", "llama.cpp")
    try:
        output = "".join(read_until(lines, "Press Ctrl-C"))
        assert "-> 2 llama-server processes (llama.cpp " in output, output
        ca, url = re.search(r"curl --cacert (\S+) (\S+)/v1/chat/completions", output).groups()  # type: ignore[union-attr]
        body = json.loads(re.search(r"-d '(\{.*\})'", output).group(1))  # type: ignore[union-attr]
        assert body["model"] == MODEL_NAME
        r = httpx.post(f"{url}/v1/chat/completions", json=body, verify=ssl.create_default_context(cafile=ca))
        assert r.status_code == 200, r.text
        usage = r.json()["usage"]
        assert usage["prompt_tokens"] > 0 and 0 < usage["completion_tokens"] <= body["max_tokens"]
        workdir = Path(re.search(r"^Work directory: (\S+) ", output, re.M).group(1))  # type: ignore[union-attr]
        debug_url = re.search(r"^Profiles and weights in force: (\S+?)[,\s]", output, re.M).group(1)  # type: ignore[union-attr]
        engines = [ep["address"] for ep in httpx.get(debug_url, timeout=5).json()["endpoints"]]
        assert len(engines) == 2
        proc.send_signal(signal.SIGINT)
        assert proc.wait(60) == 0
        assert not workdir.exists()
        for address in engines:  # the llama-server processes went with the gateway
            with pytest.raises(httpx.ConnectError):
                httpx.get(f"http://{address}/health", timeout=2)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
