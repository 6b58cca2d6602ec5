"""What the gateway itself costs: Envoy alone vs Envoy + a do-nothing ext_proc vs the full gateway,
two-hop (BBR, then the pool's EPP) and single-hop (one EPP stream routes and picks), each with
request bodies streamed (FULL_DUPLEX_STREAMED: every chunk goes to the ext_proc and back) and
buffered (BUFFERED: Envoy sends the whole body once, the ext_proc sends nothing back;
`listener.requestBodyMode`).

All four front one fast stub pod (answers at once, a few SSE tokens) so that what is left is
the proxy path. Per setup, concurrency and request-body size: client-observed latency p50/p99
(added = minus the direct-to-stub figure), req/s, and CPU time of the gateway's own processes
(Envoy, ext_proc services; /proc/<pid>/stat utime+stime) turned into req/s per core.
A second table prices what the ext_proc sees of the response on a 200-token streamed answer
(CPU per request of Envoy + the ext_proc): headers only (Envoy closes the stream after them),
headers + trailers (the stream is held to the response's end: the EPP's pool routes), and
every body chunk (STREAMED).

python -m bench.micro.overhead_gateway [--requests 300] [--doc docs/benchmarks/costs.md]
python -m bench.micro.overhead_gateway --stream-only --requests 100 --rounds 5   # second table alone
python -m bench.micro.overhead_gateway noop-extproc --port N     # the do-nothing ext_proc alone
python -m bench.micro.overhead_gateway split [--requests 300]     # CPU per process and ext_proc messages
python -m bench.micro.overhead_gateway agentic [--requests 100] [--sizes 65536,409600]
    # agentic bodies (a multi-turn conversation), approximate vs precise prefix path (issue #45)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shlex
import ssl
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from statistics import median

import httpx
from aiohttp import web

from bench.harness.gateway_policies import start_envoy, wait_ready_async, with_tokenizer, write_baseline
from bench.harness.stats import percentile
from bench.micro.stub_server import StubConfig, StubServer
from bench.reports.report import write_section
from devstack.launch import LocalGateway, Proc, free_port, grpc_serving, start_local_gateway
from extproc.errors import ErrorResponse
from extproc.server import start_grpc_service, wait_for_shutdown_signal
from extproc.stream import ExtProcServicer, RequestOnlyProcessor, RequestRoute
from modelsim.pseudo_text import TextSource

MODEL = "llama3.1-8b"
BODY_SIZES = (1024, 32 * 1024, 256 * 1024)
CONCURRENCY = (1, 32)
# Both shapes of the request path (devstack.launch.start_local_gateway's `single_hop`), in both
# request-body modes (`listener.requestBodyMode`): (label, single_hop, body mode).
FULL_GATEWAYS = (
    ("full gateway (Envoy + BBR + EPP)", False, "streamed"),
    ("full gateway, buffered (Envoy + BBR + EPP)", False, "buffered"),
    ("full gateway single-hop (Envoy + one EPP)", True, "streamed"),
    ("full gateway single-hop, buffered (Envoy + one EPP)", True, "buffered"),
)
# The do-nothing ext_proc in both request-body modes: (label, buffered).
NOOP_SETUPS = (("Envoy + no-op ext_proc", False), ("Envoy + no-op ext_proc, buffered", True))
CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100

METRICS = (
    'vllm:num_requests_running{{model_name="{m}"}} 0\n'
    'vllm:num_requests_waiting{{model_name="{m}"}} 0\n'
    'vllm:kv_cache_usage_perc{{model_name="{m}"}} 0\n'
)


class MetricsStub(StubServer):
    """The stub pod plus an idle vLLM /metrics page, so the EPP can scrape it."""

    async def _not_found(self, request: web.Request) -> web.Response:
        if request.path == "/metrics":
            return web.Response(text=METRICS.format(m=self.config.model), content_type="text/plain")
        return await super()._not_found(request)


async def serve_stub(tokens: int) -> None:
    stub = await MetricsStub(StubConfig(tokens=tokens, model=MODEL), keep_bodies=False).start()
    print(stub.port, flush=True)
    await wait_for_shutdown_signal()
    await stub.stop()


class NoopProcessor(RequestOnlyProcessor):
    """Continues everything unchanged (FULL_DUPLEX_STREAMED still makes it re-emit the body;
    BUFFERED gets one body message and sends nothing back)."""

    max_body_bytes = 64 * 1024 * 1024

    async def on_request(self, headers: dict[str, str], body: bytes) -> RequestRoute | ErrorResponse:
        return RequestRoute()


async def serve_noop(port: int) -> None:
    service = await start_grpc_service(
        ExtProcServicer(NoopProcessor, name="noop"), host="127.0.0.1", port=port
    )
    await wait_for_shutdown_signal()
    await service.drain_and_stop(0.5)


def cpu_seconds(pids: Sequence[int]) -> float:
    """utime + stime of the given processes (their own threads, not children)."""
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14, 15 of the line)
    return total / CLK_TCK


@dataclass
class Cell:
    setup: str
    concurrency: int
    body_bytes: int
    requests: int
    errors: int
    p50_ms: float
    p99_ms: float
    req_s: float
    cpu_ms_per_req: float | None  # gateway processes only

    @property
    def req_s_per_core(self) -> float | None:
        return 1000 / self.cpu_ms_per_req if self.cpu_ms_per_req else None


def request_body(size: int, tokens: int) -> bytes:
    base = {
        "model": MODEL,
        "messages": [{"role": "user", "content": ""}],
        "max_tokens": tokens,
        "stream": True,
    }
    pad = size - len(json.dumps(base))
    base["messages"][0]["content"] = "x" * max(0, pad)  # type: ignore[index]
    return json.dumps(base).encode()


async def load(
    url: str, verify: ssl.SSLContext | bool, body: bytes | Sequence[bytes], requests: int, concurrency: int
) -> tuple[list[float], int, float]:
    """Closed loop: `concurrency` workers send `requests` streaming requests in total; a
    sequence of bodies is sent in turn (request i sends body i modulo its length)."""
    bodies = [body] if isinstance(body, bytes) else list(body)
    latencies: list[float] = []
    errors = 0
    remaining = requests
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, verify=verify, timeout=30, limits=limits) as client:

        async def worker() -> None:
            nonlocal remaining, errors
            while remaining > 0:
                remaining -= 1
                payload = bodies[remaining % len(bodies)]
                started = time.perf_counter()
                try:
                    async with client.stream(
                        "POST",
                        "/v1/chat/completions",
                        content=payload,
                        headers={"content-type": "application/json"},
                    ) as reply:
                        async for _ in reply.aiter_raw():
                            pass
                        ok = reply.status_code == 200
                except httpx.HTTPError:
                    ok = False
                if ok:
                    latencies.append((time.perf_counter() - started) * 1000)
                else:
                    errors += 1

        # Warm connections (TLS handshakes) outside the measurement.
        await asyncio.gather(*(client.get("/health") for _ in range(concurrency)), return_exceptions=True)
        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall = time.perf_counter() - started
    return latencies, errors, wall


@dataclass
class Setup:
    name: str
    url: str
    verify: ssl.SSLContext | bool
    pids: list[int]
    stop: Callable[[], None]


async def start_stub(tokens: int) -> tuple[asyncio.subprocess.Process, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "bench.micro.overhead_gateway",
        "stub",
        "--tokens",
        str(tokens),
        stdout=asyncio.subprocess.PIPE,
    )
    assert proc.stdout is not None
    port = int(await asyncio.wait_for(proc.stdout.readline(), 30))
    return proc, f"127.0.0.1:{port}"


async def start_envoy_setup(
    name: str,
    work: Path,
    stub: str,
    ext_proc: tuple[str, int] | None,
    mode: str = "NONE",
    trailers: str = "SEND",
    buffered: bool = False,
) -> Setup:
    files = write_baseline(
        work,
        [stub],
        "ROUND_ROBIN",
        ext_proc=ext_proc,
        response_body_mode=mode,
        response_trailer_mode=trailers,
        buffered_request_body=buffered,
    )
    envoy = start_envoy(files.bootstrap, work)
    await wait_ready_async(f"http://127.0.0.1:{files.admin_port}/ready", envoy, 30)
    verify = ssl.create_default_context(cafile=str(files.certs.ca))
    return Setup(name, f"https://127.0.0.1:{files.listen_port}", verify, [envoy.popen.pid], envoy.stop)


def start_noop_extproc(work: Path) -> tuple[Proc, int]:
    port = free_port()
    work.mkdir(parents=True, exist_ok=True)
    log = work / "noop.log"
    with log.open("ab") as handle:
        popen = subprocess.Popen(
            [sys.executable, "-m", "bench.micro.overhead_gateway", "noop-extproc", "--port", str(port)],
            stdout=handle,
            stderr=subprocess.STDOUT,
        )
    proc = Proc("noop", popen, log)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if grpc_serving(port):
                return proc, port
        except Exception:  # not up yet
            time.sleep(0.1)
    proc.stop()
    raise TimeoutError("noop ext_proc did not start")


async def measure(
    setup: Setup, sizes: Sequence[int], concurrencies: Sequence[int], requests: int, tokens: int
) -> list[Cell]:
    cells = []
    for conc in concurrencies:
        for size in sizes:
            n = requests if conc == 1 else requests * 3
            body = request_body(size, tokens)
            cpu0 = cpu_seconds(setup.pids)
            lat, errors, wall = await load(setup.url, setup.verify, body, n, conc)
            cpu = cpu_seconds(setup.pids) - cpu0
            cells.append(
                Cell(setup.name, conc, size, n, errors, percentile(lat, 50) or 0.0, percentile(lat, 99) or 0.0,
                     len(lat) / wall if wall else 0.0, cpu * 1000 / n if setup.pids else None)
            )  # fmt: skip
            print(f"{setup.name} c={conc} {size // 1024} KB: p50 {cells[-1].p50_ms:.2f} ms, "
                  f"{cells[-1].req_s:.0f} req/s, cpu {cells[-1].cpu_ms_per_req} ms/req, errors {errors}", flush=True)  # fmt: skip
    return cells


# What the ext_proc sees of a response: (label, response_body_mode, response_trailer_mode).
RESPONSE_MODES = (
    ("headers only (trailers SKIP)", "NONE", "SKIP"),
    ("headers + trailers (SEND)", "NONE", "SEND"),
    ("every body chunk (STREAMED)", "STREAMED", "SKIP"),
)


async def run_all(
    requests: int, tokens: int, stream_tokens: int, stream_only: bool = False, rounds: int = 1
) -> tuple[list[Cell], list[Cell]]:
    work = Path(tempfile.mkdtemp(prefix="bench-overhead-"))
    cells: list[Cell] = []
    if not stream_only:
        cells = await run_overhead(work, requests, tokens)
    return cells, await run_response_modes(work, requests, stream_tokens, rounds)


async def run_overhead(work: Path, requests: int, tokens: int) -> list[Cell]:
    stub_proc, stub = await start_stub(tokens)
    cells: list[Cell] = []
    try:
        direct = Setup("direct to stub (no proxy)", f"http://{stub}", False, [], lambda: None)
        cells += await measure(direct, BODY_SIZES, CONCURRENCY, requests, tokens)
        setup = await start_envoy_setup("Envoy round-robin", work / "rr", stub, None)
        try:
            cells += await measure(setup, BODY_SIZES, CONCURRENCY, requests, tokens)
        finally:
            setup.stop()
        for i, (name, buffered) in enumerate(NOOP_SETUPS):
            noop, port = start_noop_extproc(work / f"noop{i}")
            try:
                setup = await start_envoy_setup(
                    name, work / f"noop-envoy{i}", stub, ("127.0.0.1", port), buffered=buffered
                )
                setup.pids.append(noop.popen.pid)
                try:
                    cells += await measure(setup, BODY_SIZES, CONCURRENCY, requests, tokens)
                finally:
                    setup.stop()
            finally:
                noop.stop()
        pod = {"name": "stub-0", "model": MODEL, "adapters": [], "dialect": "vllm", "address": stub}
        for i, (name, single_hop, body_mode) in enumerate(FULL_GATEWAYS):
            gateway = start_local_gateway(
                work / f"gateway{i}",
                pods=[pod],
                single_hop=single_hop,
                config_extra={"listener": {"requestBodyMode": body_mode}},
            )
            try:
                await asyncio.sleep(0.5)
                full = Setup(name, gateway.url, ssl.create_default_context(cafile=str(gateway.certs.ca)),
                             [p.popen.pid for p in gateway.procs.values()], gateway.stop)  # fmt: skip
                cells += await measure(full, BODY_SIZES, CONCURRENCY, requests, tokens)
            finally:
                gateway.stop()
    finally:
        stub_proc.terminate()
        await stub_proc.wait()
    return cells


async def run_response_modes(work: Path, requests: int, stream_tokens: int, rounds: int = 1) -> list[Cell]:
    """A 200-token streamed answer through Envoy + the no-op ext_proc, per response mode.

    All modes run side by side and take turns, `rounds` times: on a shared machine, load
    drifts over minutes, and interleaving spreads that drift over every mode alike."""
    stream_cells: list[Cell] = []
    stub_proc, stub = await start_stub(stream_tokens)
    setups: list[Setup] = []
    noops: list[Proc] = []
    try:
        for i, (label, mode, trailers) in enumerate(RESPONSE_MODES):
            noop, port = start_noop_extproc(work / f"noop-mode{i}")
            noops.append(noop)
            setup = await start_envoy_setup(
                label, work / f"envoy-mode{i}", stub, ("127.0.0.1", port), mode, trailers
            )
            setup.pids.append(noop.popen.pid)
            setups.append(setup)
        for _ in range(rounds):
            for setup in setups:
                stream_cells += await measure(setup, (1024,), (8,), requests, stream_tokens)
    finally:
        for setup in setups:
            setup.stop()
        for noop in noops:
            noop.stop()
        stub_proc.terminate()
        await stub_proc.wait()
    return stream_cells


async def run_split(requests: int, tokens: int) -> list[str]:
    """Where a full gateway's CPU goes: per process (Envoy, BBR, EPP) per request, and Envoy's
    ext_proc message counts per request, for each gateway setup at 1 KB and 256 KB, concurrency 1.
    The setups run back to back, each for a few seconds, so load drifts less between them than
    across the whole table."""
    work = Path(tempfile.mkdtemp(prefix="bench-overhead-split-"))
    stub_proc, stub = await start_stub(tokens)
    pod = {"name": "stub-0", "model": MODEL, "adapters": [], "dialect": "vllm", "address": stub}
    lines = [
        "| setup | body | p50 ms | CPU ms/req per process | ext_proc msgs/req sent / received | errors |",
        "|---|---|---|---|---|---|",
    ]
    try:
        for i, (name, single_hop, body_mode) in enumerate(FULL_GATEWAYS):
            for size in (1024, 256 * 1024):
                gateway = start_local_gateway(
                    work / f"gateway{i}-{size}",
                    pods=[pod],
                    single_hop=single_hop,
                    config_extra={"listener": {"requestBodyMode": body_mode}},
                )
                try:
                    lat, errors, cpu, (sent, received) = await measure_gateway(
                        gateway, request_body(size, tokens), requests
                    )
                finally:
                    gateway.stop()
                per_proc = ", ".join(f"{k.split('-')[0]} {v:.2f}" for k, v in sorted(cpu.items()))
                lines.append(
                    f"| {name} | {size // 1024} KB | {percentile(lat, 50) or 0.0:.2f} | {per_proc} | "
                    f"{sent:.1f} / {received:.1f} | {errors} |"
                )
                print(lines[-1], flush=True)
    finally:
        stub_proc.terminate()
        await stub_proc.wait()
    return lines


async def measure_gateway(
    gateway: LocalGateway, body: bytes | Sequence[bytes], requests: int, warm: int = 30
) -> tuple[list[float], int, dict[str, float], tuple[float, float]]:
    """`requests` requests at concurrency 1 through a started local gateway, after `warm` more:
    latencies (ms), errors, CPU ms per request per gateway process (the fleet left out) and
    Envoy's ext_proc messages per request (sent, received)."""
    verify = ssl.create_default_context(cafile=str(gateway.certs.ca))
    await load(gateway.url, verify, body, warm, 1)
    stats = f"http://127.0.0.1:{gateway.admin_port}/stats?filter=ext_proc.stream_msgs"
    async with httpx.AsyncClient() as admin:
        before = ext_proc_message_counts((await admin.get(stats)).text)
        cpu0 = {k: cpu_seconds([p.popen.pid]) for k, p in gateway.procs.items() if k != "fleet"}
        lat, errors, _ = await load(gateway.url, verify, body, requests, 1)
        cpu = {k: (cpu_seconds([gateway.procs[k].popen.pid]) - v) * 1000 / requests for k, v in cpu0.items()}
        after = ext_proc_message_counts((await admin.get(stats)).text)
    sent, received = ((after[k] - before[k]) / requests for k in ("sent", "received"))
    return lat, errors, cpu, (sent, received)


