"""One EPP process per pool vs several (active-active replicas sharing in-flight via Redis).

The full local gateway (Envoy + BBR + N EPP replicas) fronts one fast stub pod (answers at
once, a few SSE tokens), so the EPP's per-request work is what scales. Closed-loop load at a
fixed concurrency; per setup: req/s, client p50/p99, CPU per request of the EPP processes
(their sum), of the whole gateway, and of redis-server (/proc/<pid>/stat utime+stime). The
setups take turns `--rounds` times so machine load drifts over all of them alike; the load
average is printed before and after (the cores are shared with whatever else runs).

Reading the figures: each busy replica makes up to 1 / publishIntervalMs (50) Redis round trips a
second (~0.2-0.4 ms of event-loop CPU each at 16-100 pods on a loaded 2-core machine:
bench/micro/shared_state_bench.py), a cost per second, not per request: it shows as extra CPU per
request at low request rates and fades as each replica's rate grows.

python -m bench.micro.replicas_bench [--setups 1 2 2-inflight] [--requests 1500] [--concurrency 32]
    [--rounds 2]
(a setup is a replica count; `-inflight`: share in-flight counts only, not prefix decisions)
"""

from __future__ import annotations

import argparse
import asyncio
import os
import ssl
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from statistics import median

import httpx
from prometheus_client.parser import text_string_to_metric_families

from bench.harness.stats import percentile
from bench.micro.overhead_gateway import MODEL, cpu_seconds, load, request_body, start_stub
from devstack.launch import LocalGateway, start_local_gateway
from devstack.redis_server import RedisServer, start_redis

IDLE_WINDOW_S = 2.0


@dataclass
class Run:
    replicas: int
    shared: bool
    prefix_shared: bool
    requests: int
    errors: int
    req_s: float
    p50_ms: float
    p99_ms: float
    epp_cpu_ms: float  # per request, all EPP replicas together
    epp_idle_ms_s: float  # their CPU per second of wall time with no traffic (scrapes, Redis loop)
    gateway_cpu_ms: float  # Envoy + BBR + EPPs, per request
    redis_cpu_ms: float
    split: list[float]  # share of the requests each replica decided

    @property
    def net_epp_cpu_ms(self) -> float:
        """EPP CPU per request minus what the replicas burn idle over the run's duration."""
        seconds = self.requests / self.req_s if self.req_s else 0.0
        return self.epp_cpu_ms - self.epp_idle_ms_s * seconds / self.requests

    @property
    def label(self) -> str:
        label = f"{self.replicas} EPP{'s' if self.replicas > 1 else ''}"
        if self.shared:
            label += " + Redis (in-flight" + (" + prefix decisions)" if self.prefix_shared else " only)")
        return label


def _routed(gw: LocalGateway, pool: str) -> list[float]:
    """Requests each replica has decided (its inference_objective_request_total)."""
    out = []
    for port in gw.epp_replica_metrics_ports[pool]:
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
        out.append(
            sum(
                s.value
                for family in text_string_to_metric_families(text)
                for s in family.samples
                if s.name == "inference_objective_request_total" and s.labels.get("model_name") == MODEL
            )
        )
    return out


async def one_run(
    gw: LocalGateway,
    redis: RedisServer | None,
    replicas: int,
    prefix: bool,
    requests: int,
    concurrency: int,
    tokens: int,
) -> Run:
    pool = next(iter(gw.epp_ports))
    epp_pids = [gw.procs[name].popen.pid for name in gw.epp_replica_names(pool)]
    all_pids = [p.popen.pid for p in gw.procs.values()]
    redis_pids = [redis.popen.pid] if redis is not None else []
    verify = ssl.create_default_context(cafile=str(gw.certs.ca))
    body = request_body(1024, tokens)
    await load(gw.url, verify, body, concurrency * 4, concurrency)  # warm-up
    idle0, t0 = cpu_seconds(epp_pids), time.perf_counter()
    await asyncio.sleep(IDLE_WINDOW_S)
    idle = (cpu_seconds(epp_pids) - idle0) / (time.perf_counter() - t0)
    before = _routed(gw, pool)
    epp0, all0, redis0 = cpu_seconds(epp_pids), cpu_seconds(all_pids), cpu_seconds(redis_pids)
    latencies, errors, wall = await load(gw.url, verify, body, requests, concurrency)
    epp, total, rcpu = (
        cpu_seconds(epp_pids) - epp0,
        cpu_seconds(all_pids) - all0,
        cpu_seconds(redis_pids) - redis0,
    )
    routed = [a - b for a, b in zip(_routed(gw, pool), before, strict=True)]
    return Run(
        replicas,
        redis is not None,
        prefix,
        requests,
        errors,
        len(latencies) / wall if wall else 0.0,
        percentile(latencies, 50) or 0.0,
        percentile(latencies, 99) or 0.0,
        epp * 1000 / requests,
        idle * 1000,
        total * 1000 / requests,
        rcpu * 1000 / requests,
        [r / max(1.0, sum(routed)) for r in routed],
    )


