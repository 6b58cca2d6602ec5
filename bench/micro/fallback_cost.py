"""What `pools[].fallbackEndpoints` > 0 costs a request that is never retried.

With a fallback list the EPP must learn which pod served (a retry may have moved the request),
so the pool's routes ask Envoy for the response-headers event (docs/scheduling.md, "Retries"):
one more ext_proc message each way, and Envoy holds the response's first bytes until the EPP
replies. Two single-hop gateways over the same fast stub pod (bench.micro.overhead_gateway's),
one with `fallbackEndpoints: 0` and one with `1`, loaded in turn, `--rounds` times: client p50,
CPU of Envoy + the EPP per request, and Envoy's ext_proc messages per request.

python -m bench.micro.fallback_cost [--requests 300] [--rounds 5] [--concurrency 1]
"""

from __future__ import annotations

import argparse
import asyncio
import ssl
import tempfile
from collections.abc import Sequence
from pathlib import Path
from statistics import median
from typing import Any

import httpx

from bench.harness.stats import percentile
from bench.micro.overhead_gateway import (
    MODEL,
    cpu_seconds,
    ext_proc_message_counts,
    load,
    request_body,
    start_stub,
)
from devstack.launch import LocalGateway, start_local_gateway

FALLBACKS = (0, 1)


def _with_fallbacks(count: int) -> Any:
    def patch(config: dict[str, Any]) -> None:
        for pool in config["pools"]:
            pool["fallbackEndpoints"] = count

    return patch


async def _round(
    gateway: LocalGateway, body: bytes, requests: int, concurrency: int
) -> tuple[float, float, float]:
    """(p50 ms, Envoy + EPP CPU ms per request, ext_proc messages sent + received per request)."""
    verify = ssl.create_default_context(cafile=str(gateway.certs.ca))
    pids = [p.popen.pid for k, p in gateway.procs.items() if k != "fleet"]
    stats = f"http://127.0.0.1:{gateway.admin_port}/stats?filter=ext_proc.stream_msgs"
    async with httpx.AsyncClient() as admin:
        before = ext_proc_message_counts((await admin.get(stats)).text)
        cpu0 = cpu_seconds(pids)
        latencies, errors, _ = await load(gateway.url, verify, body, requests, concurrency)
        cpu = (cpu_seconds(pids) - cpu0) * 1000 / requests
        after = ext_proc_message_counts((await admin.get(stats)).text)
    if errors:
        raise RuntimeError(f"{errors} requests failed")
    msgs = sum(after[k] - before[k] for k in after) / requests
    return percentile(latencies, 50) or 0.0, cpu, msgs


async def run(requests: int, rounds: int, concurrency: int) -> list[str]:
    work = Path(tempfile.mkdtemp(prefix="bench-fallback-cost-"))
    stub_proc, stub = await start_stub(4)
    pod = {"name": "stub-0", "model": MODEL, "adapters": [], "dialect": "vllm", "address": stub}
    gateways: dict[int, LocalGateway] = {}
    results: dict[int, list[tuple[float, float, float]]] = {n: [] for n in FALLBACKS}
    try:
        for n in FALLBACKS:
            gateways[n] = start_local_gateway(
                work / f"fallback{n}", pods=[pod], single_hop=True, config_patch=_with_fallbacks(n)
            )
        body = request_body(1024, 4)
        for gateway in gateways.values():
            await load(
                gateway.url, ssl.create_default_context(cafile=str(gateway.certs.ca)), body, 50, concurrency
            )
        for r in range(rounds):
            for n in FALLBACKS if r % 2 == 0 else reversed(FALLBACKS):
                results[n].append(await _round(gateways[n], body, requests, concurrency))
                print(f"round {r + 1} fallbackEndpoints {n}: {results[n][-1]}", flush=True)
    finally:
        for gateway in gateways.values():
            gateway.stop()
        stub_proc.terminate()
        await stub_proc.wait()
    lines = [
        f"concurrency {concurrency}, {requests} requests x {rounds} rounds, 1 KB streamed chat, single-hop",
        "| fallbackEndpoints | p50 ms | Envoy + EPP CPU ms/req | ext_proc msgs/req (sent + received) |",
        "|---|---|---|---|",
    ]
    for n in FALLBACKS:
        cols = [[row[i] for row in results[n]] for i in range(3)]
        lines.append(
            f"| {n} | " + " | ".join(f"{median(c):.2f} [{min(c):.2f}-{max(c):.2f}]" for c in cols) + " |"
        )
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--concurrency", type=int, default=1)
    args = parser.parse_args(argv)
    print("\n".join(asyncio.run(run(args.requests, args.rounds, args.concurrency))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