# Agentic request bodies (issue #45): a coding agent's conversation, a system prompt and turns
# of ~2,000 tokens (tool outputs, answers), up to the body size.
AGENTIC_SIZES = (64 * 1024, 400 * 1024)
AGENTIC_TURN_TOKENS = 2000
# The two prefix paths of the shipped default profile (precise-prefix-cache): without a tokenizer
# it scores with the approximate index (character blocks); with the model's tokenizer the EPP
# tokenizes each prompt (epp/datalayer/tokenizer.py) to look it up in the precise index.
PREFIX_PATHS = {"approximate": None, "precise": with_tokenizer}


def agentic_bodies(size: int, tokens: int, requests: int, fresh: bool) -> list[bytes]:
    """`requests` conversation bodies of about `size` bytes. Every body ends with its own new
    user turn (a session's next turn: the EPP's tokenizer cache holds the rest, as in a
    running session); with `fresh`, every message is new too (each request a session the EPP
    has not seen: the whole prompt tokenized)."""
    text, rng = TextSource(0), random.Random(f"agentic-{size}")
    turn_chars = AGENTIC_TURN_TOKENS * 4
    history = [{"role": "system", "content": text.text(AGENTIC_TURN_TOKENS, rng)}]
    roles = ("user", "assistant")
    while len(json.dumps(history)) + turn_chars < size:
        history.append(
            {"role": roles[(len(history) - 1) % 2], "content": text.text(AGENTIC_TURN_TOKENS, rng)}
        )
    if history[-1]["role"] == "user":
        history.append({"role": "assistant", "content": text.text(AGENTIC_TURN_TOKENS // 4, rng)})
    base = {"model": MODEL, "messages": history, "max_tokens": tokens, "stream": True}
    tail_tokens = max(1, (size - len(json.dumps(base)) - 32) // 4)
    tail = text.text(tail_tokens, rng)
    bodies = []
    for i in range(requests):
        salt = f"[request {i}] "
        messages = [{**m, "content": salt + m["content"]} for m in history] if fresh else history
        body = {**base, "messages": [*messages, {"role": "user", "content": salt + tail}]}
        bodies.append(json.dumps(body).encode())
    return bodies


async def run_agentic(requests: int, tokens: int, sizes: Sequence[int]) -> list[str]:
    """CPU per request and added latency at agentic body sizes, single-hop streamed (the shipped
    default shape), approximate vs precise prefix path, each with a session's next turn (new
    last message) and a fresh session (every message new); concurrency 1. Added = p50 minus
    direct-to-stub's p50 on the same bodies, measured just before."""
    work = Path(tempfile.mkdtemp(prefix="bench-overhead-agentic-"))
    stub_proc, stub = await start_stub(tokens)
    pod = {"name": "stub-0", "model": MODEL, "adapters": [], "dialect": "vllm", "address": stub}
    lines = [
        "| prefix path | body | bodies | p50 ms | p99 ms | added p50 ms | CPU ms/req per process = total "
        "| req/s per core | errors |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    try:
        for size in sizes:
            for fresh in (False, True):
                bodies = agentic_bodies(size, tokens, requests, fresh)
                direct, _, _ = await load(f"http://{stub}", False, bodies, requests, 1)
                direct_p50 = percentile(direct, 50) or 0.0
                for path, patch in PREFIX_PATHS.items():
                    gateway = start_local_gateway(
                        work / f"{path}-{size}-{int(fresh)}", pods=[pod], single_hop=True, config_patch=patch
                    )
                    try:
                        lat, errors, cpu, _ = await measure_gateway(gateway, bodies, requests, warm=10)
                    finally:
                        gateway.stop()
                    total = sum(cpu.values())
                    per_proc = " + ".join(f"{k.split('-')[0]} {cpu[k]:.2f}" for k in sorted(cpu))
                    p50 = percentile(lat, 50) or 0.0
                    lines.append(
                        f"| {path} | {size // 1024} KB | {'fresh session' if fresh else 'next turn'} | "
                        f"{p50:.2f} | {percentile(lat, 99) or 0.0:.2f} | {p50 - direct_p50:+.2f} | "
                        f"{per_proc} = {total:.2f} | {1000 / total:.0f} | {errors} |"
                    )
                    print(lines[-1], f"(direct p50 {direct_p50:.2f})", flush=True)
    finally:
        stub_proc.terminate()
        await stub_proc.wait()
    return lines


def ext_proc_message_counts(stats: str) -> dict[str, int]:
    """Envoy's `ext_proc.stream_msgs_sent` / `_received` counters, summed over the filters."""
    out = {"sent": 0, "received": 0}
    for line in stats.splitlines():
        name, _, value = line.partition(": ")
        for kind in out:
            if name.endswith(f"ext_proc.stream_msgs_{kind}"):
                out[kind] += int(value)
    return out


def render(cells: list[Cell], stream_cells: list[Cell], command: str, load_avg: str) -> str:
    direct = {(c.concurrency, c.body_bytes): c for c in cells if c.setup.startswith("direct")}
    if not cells:
        return render_response_modes(stream_cells, [f"Measured with `{command}`, load {load_avg}.", ""])
    lines = [
        "## Gateway overhead",
        "",
        f"Measured with `{command}`: one stub pod answering at once (4 SSE tokens), a closed-loop",
        "HTTP/1.1 client (Python, httpx) on the same 2-core machine; Envoy runs with `--concurrency 1`.",
        "Added = this setup's latency minus direct-to-stub at the same concurrency and body size.",
        "CPU = utime+stime of the gateway's processes (Envoy, ext_proc services) over the run, per request;",
        "req/s per core = 1 s / that CPU (the client and the stub are not counted).",
        f"1-minute load average before/after: {load_avg} (shared machine).",
        "",
        "| setup | concurrency | body | p50 ms | p99 ms | added p50 ms | added p99 ms | req/s | gateway CPU ms/req | req/s per core | errors |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in cells:
        d = direct.get((c.concurrency, c.body_bytes))
        added = "" if c.setup.startswith("direct") or d is None else f"{c.p50_ms - d.p50_ms:+.2f}"
        added99 = "" if c.setup.startswith("direct") or d is None else f"{c.p99_ms - d.p99_ms:+.2f}"
        cpu = "" if c.cpu_ms_per_req is None else f"{c.cpu_ms_per_req:.2f}"
        per_core = "" if c.req_s_per_core is None else f"{c.req_s_per_core:,.0f}"
        lines.append(
            f"| {c.setup} | {c.concurrency} | {c.body_bytes // 1024} KB | {c.p50_ms:.2f} | {c.p99_ms:.2f} | "
            f"{added} | {added99} | {c.req_s:,.0f} | {cpu} | {per_core} | {c.errors} |"
        )
    return render_response_modes(stream_cells, [*lines, ""])


def render_response_modes(stream_cells: list[Cell], lines: list[str]) -> str:
    lines += [
        "What the ext_proc sees of the response (Envoy + the no-op ext_proc, 200-token streamed",
        "answers, 1 KB requests, concurrency 8). The EPP's pool routes ask for headers + trailers,",
        "which holds the stream (the in-flight slot) to the response's end.",
        "",
        "| ext_proc sees | requests | p50 ms | req/s | Envoy + ext_proc CPU ms/req (median, range) | errors |",
        "|---|---|---|---|---|---|",
    ]
    for label, _, _ in RESPONSE_MODES:
        runs = [c for c in stream_cells if c.setup == label]
        if not runs:
            continue
        cpu = sorted(c.cpu_ms_per_req or 0.0 for c in runs)
        spread = f" ({cpu[0]:.2f}-{cpu[-1]:.2f} over {len(runs)} rounds)" if len(runs) > 1 else ""
        lines.append(
            f"| {label} | {sum(c.requests for c in runs)} | {median([c.p50_ms for c in runs]):.2f} | "
            f"{median([c.req_s for c in runs]):,.0f} | {median(cpu):.2f}{spread} | {sum(c.errors for c in runs)} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["stub"]:
        parser = argparse.ArgumentParser(prog="bench.micro.overhead_gateway stub")
        parser.add_argument("--tokens", type=int, required=True)
        asyncio.run(serve_stub(parser.parse_args(argv[1:]).tokens))
        return 0
    if argv[:1] == ["split"]:
        parser = argparse.ArgumentParser(prog="bench.micro.overhead_gateway split")
        parser.add_argument("--requests", type=int, default=300)
        before = os.getloadavg()[0]
        lines = asyncio.run(run_split(parser.parse_args(argv[1:]).requests, 4))
        print("\n".join(lines))
        print(f"1-minute load average before/after: {before:.1f} / {os.getloadavg()[0]:.1f}")
        return 0
    if argv[:1] == ["agentic"]:
        parser = argparse.ArgumentParser(prog="bench.micro.overhead_gateway agentic")
        parser.add_argument("--requests", type=int, default=100)
        parser.add_argument("--sizes", default=",".join(str(n) for n in AGENTIC_SIZES), help="body bytes")
        args = parser.parse_args(argv[1:])
        before = os.getloadavg()[0]
        lines = asyncio.run(run_agentic(args.requests, 4, [int(n) for n in args.sizes.split(",")]))
        print("\n".join(lines))
        print(f"1-minute load average before/after: {before:.1f} / {os.getloadavg()[0]:.1f}")
        return 0
    if argv[:1] == ["noop-extproc"]:
        parser = argparse.ArgumentParser(prog="bench.micro.overhead_gateway noop-extproc")
        parser.add_argument("--port", type=int, required=True)
        args = parser.parse_args(argv[1:])
        asyncio.run(serve_noop(args.port))
        return 0
    parser = argparse.ArgumentParser(
        prog="python -m bench.micro.overhead_gateway", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--requests", type=int, default=300, help="per cell at concurrency 1 (x3 at 32)")
    parser.add_argument("--tokens", type=int, default=4)
    parser.add_argument("--stream-tokens", type=int, default=200)
    parser.add_argument("--doc", help="also write the section into this markdown file")
    parser.add_argument("--stream-only", action="store_true", help="only the response-mode table")
    parser.add_argument("--rounds", type=int, default=1, help="response-mode table: interleaved rounds")
    args = parser.parse_args(argv)
    if args.stream_only and args.doc:
        parser.error("--doc writes the whole section: run without --stream-only")
    before = os.getloadavg()[0]
    cells, stream_cells = asyncio.run(
        run_all(
            args.requests, args.tokens, args.stream_tokens, stream_only=args.stream_only, rounds=args.rounds
        )
    )
    load_avg = f"{before:.1f} / {os.getloadavg()[0]:.1f}"
    command = "python -m bench.micro.overhead_gateway " + shlex.join(argv)
    text = render(cells, stream_cells, command.strip(), load_avg)
    print(text)
    if args.doc:
        write_section(args.doc, "gateway-overhead", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