async def run(
    setups: Sequence[str], requests: int, concurrency: int, rounds: int, tokens: int
) -> list[list[Run]]:
    work = Path(tempfile.mkdtemp(prefix="bench-replicas-"))
    stub_proc, stub = await start_stub(tokens)
    redis = start_redis(work / "redis")
    pod = {"name": "stub-0", "model": MODEL, "adapters": [], "dialect": "vllm", "address": stub}
    gateways: list[tuple[int, bool, LocalGateway, RedisServer | None]] = []
    try:
        for setup in setups:
            count, _, variant = setup.partition("-")
            n, prefix = int(count), variant != "inflight"
            shared = {"redis": redis.url, "keyPrefix": f"bench{setup}", "prefixIndex": prefix}
            extra = {"sharedState": shared} if n > 1 else None
            gw = start_local_gateway(work / f"gw-{setup}", pods=[pod], epp_replicas=n, config_extra=extra)
            gateways.append((n, prefix, gw, redis if n > 1 else None))
        await asyncio.sleep(1.0)
        results: list[list[Run]] = [[] for _ in gateways]
        for _ in range(rounds):
            for i, (n, prefix, gw, r) in enumerate(gateways):
                result = await one_run(gw, r, n, prefix, requests, concurrency, tokens)
                results[i].append(result)
                print(
                    f"{result.label}: {result.req_s:.0f} req/s, p50 {result.p50_ms:.1f} ms, p99 {result.p99_ms:.1f} ms, "
                    f"EPP {result.epp_cpu_ms:.3f} ms CPU/req (idle {result.epp_idle_ms_s:.0f} ms/s), gateway {result.gateway_cpu_ms:.3f}, "
                    f"redis {result.redis_cpu_ms:.3f}, split {[round(s, 2) for s in result.split]}, "
                    f"errors {result.errors}",
                    flush=True,
                )
        return results
    finally:
        for _, _, gw, _ in gateways:
            gw.stop()
        redis.stop()
        stub_proc.terminate()
        await stub_proc.wait()


def summary(results: list[list[Run]]) -> str:
    lines = [
        "| setup | req/s | p50 ms | p99 ms | EPP CPU ms/req | EPP idle CPU ms/s | EPP CPU ms/req net of idle "
        "| gateway CPU ms/req | redis CPU ms/req | errors |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for runs in results:

        def med(attr: str, runs: list[Run] = runs) -> float:
            return median(getattr(r, attr) for r in runs)

        lines.append(
            f"| {runs[0].label} | {med('req_s'):.0f} | {med('p50_ms'):.1f} | {med('p99_ms'):.1f} | "
            f"{med('epp_cpu_ms'):.3f} | {med('epp_idle_ms_s'):.0f} | {med('net_epp_cpu_ms'):.3f} | "
            f"{med('gateway_cpu_ms'):.3f} | {med('redis_cpu_ms'):.3f} | "
            f"{sum(r.errors for r in runs)} |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--setups", nargs="+", default=["1", "2", "2-inflight"])
    parser.add_argument("--requests", type=int, default=1500)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=4)
    args = parser.parse_args(argv)
    print(f"load before: {os.getloadavg()}", flush=True)
    results = asyncio.run(run(args.setups, args.requests, args.concurrency, args.rounds, args.tokens))
    print(f"load after: {os.getloadavg()}  (cores: {os.cpu_count()})")
    print(summary(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
