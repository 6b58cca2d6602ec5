"""The request path's own cost (issue #52), before against after in one interleaved campaign.

The shipped default shape (single-hop EPP, streamed request bodies, the default profile) fronts
one fast stub pod (bench/micro/overhead_gateway.py's: it answers at once with a few SSE tokens),
so what is left is the proxy path. Each round runs, in turn: Envoy alone (round-robin to the
stub, the latency baseline), direct to the stub (the rate sweep's baseline), then each side
(`--base CHECKOUT`: the gateway's services run from that checkout, by PYTHONPATH; "this": this
file's checkout), the sides' order alternating between rounds. Per side and body size, at concurrency 1:
p50/p99, added over Envoy alone, CPU per request of the EPP and of Envoy (/proc utime+stime),
Envoy's ext_proc messages per request; then an open-loop rate sweep at 1 KB (workers_bench's
steps): the highest rate held with p99 added (over direct-to-stub at that rate) under 10 ms.
Bodies: a 1 KB chat prompt; at 64 and 400 KB a running agent session's next turn
(overhead_gateway's agentic bodies: a conversation whose last message is new per request).

python -m bench.micro.hot_path --base CHECKOUT --rounds 3 [--requests 300] [--sizes 1024,65536,409600]
    [--rates 200,400,...] [--seconds 3] --out DIR          # DIR/round-N.json
python -m bench.micro.hot_path --report DIR/round-*.json   # median [min-max] over the rounds
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import ssl
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from bench.harness.stats import percentile
from bench.micro.overhead_gateway import (
    MODEL,
    agentic_bodies,
    cpu_seconds,
    load,
    measure_gateway,
    request_body,
    start_envoy_setup,
    start_stub,
)
from bench.micro.workers_bench import ADDED_P99_LIMIT_MS, _spread, open_loop
from devstack.launch import start_local_gateway

SIZES = (1024, 64 * 1024, 400 * 1024)
RATES = (200, 400, 600, 800, 1000, 1200, 1400)


def bodies_for(size: int, requests: int) -> list[bytes]:
    if size <= 4096:
        return [request_body(size, 4)]
    return agentic_bodies(size, 4, requests, fresh=False)


async def envoy_alone(work: Path, stub: str, sizes: Sequence[int], requests: int) -> dict[str, Any]:
    """Envoy round-robin to the stub, no ext_proc: the latency the gateway adds on top of."""
    setup = await start_envoy_setup("envoy alone", work, stub, None)
    out: dict[str, Any] = {}
    try:
        for size in sizes:
            bodies = bodies_for(size, requests)
            await load(setup.url, setup.verify, bodies, 30, 1)
            cpu0 = cpu_seconds(setup.pids)
            lat, errors, _ = await load(setup.url, setup.verify, bodies, requests, 1)
            out[str(size)] = {
                "p50_ms": percentile(lat, 50),
                "p99_ms": percentile(lat, 99),
                "errors": errors,
                "envoy_cpu_ms": (cpu_seconds(setup.pids) - cpu0) * 1000 / requests,
            }
    finally:
        setup.stop()
    return out


async def sweep(
    url: str, ctx: ssl.SSLContext | bool, rates: Sequence[int], seconds: float, pids: Sequence[int]
) -> list[dict[str, Any]]:
    """Open-loop steps at 1 KB; stops after two missed steps in a row."""
    body = request_body(1024, 4)
    steps: list[dict[str, Any]] = []
    missed = 0
    for rate in rates:
        cpu0 = cpu_seconds(pids)
        lat, errors, wall = await open_loop(url, ctx, body, rate, seconds)
        done = len(lat) + errors
        steps.append(
            {
                "offered": rate,
                "achieved": len(lat) / wall if wall else 0.0,
                "errors": errors,
                "p50_ms": percentile(lat, 50) or 0.0,
                "p99_ms": percentile(lat, 99) or 0.0,
                "epp_cpu_ms": (cpu_seconds(pids) - cpu0) * 1000 / done if done else None,
            }
        )
        missed = 0 if steps[-1]["achieved"] >= 0.95 * rate and not errors else missed + 1
        if missed >= 2 or steps[-1]["achieved"] < 0.8 * rate:
            break
    return steps


async def run_side(
    side: str, env: Mapping[str, str] | None, work: Path, stub: str, args: argparse.Namespace
) -> dict[str, Any]:
    pod = {"name": "stub-0", "model": MODEL, "adapters": [], "dialect": "vllm", "address": stub}
    gateway = start_local_gateway(work / side, pods=[pod], single_hop=True, service_env=env)
    out: dict[str, Any] = {"sizes": {}}
    try:
        for size in args.sizes:
            lat, errors, cpu, (sent, received) = await measure_gateway(
                gateway, bodies_for(size, args.requests), args.requests
            )
            out["sizes"][str(size)] = {
                "p50_ms": percentile(lat, 50),
                "p99_ms": percentile(lat, 99),
                "errors": errors,
                "epp_cpu_ms": cpu["epp"],
                "envoy_cpu_ms": cpu["envoy"],
                "msgs_sent": sent,
                "msgs_received": received,
            }
            print(side, size, json.dumps(out["sizes"][str(size)]), flush=True)
        if args.rates:
            ctx = ssl.create_default_context(cafile=str(gateway.certs.ca))
            await open_loop(gateway.url, ctx, request_body(1024, 4), 50, 2)  # warm connections
            out["steps"] = await sweep(
                gateway.url, ctx, args.rates, args.seconds, [gateway.procs["epp"].popen.pid]
            )
            print(side, "steps", json.dumps(out["steps"]), flush=True)
    finally:
        gateway.stop()
    return out


async def run_round(args: argparse.Namespace, index: int) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix=f"bench-hot-path-{index}-"))
    stub_proc, stub = await start_stub(4)
    sides: list[tuple[str, Mapping[str, str] | None]] = [("this", None)]
    if args.base:
        sides.insert(0, ("base", {"PYTHONPATH": args.base}))
    if index % 2:
        sides.reverse()
    result: dict[str, Any] = {"round": index, "order": [s for s, _ in sides], "load": [os.getloadavg()[0]]}
    result["code"] = {
        "this": code_label(os.environ["PYTHONPATH"].split(os.pathsep)[0]),
        "base": code_label(args.base),
    }
    try:
        result["envoy_alone"] = await envoy_alone(work / "envoy", stub, args.sizes, args.requests)
        direct = {}
        for rate in args.rates:
            lat, _, _ = await open_loop(
                f"http://{stub}", False, request_body(1024, 4), rate, min(args.seconds, 2)
            )
            direct[str(rate)] = percentile(lat, 99) or 0.0
        result["direct_p99_ms"] = direct
        for side, env in sides:
            result[side] = await run_side(side, env, work, stub, args)
    finally:
        stub_proc.terminate()
        await stub_proc.wait()
    result["load"].append(os.getloadavg()[0])
    return result


def highest_held(steps: Sequence[dict[str, Any]], direct: Mapping[str, float]) -> int:
    """The highest offered rate held below the first missed step (0: the first missed)."""
    best = 0
    for s in steps:
        added = s["p99_ms"] - direct.get(str(s["offered"]), 0.0)
        if s["errors"] or s["achieved"] < 0.95 * s["offered"] or added >= ADDED_P99_LIMIT_MS:
            break
        best = s["offered"]
    return best


def report(paths: Sequence[Path]) -> str:
    """One row per side and body size; the rate columns once per side (median [min-max])."""
    rounds = [json.loads(p.read_text()) for p in paths]
    sides = [s for s in ("base", "this") if all(s in r for r in rounds)]
    sizes = list(rounds[0]["this"]["sizes"])
    lines = [
        "| side | body | EPP CPU ms/req | Envoy CPU ms/req | Envoy alone CPU ms/req | ext_proc msgs/req "
        "sent / received | p50 ms | p99 ms | added p50 ms | added p99 ms | errors |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for side in sides:
        for size in sizes:
            cells = [r[side]["sizes"][size] for r in rounds]
            alone = [r["envoy_alone"][size] for r in rounds]
            add50 = [c["p50_ms"] - a["p50_ms"] for c, a in zip(cells, alone, strict=True)]
            add99 = [c["p99_ms"] - a["p99_ms"] for c, a in zip(cells, alone, strict=True)]
            lines.append(
                f"| {side} | {int(size) // 1024} KB | {_spread([c['epp_cpu_ms'] for c in cells])} "
                f"| {_spread([c['envoy_cpu_ms'] for c in cells])} | {_spread([a['envoy_cpu_ms'] for a in alone])} "
                f"| {_spread([c['msgs_sent'] for c in cells], 1)} / {_spread([c['msgs_received'] for c in cells], 1)} "
                f"| {_spread([c['p50_ms'] for c in cells])} | {_spread([c['p99_ms'] for c in cells])} "
                f"| {_spread(add50)} | {_spread(add99)} | {sum(c['errors'] for c in cells)} |"
            )
    if all("steps" in r.get(s, {}) for r in rounds for s in sides):
        lines += [
            "",
            "| side | highest rate held (p99 added < 10 ms), req/s | EPP CPU ms/req at 200 req/s "
            "| at half the highest held: p50 / p99 added ms | rounds |",
            "|---|---|---|---|---|",
        ]
        for side in sides:
            best, at200, half50, half99 = [], [], [], []
            for r in rounds:
                steps, direct = r[side]["steps"], r["direct_p99_ms"]
                held = highest_held(steps, direct)
                best.append(held)
                at200 += [s["epp_cpu_ms"] for s in steps if s["offered"] == 200 and s["epp_cpu_ms"]]
                near = min(steps, key=lambda s: abs(s["offered"] - held / 2)) if held else None
                if near is not None:
                    half50.append(near["p50_ms"] - r["envoy_alone"][sizes[0]]["p50_ms"])
                    half99.append(near["p99_ms"] - direct[str(near["offered"])])
            lines.append(
                f"| {side} | {_spread(best, 0)} | {_spread(at200)} | {_spread(half50)} / {_spread(half99)} "
                f"| {len(rounds)} |"
            )
    loads = [x for r in rounds for x in r["load"]]
    lines += [
        "",
        f"1-minute load average over the rounds: {min(loads):.1f}-{max(loads):.1f} (2 shared cores).",
    ]
    return "\n".join(lines) + "\n"


def code_label(checkout: str | None) -> str | None:
    """A checkout's commit (and whether its tree differs from it): no machine paths in results."""
    if checkout is None:
        return None
    git = ["git", "-C", checkout]
    head = subprocess.run(
        [*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    dirty = subprocess.run(
        [*git, "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True
    )
    return f"{head or 'unknown'}{' (modified)' if dirty.stdout.strip() else ''}"


def own_code() -> None:
    """Every service started from here runs the code of this file's checkout (or, by `--base`,
    another's): its root goes first on PYTHONPATH, and the working directory becomes one without
    packages, since `python -m` puts the working directory ahead of PYTHONPATH."""
    root = str(Path(__file__).resolve().parents[2])
    os.environ["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [os.environ.get("PYTHONPATH")])])
    os.chdir(tempfile.mkdtemp(prefix="bench-hot-path-"))


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.micro.hot_path", description=__doc__.split("\n")[0])
    ap.add_argument("--base", help="a checkout of the code to compare against (its services run from it)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--requests", type=int, default=300, help="per side and body size, concurrency 1")
    ap.add_argument("--sizes", default=",".join(map(str, SIZES)), help="body bytes")
    ap.add_argument(
        "--rates", default=",".join(map(str, RATES)), help="open-loop steps at 1 KB ('' for none)"
    )
    ap.add_argument("--seconds", type=float, default=3.0, help="per rate step")
    ap.add_argument("--out", type=Path, help="write round-N.json files here")
    ap.add_argument("--report", type=Path, nargs="+", help="only print the tables of these files")
    args = ap.parse_args(argv)
    if args.report:
        print(report(args.report), end="")
        return 0
    args.base = str(Path(args.base).resolve()) if args.base else None
    args.out = args.out.resolve() if args.out else None
    own_code()
    args.sizes = [int(s) for s in args.sizes.split(",")]
    args.rates = [int(r) for r in args.rates.split(",") if r]
    paths = []
    for index in range(args.rounds):
        result = asyncio.run(run_round(args, index))
        if args.out:
            args.out.mkdir(parents=True, exist_ok=True)
            path = args.out / f"round-{index + 1}.json"
            path.write_text(json.dumps(result, indent=1) + "\n")
            paths.append(path)
    if paths:
        print(report(paths), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
