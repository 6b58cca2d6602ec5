"""The multi-core EPP (epp/workers/processes.py) against one EPP process: CPU per request and the highest
request rate held with p99 added latency under 10 ms.

The full single-hop gateway (Envoy + one EPP, streamed bodies) fronts one fast stub pod
(bench/micro/overhead_gateway.py's, which answers at once with a few SSE tokens), so what is
left is the proxy path. For each setup an open-loop client offers a stepped request rate
(1 KB bodies unless --body-bytes) for a few seconds per step; per step: achieved rate, p50/p99 latency, p99 added
(minus the direct-to-stub p99 at that rate, measured first), errors, and the CPU time of every
EPP process (the scheduling process and its workers; /proc utime+stime) per request. A rate is
held when every request succeeded, the achieved rate is within 5 % of the offered one and the
p99 added is under 10 ms.

python -m bench.micro.workers_bench --workers 1,2 [--rates 100,200,...] [--seconds 6] [--body-bytes 1024]
    [--out FILE]
python -m bench.micro.workers_bench --report FILE...    # the tables (median [min-max] over files)

`--workers 0` runs the gateway without passing a worker count (the code before this feature,
when this file is run from that code's checkout).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import ssl
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import aiohttp

from bench.harness.stats import percentile
from bench.micro.overhead_gateway import MODEL, cpu_seconds, request_body, start_stub
from devstack.launch import start_local_gateway

RATES = (100, 200, 300, 400, 500, 600, 700, 800, 1000)
ADDED_P99_LIMIT_MS = 10.0
MAX_IN_FLIGHT = 512


@dataclass
class Step:
    setup: str
    offered: int
    achieved: float
    requests: int
    errors: int
    p50_ms: float
    p99_ms: float
    p99_added_ms: float
    epp_cpu_ms_per_req: float | None
    # The scheduling process alone (with workers: the part one core must carry, whatever N).
    scheduler_cpu_ms_per_req: float | None = None

    @property
    def held(self) -> bool:
        return (
            self.errors == 0
            and self.achieved >= 0.95 * self.offered
            and self.p99_added_ms < ADDED_P99_LIMIT_MS
        )


async def open_loop(
    url: str, ssl_ctx: ssl.SSLContext | bool, body: bytes, rate: int, seconds: float
) -> tuple[list[float], int, float]:
    """Send `rate` requests a second for `seconds`, each at its scheduled time (open loop)."""
    n = int(rate * seconds)
    latencies: list[float] = []
    errors = 0
    gate = asyncio.Semaphore(MAX_IN_FLIGHT)
    connector = aiohttp.TCPConnector(limit=0, ssl=ssl_ctx)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=30)) as session:

        async def one() -> None:
            nonlocal errors
            async with gate:
                started = time.perf_counter()
                try:
                    async with session.post(
                        f"{url}/v1/chat/completions", data=body, headers={"content-type": "application/json"}
                    ) as reply:
                        await reply.read()
                        ok = reply.status == 200
                except (TimeoutError, aiohttp.ClientError):
                    ok = False
                if ok:
                    latencies.append((time.perf_counter() - started) * 1000)
                else:
                    errors += 1

        await asyncio.gather(*(one() for _ in range(min(rate // 10 + 1, 64))))  # warm connections
        latencies.clear()
        errors = 0
        start = time.perf_counter()
        tasks = []
        for i in range(n):
            delay = start + i / rate - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.ensure_future(one()))
        await asyncio.gather(*tasks)
        wall = time.perf_counter() - start
    return latencies, errors, wall


def process_tree(pid: int) -> list[int]:
    """`pid` and its children (the EPP's workers)."""
    out = [pid]
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return out
    for child in children:
        out += process_tree(int(child))
    return out


async def run_setup(
    name: str,
    workers: int,
    work: Path,
    stub: str,
    rates: Sequence[int],
    seconds: float,
    direct_p99: dict[int, float],
    body_bytes: int = 1024,
) -> list[Step]:
    pod = {"name": "stub-0", "model": MODEL, "adapters": [], "dialect": "vllm", "address": stub}
    extra: dict[str, Any] = {"epp_workers": workers} if workers > 0 else {}
    gateway = start_local_gateway(work / name.replace(" ", "-"), pods=[pod], single_hop=True, **extra)
    steps = []
    try:
        ctx = ssl.create_default_context(cafile=str(gateway.certs.ca))
        body = request_body(body_bytes, 4)
        epp = gateway.procs["epp"].popen.pid
        await open_loop(gateway.url, ctx, body, 50, 2)  # warm: scrapes seen, connections open
        for rate in rates:
            pids = process_tree(epp)
            cpu0, own0 = cpu_seconds(pids), cpu_seconds([epp])
            lat, errors, wall = await open_loop(gateway.url, ctx, body, rate, seconds)
            cpu = cpu_seconds(process_tree(epp)) - cpu0  # a replaced worker's time is lost: none expected
            own = cpu_seconds([epp]) - own0
            done = len(lat) + errors
            p99 = percentile(lat, 99) or 0.0
            step = Step(
                name, rate, len(lat) / wall if wall else 0.0, done, errors, percentile(lat, 50) or 0.0, p99,
                p99 - direct_p99[rate], cpu * 1000 / done if done else None,
                own * 1000 / done if done else None,
            )  # fmt: skip
            steps.append(step)
            print(json.dumps(asdict(step)), flush=True)
            if not step.held and step.achieved < 0.8 * rate:
                break  # far past saturation: higher steps only queue
    finally:
        gateway.stop()
    return steps


async def run(
    workers: Sequence[int], rates: Sequence[int], seconds: float, label: str, body_bytes: int = 1024
) -> list[Step]:
    work = Path(tempfile.mkdtemp(prefix="bench-workers-"))
    stub_proc, stub = await start_stub(4)
    steps: list[Step] = []
    try:
        direct_p99 = {}
        for rate in rates:
            body = request_body(body_bytes, 4)
            lat, _, _ = await open_loop(f"http://{stub}", False, body, rate, min(seconds, 3))
            direct_p99[rate] = percentile(lat, 99) or 0.0
            print(
                json.dumps({"setup": "direct to stub", "offered": rate, "p99_ms": direct_p99[rate]}),
                flush=True,
            )
        for count in workers:
            name = f"{label} (no --workers)" if count == 0 else f"{label} workers={count}"
            steps += await run_setup(name, count, work, stub, rates, seconds, direct_p99, body_bytes)
    finally:
        stub_proc.terminate()
        await stub_proc.wait()
    return steps


def summary(steps: Sequence[Step]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for setup in dict.fromkeys(s.setup for s in steps):
        mine = [s for s in steps if s.setup == setup]
        held = [s for s in mine if s.held]
        best = max(held, key=lambda s: s.offered) if held else None
        cpu = [s.epp_cpu_ms_per_req for s in mine if s.epp_cpu_ms_per_req is not None and s.held]
        out[setup] = {
            "highest_rate_held": best.offered if best else 0,
            "p99_added_ms_at_it": round(best.p99_added_ms, 2) if best else None,
            "epp_cpu_ms_per_req_median_over_held_steps": round(sorted(cpu)[len(cpu) // 2], 3)
            if cpu
            else None,
        }
    return out


def _spread(values: Sequence[float], digits: int = 2) -> str:
    """median [min-max] over the rounds."""
    if not values:
        return "-"
    ordered = sorted(values)
    mid = (
        ordered[len(ordered) // 2]
        if len(ordered) % 2
        else (ordered[len(ordered) // 2 - 1] + ordered[len(ordered) // 2]) / 2
    )
    if len(ordered) == 1:
        return f"{mid:.{digits}f}"
    return f"{mid:.{digits}f} [{ordered[0]:.{digits}f}-{ordered[-1]:.{digits}f}]"


def _sustained(steps: Sequence[dict[str, Any]]) -> int:
    """The highest offered rate below the first step missed (0: the first missed)."""
    out = 0
    for step in sorted(steps, key=lambda s: s["offered"]):
        if not step["held"]:
            break
        out = step["offered"]
    return out


def report(paths: Sequence[Path]) -> str:
    """Markdown tables over every round's JSON (`--out` files): the summary per setup, then
    per offered rate the p99 added and the EPP CPU per request."""
    rounds = [json.loads(p.read_text()) for p in paths]
    setups = list(dict.fromkeys(s["setup"] for r in rounds for s in r["steps"]))
    lines = [
        "| setup | highest rate held, req/s | every step up to it held, req/s | EPP CPU ms/req at 200 req/s "
        "| of it the scheduling process | EPP CPU ms/req at the highest held | rounds |",
        "|---|---|---|---|---|---|---|",
    ]
    for setup in setups:
        mine = [[s for s in r["steps"] if s["setup"] == setup] for r in rounds]
        mine = [m for m in mine if m]
        best = [max((s["offered"] for s in m if s["held"]), default=0) for m in mine]
        sustained = [_sustained(m) for m in mine]
        at200 = [
            s["epp_cpu_ms_per_req"]
            for m in mine
            for s in m
            if s["offered"] == 200 and s["epp_cpu_ms_per_req"]
        ]
        at_best = [
            s["epp_cpu_ms_per_req"]
            for m, b in zip(mine, best, strict=True)
            for s in m
            if s["offered"] == b and s["epp_cpu_ms_per_req"]
        ]
        own = [
            s["scheduler_cpu_ms_per_req"]
            for m in mine
            for s in m
            if s["offered"] == 200 and s.get("scheduler_cpu_ms_per_req")
        ]
        lines.append(
            f"| {setup} | {_spread(best, 0)} | {_spread(sustained, 0)} | {_spread(at200)} | {_spread(own)} "
            f"| {_spread(at_best)} | {len(mine)} |"
        )
    rates = sorted({s["offered"] for r in rounds for s in r["steps"]})
    lines += ["", "| setup | " + " | ".join(f"{r}/s" for r in rates) + " |", "|---|" + "---|" * len(rates)]
    for setup in setups:
        cells = []
        for rate in rates:
            steps = [s for r in rounds for s in r["steps"] if s["setup"] == setup and s["offered"] == rate]
            if not steps:
                cells.append("-")
                continue
            added = _spread([s["p99_added_ms"] for s in steps], 1)
            cpu = _spread([s["epp_cpu_ms_per_req"] for s in steps if s["epp_cpu_ms_per_req"]], 2)
            held = sum(s["held"] for s in steps)
            cells.append(f"{added} ms / {cpu} ms ({held}/{len(steps)} held)")
        lines.append(f"| {setup} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m bench.micro.workers_bench", description=__doc__.split("\n")[0]
    )
    ap.add_argument("--workers", default="1,2", help="comma-separated worker counts (0: do not pass one)")
    ap.add_argument("--rates", default=",".join(map(str, RATES)), help="offered req/s steps")
    ap.add_argument("--seconds", type=float, default=6.0, help="per step")
    ap.add_argument("--body-bytes", type=int, default=1024, help="request body size (a chat prompt of 'x's)")
    ap.add_argument("--label", default="after", help="setup name prefix (e.g. before / after)")
    ap.add_argument("--out", type=Path, help="write every step and the summary as JSON here")
    ap.add_argument("--report", type=Path, nargs="+", help="only print the tables of these --out files")
    args = ap.parse_args(argv)
    if args.report:
        print(report(args.report), end="")
        return 0
    workers = [int(w) for w in args.workers.split(",")]
    rates = [int(r) for r in args.rates.split(",")]
    steps = asyncio.run(run(workers, rates, args.seconds, args.label, args.body_bytes))
    result = {"steps": [asdict(s) | {"held": s.held} for s in steps], "summary": summary(steps)}
    print(json.dumps(result["summary"], indent=1))
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
