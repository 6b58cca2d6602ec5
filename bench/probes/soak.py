"""Soak: steady load through the whole local gateway for a bounded time, then check for leaks.

`python -m bench.probes.soak --minutes 30` (`make soak`). Reports unexpected errors, the EPPs'
in-flight counts after the load stops (must be 0), and each process's RSS and open file
descriptors after warm-up, every `--sample-s` and at the end (Linux /proc).

`--tracemalloc bbr` (or `bbr,epp`) runs those services with `gateway.heaptrace` on (a snapshot every
`--sample-s`, baseline just after the warm-up) and adds each one's traced-heap series and top
growing allocation sites to the summary: traced bytes flat while RSS grows means allocator
growth, not a Python leak. Set `MALLOC_ARENA_MAX` in the environment to compare arenas; the
summary records it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

from devstack.launch import FAST_FLEET as FLEET
from devstack.launch import LocalGateway, start_local_gateway
from gateway import heaptrace

MODELS = ["llama-3.1-8b-instruct", "sql-lora", "qwen3-32b"]


def resources(pid: int) -> dict[str, int]:
    """RSS (total, anonymous, file-backed) in KiB and open file descriptors of one process."""
    return {**heaptrace.memory_kib(pid), "fds": len(list(Path(f"/proc/{pid}/fd").iterdir()))}


def snapshot(gw: LocalGateway) -> dict[str, dict[str, int]]:
    return {name: resources(proc.popen.pid) for name, proc in gw.procs.items() if proc.popen.poll() is None}


async def one_request(client: httpx.AsyncClient, rng: random.Random, outcomes: Counter[str]) -> None:
    model = rng.choice(MODELS)
    body = {
        "model": model,
        "messages": [{"role": "user", "content": f"soak {rng.random()}"}],
        "max_tokens": rng.randint(4, 64),
    }
    try:
        if rng.random() < 0.3:
            body["stream"] = True
            async with client.stream("POST", "/v1/chat/completions", json=body) as r:
                done = False
                async for line in r.aiter_lines():
                    done = done or line == "data: [DONE]"
                outcomes["200" if r.status_code == 200 and done else f"stream_{r.status_code}"] += 1
        else:
            r = await client.post("/v1/chat/completions", json=body)
            outcomes[str(r.status_code)] += 1
    except httpx.HTTPError as exc:
        outcomes[f"exception_{type(exc).__name__}"] += 1


# At most this many requests in flight, one per client connection. Arrivals beyond it are shed
# and counted, not queued in httpx's pool: with a queue there, a soak on a loaded machine fell
# behind and never caught up (1,800 requests in 35 min, Envoy idle, the driver busy).
MAX_OUTSTANDING = 64
SHED = "shed_by_client"


async def drive(gw: LocalGateway, seconds: float, rps: float, seed: int) -> Counter[str]:
    rng = random.Random(seed)
    outcomes: Counter[str] = Counter()
    tasks: set[asyncio.Task[None]] = set()
    async with gw.client(limits=httpx.Limits(max_connections=MAX_OUTSTANDING)) as client:
        start = time.monotonic()
        sent = 0
        while (now := time.monotonic()) - start < seconds:
            due = int((now - start) * rps)
            while sent < due:
                sent += 1
                if len(tasks) >= MAX_OUTSTANDING:
                    outcomes[SHED] += 1
                    continue
                task = asyncio.create_task(one_request(client, rng, outcomes))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            await asyncio.sleep(0.01)
        await asyncio.gather(*tasks)
    return outcomes


SERIES_COLUMNS = ("rss_kib", "rss_anon_kib", "rss_file_kib", "fds")


async def sample_every(gw: LocalGateway, every_s: float, series: dict[str, list[list[float]]]) -> None:
    """Append [minutes since start, *SERIES_COLUMNS] per process every `every_s` until cancelled."""
    start = time.monotonic()
    while True:
        minutes = round((time.monotonic() - start) / 60, 2)
        for name, res in snapshot(gw).items():
            series.setdefault(name, []).append([minutes, *(res[c] for c in SERIES_COLUMNS)])
        await asyncio.sleep(every_s)


async def main_phase(
    gw: LocalGateway, seconds: float, rps: float, seed: int, every_s: float
) -> tuple[Counter[str], dict[str, list[list[float]]]]:
    series: dict[str, list[list[float]]] = {}
    sampler = asyncio.create_task(sample_every(gw, every_s, series))
    try:
        outcomes = await drive(gw, seconds, rps, seed)
    finally:
        sampler.cancel()
    return outcomes, series


HEAP_COLUMNS = (
    "rss_kib",
    "rss_anon_kib",
    "traced_kib",
    "tracemalloc_overhead_kib",
    "malloc_in_use_kib",
    "malloc_free_kib",
    "threads",
)


def trace_summary(trace_dir: Path, names: dict[int, str], started_at: float) -> dict[str, Any]:
    """Per traced process: one row of HEAP_COLUMNS per sample (minutes since the load began),
    and the top growing allocation sites at the last sample."""
    out: dict[str, Any] = {}
    for path in sorted(trace_dir.glob("*.jsonl")):
        records = [json.loads(line) for line in path.read_text().splitlines() if line]
        if not records:
            continue
        name = names.get(records[0]["pid"], path.stem)
        last = records[-1]
        out[name] = {
            "columns": ["minutes", *HEAP_COLUMNS],
            "series": [
                [round((r["unix_time"] - started_at) / 60, 2), *(r.get(c) for c in HEAP_COLUMNS)]
                for r in records
            ],
            "top_growth_since_baseline": last["top"][:10] if last["kind"] != "baseline" else [],
        }
    return out


def inflight(gw: LocalGateway) -> dict[str, int]:
    out = {}
    for pool, port in gw.epp_metrics_ports.items():
        endpoints = httpx.get(f"http://127.0.0.1:{port}/debug/pool", timeout=5).json()["endpoints"]
        out[pool] = sum(e["inflight_requests"] for e in endpoints)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description="bounded soak through the full local gateway")
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--rps", type=float, default=20.0, help="steady request rate")
    parser.add_argument("--warmup-s", type=float, default=20.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", type=Path, help="write the JSON summary here too")
    parser.add_argument("--sample-s", type=float, default=60.0, help="RSS (and heap) sampling period")
    parser.add_argument(
        "--tracemalloc",
        metavar="SERVICES",
        help="run these services (comma-separated: bbr,epp) with tracemalloc snapshots",
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="soak-") as tmp:
        trace_dir = Path(tmp) / "tracemalloc"
        if args.tracemalloc:  # the services read these at start (gateway.heaptrace)
            os.environ[heaptrace.ENV_DIR] = str(trace_dir)
            os.environ[heaptrace.ENV_PROGS] = args.tracemalloc
            os.environ[heaptrace.ENV_INTERVAL] = str(args.sample_s)
            # Start-up takes a few seconds: the baseline lands just after the warm-up.
            os.environ[heaptrace.ENV_WARMUP] = str(args.warmup_s + 15)
        gw = start_local_gateway(Path(tmp), fleet=FLEET)
        try:
            warm = asyncio.run(drive(gw, args.warmup_s, args.rps, args.seed))
            before = snapshot(gw)
            started, started_at = time.monotonic(), time.time()
            outcomes, series = asyncio.run(
                main_phase(gw, args.minutes * 60, args.rps, args.seed + 1, args.sample_s)
            )
            elapsed = time.monotonic() - started
            time.sleep(1.0)
            after = snapshot(gw)
            left = inflight(gw)
            names = {proc.popen.pid: name for name, proc in gw.procs.items()}
        finally:
            gw.stop()
        traced = trace_summary(trace_dir, names, started_at) if args.tracemalloc else None
    shed = outcomes.pop(SHED, 0)
    total = sum(outcomes.values())
    summary = {
        "minutes": round(elapsed / 60, 2),
        "rps_target": args.rps,
        "malloc_arena_max": os.environ.get("MALLOC_ARENA_MAX"),
        "tracemalloc": args.tracemalloc,
        "requests": total,
        "shed_by_client": shed,
        "warmup_requests": sum(warm.values()) - warm[SHED],
        "outcomes": dict(outcomes),
        "unexpected_errors": total - outcomes["200"],
        "inflight_after": left,
        "resources_before": before,
        "resources_after": after,
        "drift": {
            name: {k: after[name][k] - before[name][k] for k in before[name]}
            for name in before
            if name in after
        },
        "rss_series": {"columns": ["minutes", *SERIES_COLUMNS], **series},
    }
    if traced is not None:
        summary["heap"] = traced
    text = json.dumps(summary, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
