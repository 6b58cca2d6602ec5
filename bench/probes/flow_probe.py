"""Flow-control probe: each pod's true state next to what the EPP believes, over time.

    python -m bench.probes.flow_probe --policy epp-flow-on --rate 15 --seconds 30 --seed 100

Replays a bounded prefix of the priority-tenants trace (bench/scenarios/priority-tenants.yaml)
through one flow policy and every `--every-ms` samples, side by side: each pod's engine state
(modelsim `GET /sim/state`: waiting, running, KV use), the EPP's view (`GET /debug/pool`:
scraped waiting/running, in-flight, the effective queue, finished since the last scrape) and
the EPP's flow-control queue length. Prints one line per sample and a summary of where the
two views diverge. A diagnostic tool (docs/scheduling.md, "Flow control"), not a benchmark.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from bench.harness.fleet import running_fleet
from bench.harness.loadgen import LoadGenConfig, run_trace, to_wall_clock
from bench.harness.scenario import load_scenario
from bench.harness.targets import TargetContext, load_plugins, make_target

SCENARIO = "bench/scenarios/priority-tenants.yaml"


async def _sample(client: httpx.AsyncClient, pods: list[str], debug_url: str, t0: float) -> dict[str, Any]:
    truth = await asyncio.gather(*(client.get(f"{u}/sim/state") for u in pods))
    view = (await client.get(debug_url)).json()
    by_addr = {e["address"]: e for e in view["endpoints"]}
    row: dict[str, Any] = {"t": round(time.perf_counter() - t0, 2), "flow_queue": view.get("flow_queue")}
    for i, (url, reply) in enumerate(zip(pods, truth, strict=True)):
        sim = reply.json()
        epp = by_addr[url.split("://", 1)[-1]]
        m = epp["metrics"] or {}
        row[f"p{i}"] = {
            "true_w": sim["waiting"],
            "true_r": sim["running"],
            "true_kv": round(sim["kv_usage"], 3),
            "lag": round(sim.get("max_lag_wall_s", 0.0), 2),
            "preempt": sim.get("num_preemptions"),
            "scr_w": m.get("waiting"),
            "scr_r": m.get("running"),
            "scr_kv": None if m.get("kv_usage") is None else round(m["kv_usage"], 3),
            "age": None if epp["metrics_age_s"] is None else round(epp["metrics_age_s"], 3),
            "inflight": epp["inflight_requests"],
            "queue": epp.get("queue"),
            "fin": epp.get("finished_since_scrape"),
        }
    return row


async def probe(args: argparse.Namespace) -> list[dict[str, Any]]:
    load_plugins(("bench.harness.flow_policies",))
    scenario = load_scenario(SCENARIO).with_seed(args.seed)
    scenario = dataclasses.replace(
        scenario, arrivals={**scenario.arrivals, "rate": args.rate}, duration_s=args.seconds
    )
    trace = to_wall_clock(scenario.trace(), float(scenario.fleet.get("time_scale", 1.0)))
    rows: list[dict[str, Any]] = []
    async with running_fleet(scenario.fleet) as pods:
        ctx = TargetContext(worker_urls=pods, work_dir=args.work, scenario=scenario)
        target = make_target(args.policy, ctx)
        await target.start()
        try:
            # The gateway the factory started: its EPP's admin port serves /debug/pool.
            port = _epp_admin_port(target)
            debug_url = f"http://127.0.0.1:{port}/debug/pool"
            config = LoadGenConfig(
                base_url=target_url(target), verify=False, concurrency=1024, timeout_s=120.0,
                max_wall_s=args.seconds + 60,
            )  # fmt: skip
            t0 = time.perf_counter()
            run = asyncio.create_task(run_trace(trace, config))
            async with httpx.AsyncClient(timeout=10.0) as client:
                while not run.done():
                    try:
                        rows.append(await _sample(client, pods, debug_url, t0))
                    except httpx.HTTPError as exc:  # a stalled pod or EPP: note it, keep going
                        print(f"t={time.perf_counter() - t0:6.2f} sample failed: {exc!r}", flush=True)
                    await asyncio.sleep(args.every_ms / 1000)
            result = await run
            print("cpu_s", json.dumps(_cpu_seconds(target.handle)))
        finally:
            await target.stop()
    codes: dict[str, int] = {}
    for r in result.results:
        key = f"{r.tag}:{r.status}"
        codes[key] = codes.get(key, 0) + 1
    print("outcomes", json.dumps(dict(sorted(codes.items()))))
    return rows


def _cpu_seconds(gateway: Any) -> dict[str, float]:
    """User+system CPU seconds so far of each gateway process and of this one (fleet + load)."""
    tick = os.sysconf("SC_CLK_TCK")
    out = {"fleet+loadgen": round(sum(os.times()[:2]), 1)}
    for name, proc in gateway.procs.items():
        with contextlib.suppress(OSError):
            fields = Path(f"/proc/{proc.popen.pid}/stat").read_text().rsplit(")", 1)[1].split()
            out[name] = round((int(fields[11]) + int(fields[12])) / tick, 1)
    return out


def _epp_admin_port(target: Any) -> int:
    gateway = target.handle  # a LocalGateway (bench.harness.gateway_policies.gateway_factory)
    return next(iter(gateway.epp_metrics_ports.values()))


def target_url(target: Any) -> str:
    return str(target.handle.url)


def report(rows: list[dict[str, Any]]) -> None:
    pods = sorted(k for k in rows[0] if k.startswith("p"))
    for row in rows:
        cells = [f"t={row['t']:6.2f} fq={row['flow_queue']}"]
        for p in pods:
            c = row[p]
            cells.append(
                f"{p}: true w/r={c['true_w']}/{c['true_r']} kv={c['true_kv']} lag={c['lag']} pre={c['preempt']} | "
                f"scr w/r={c['scr_w']}/{c['scr_r']} kv={c['scr_kv']} age={c['age']} "
                f"infl={c['inflight']} fin={c['fin']} q={c['queue']}"
            )
        print("  ".join(cells))
    busy = [r for r in rows if (r["flow_queue"] or 0) > 0]
    print(f"samples {len(rows)}, with requests queued in the EPP: {len(busy)}")
    for p in pods:
        if not busy:
            break
        idle_w = sum(1 for r in busy if r[p]["true_w"] == 0)
        gap = [r[p]["inflight"] - r[p]["true_w"] - r[p]["true_r"] for r in busy]
        print(
            f"{p}: while the EPP queued, true waiting was 0 in {idle_w}/{len(busy)} samples; "
            f"in-flight - true (waiting+running) mean {statistics.mean(gap):.1f} max {max(gap)}; "
            f"true running mean {statistics.mean(r[p]['true_r'] for r in busy):.1f}, "
            f"true KV mean {statistics.mean(r[p]['true_kv'] for r in busy):.2f}, "
            f"EPP queue estimate mean {statistics.mean((r[p]['queue'] or 0) for r in busy):.2f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policy", default="epp-flow-on")
    parser.add_argument("--rate", type=float, default=15.0)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--seed", type=int, default=100)
    parser.add_argument("--every-ms", type=float, default=100.0)
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "flow-probe")
    args = parser.parse_args()
    report(asyncio.run(probe(args)))


if __name__ == "__main__":
    main()
