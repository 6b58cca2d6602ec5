"""Instructions the EPP executes per request on the real request path, before against after:
a count that the machine's load does not move (bench/micro/hot_path.py's CPU seconds do, by
tens of percent on a shared machine).

The shipped default shape (single-hop EPP, streamed bodies, one fast stub pod) as in hot_path,
except that the EPP is restarted under `valgrind --tool=callgrind` on its own port (Envoy
reconnects) and the pod's metrics are scraped only every 0.5-0.8 s (a scrape is not a
request's cost, and under valgrind a request lasts ~50x longer). Per side and body size: warm
up, zero the counters (`callgrind_control -z`), send `--requests` at concurrency 1, dump
(`callgrind_control -d`): instructions of every EPP thread per request.

python -m bench.micro.hot_path_instructions --base CHECKOUT [--requests 100] [--sizes 1024,65536,409600]
    [--out FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import ssl
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, cast

from bench.micro.hot_path import SIZES, bodies_for, code_label, own_code
from bench.micro.overhead_gateway import MODEL, load, start_stub
from devstack.launch import Proc, grpc_serving, start_local_gateway

QUIET_SCRAPE = {"scrape": {"intervalMs": 500, "maxIntervalMs": 800, "timeoutMs": 5000}}  # below staleAfterMs


def control(flag: str, pid: int, stem: Path) -> set[Path]:
    """`callgrind_control FLAG PID`; the dumps beside `stem` before it."""
    before = set(stem.parent.glob(stem.name + "*"))
    subprocess.run(["callgrind_control", flag, str(pid)], check=True, capture_output=True)
    return before


def dumped_instructions(stem: Path, before: set[Path]) -> int:
    """The `summary:` (instructions) of the dump `callgrind_control -d` just wrote."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        new = sorted(set(stem.parent.glob(stem.name + "*")) - before)
        for path in new:
            match = re.search(r"^(?:summary|totals): (\d+)", path.read_text(errors="replace"), re.M)
            if match:
                return int(match.group(1))
        time.sleep(0.5)
    raise TimeoutError(f"no callgrind dump beside {stem}")


def under_callgrind(epp: Proc, env: Mapping[str, str] | None, stem: Path) -> Proc:
    """The EPP's own command line again, under callgrind (the original stopped first)."""
    argv = [str(a) for a in cast(Sequence[Any], epp.popen.args)]
    epp.stop()
    log = stem.with_suffix(".log").open("ab")
    popen = subprocess.Popen(
        ["valgrind", "--tool=callgrind", f"--callgrind-out-file={stem}.%p", *argv],
        env={**os.environ, **(env or {})},
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    log.close()
    port = int(argv[argv.index("--port") + 1])
    deadline = time.monotonic() + 900
    while not _serving(port):
        if popen.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the EPP under callgrind did not start (see {stem}.log)")
        time.sleep(1)
    return Proc("epp", popen, stem.with_suffix(".log"))


def _serving(port: int) -> bool:
    try:
        return grpc_serving(port)
    except Exception:  # not up yet
        return False


async def count_side(
    side: str, env: Mapping[str, str] | None, work: Path, stub: str, sizes: Sequence[int], requests: int
) -> dict[str, Any]:
    pod = {"name": "stub-0", "model": MODEL, "adapters": [], "dialect": "vllm", "address": stub}
    gateway = start_local_gateway(
        work / side, pods=[pod], single_hop=True, service_env=env, config_extra=QUIET_SCRAPE
    )
    out: dict[str, Any] = {}
    try:
        stem = work / f"{side}.callgrind"
        gateway.procs["epp"] = epp = under_callgrind(gateway.procs["epp"], env, stem)
        verify = ssl.create_default_context(cafile=str(gateway.certs.ca))
        for size in sizes:
            bodies = bodies_for(size, requests)
            for _ in range(60):  # until the restarted EPP has scraped the pod and routes
                _, errors, _ = await load(gateway.url, verify, bodies, 5, 1)
                if not errors:
                    break
            await load(gateway.url, verify, bodies, 20, 1)
            before = await asyncio.to_thread(control, "-z", epp.popen.pid, stem)
            _, errors, _ = await load(gateway.url, verify, bodies, requests, 1)
            await asyncio.to_thread(control, "-d", epp.popen.pid, stem)
            total = await asyncio.to_thread(dumped_instructions, stem, before)
            out[str(size)] = {
                "instructions_per_request": total / requests,
                "requests": requests,
                "errors": errors,
            }
            print(side, size, json.dumps(out[str(size)]), flush=True)
    finally:
        gateway.stop()
    return out


async def run(base: str | None, sizes: Sequence[int], requests: int) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="bench-hot-path-instr-"))
    stub_proc, stub = await start_stub(4)
    this = os.environ["PYTHONPATH"].split(os.pathsep)[0]
    result: dict[str, Any] = {"code": {"this": code_label(this), "base": code_label(base)}}
    try:
        if base:
            result["base"] = await count_side("base", {"PYTHONPATH": base}, work, stub, sizes, requests)
        result["this"] = await count_side("this", None, work, stub, sizes, requests)
    finally:
        stub_proc.terminate()
        await stub_proc.wait()
    return result


def render(result: Mapping[str, Any]) -> str:
    lines = [
        "| body | base: EPP instructions/request | this | change |",
        "|---|---|---|---|",
    ]
    for size, cell in result["this"].items():
        now = cell["instructions_per_request"]
        was = result.get("base", {}).get(size, {}).get("instructions_per_request")
        change = f"{(now - was) / was:+.1%}" if was else ""
        was_text = f"{was / 1e6:.2f} M" if was else "-"
        lines.append(f"| {int(size) // 1024} KB | {was_text} | {now / 1e6:.2f} M | {change} |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m bench.micro.hot_path_instructions", description=__doc__.split("\n")[0]
    )
    ap.add_argument("--base", help="a checkout of the code to compare against (its EPP runs from it)")
    ap.add_argument("--requests", type=int, default=100)
    ap.add_argument("--sizes", default=",".join(map(str, SIZES)), help="body bytes")
    ap.add_argument("--out", type=Path, help="write the counts as JSON here")
    args = ap.parse_args(argv)
    base = str(Path(args.base).resolve()) if args.base else None
    out = args.out.resolve() if args.out else None
    own_code()
    result = asyncio.run(run(base, [int(s) for s in args.sizes.split(",")], args.requests))
    if out:
        out.write_text(json.dumps(result, indent=1) + "\n")
    print(render(result), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
