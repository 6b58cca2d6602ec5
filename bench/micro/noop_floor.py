"""The floor under the EPP's CPU per request (issue #52): the same ext_proc servicer with a
processor that decides nothing (`overhead_gateway`'s no-op), behind Envoy in the shipped
single-hop shape (request body FULL_DUPLEX_STREAMED, response trailers sent), at concurrency 1
for each body size. What it costs per request is what grpc.aio's per-message machinery and the event
loop cost before any decision: the part no change inside the decision can remove.

    python -m bench.micro.noop_floor --rounds 4 --requests 300 --sizes 1024,65536,409600 --out FILE
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
from pathlib import Path
from typing import Any

from bench.micro import overhead_gateway as og


async def measured(
    setup: og.Setup, server: int, envoy: list[int], size: int, requests: int
) -> dict[str, float]:
    """`requests` bodies of `size` bytes through `setup` at concurrency 1: the ext_proc server's
    and Envoy's CPU per request (/proc utime + stime), and the latency's p50 / p99."""
    server0, envoy0 = og.cpu_seconds([server]), og.cpu_seconds(envoy)
    cell = (await og.measure(setup, (size,), (1,), requests, 4))[0]
    server1, envoy1 = og.cpu_seconds([server]), og.cpu_seconds(envoy)
    return {
        "server_cpu_ms": (server1 - server0) * 1000 / requests,
        "envoy_cpu_ms": (envoy1 - envoy0) * 1000 / requests,
        "p50_ms": cell.p50_ms,
        "p99_ms": cell.p99_ms,
    }


async def run(rounds: int, requests: int, sizes: list[int]) -> list[dict[str, Any]]:
    work = Path(tempfile.mkdtemp(prefix="noop-floor-"))
    stub_proc, stub = await og.start_stub(4)
    noop, port = og.start_noop_extproc(work / "noop")
    setup = await og.start_envoy_setup("noop", work / "envoy", stub, ("127.0.0.1", port), "NONE", "SEND")
    envoy = list(setup.pids)
    setup.pids = [*envoy, noop.popen.pid]
    rows: list[dict[str, Any]] = []
    try:
        for r in range(rounds):
            for size in sizes:
                cell = await measured(setup, noop.popen.pid, envoy, size, requests)
                rows.append({"round": r + 1, "body_bytes": size, **cell})
    finally:
        setup.stop()
        noop.stop()
        stub_proc.terminate()
        await stub_proc.wait()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--sizes", default="1024", help="body bytes, comma-separated")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    rows = asyncio.run(run(args.rounds, args.requests, [int(x) for x in args.sizes.split(",")]))
    text = json.dumps(rows, indent=1)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
