"""Chaos soak: mixed traffic through the whole gateway while a schedule breaks it, then leak checks.

`python -m bench.probes.chaos_soak --minutes 10 --out soak.json` (`make soak`). The gateway:
the real Envoy (fed by the xDS server), BBR, two EPP replicas of one pool with two ext_proc
workers each, sharing their state through a real redis-server, and three simulated pods, each
in its own process so that it can be killed and started again on its address. The traffic
(bench/probes/chaos_traffic.py): chat, streamed chat, Anthropic messages, long bodies, clients
that abandon a stream. The schedule (`SCHEDULE`, at fractions of the run) kills a pod, edits
the live config, kills a replica, a worker, stops the store, kills another pod, writes an invalid
config, kills the other replica, each undone after a while; the last fault ends before 90 % of
the run, so the tail runs clean.

Every request's interval is held against the fault windows (injection to recovery +
`GRACE_S`): a failure outside every window is unaccounted for (the soak's verdict counts them).
At the end, after the load: each replica's in-flight (its own and its peers'), Envoy's active
requests to the pool, the pods' running and waiting requests, the in-flight hashes left in the
store, and every process's RSS and open files at its first and last sample.
It exits non-zero when a failure falls outside every window or something is left in flight.
`python -m bench.probes.chaos_report` renders the table in docs/reliability.md from the output.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import redis

from bench.probes.chaos_traffic import Outcome, drive
from devstack.launch import (
    LocalGateway,
    Proc,
    free_port,
    grpc_serving,
    start_fleet,
    start_local_gateway,
    wait_until,
)
from devstack.redis_server import RedisServer, start_redis
from gateway import heaptrace

MODEL, POOL = "llama-3.1-8b-instruct", "llama-3-1-8b-instruct"
PODS = 3
TIME_SCALE = 20.0
KEY_PREFIX = "igw:soak"
GRACE_S = 5.0  # after a recovery, failures still count against the fault (reconnects, ejections)
# (fraction of the run, fault, seconds until it is undone)
SCHEDULE: tuple[tuple[float, str, float], ...] = (
    (0.06, "kill_pod:0", 20.0),
    (0.16, "config_edit", 15.0),
    (0.26, "kill_replica:1", 10.0),
    (0.36, "kill_worker:0", 0.0),
    (0.46, "stop_store", 15.0),
    (0.58, "kill_pod:1", 20.0),
    (0.68, "config_invalid", 10.0),
    (0.78, "kill_replica:0", 10.0),
)


@dataclass
class Window:
    fault: str
    start: float
    end: float = float("inf")  # recovered + GRACE_S

    def overlaps(self, o: Outcome) -> bool:
        return o.start <= self.end and o.end >= self.start


@dataclass
class Chaos:
    """The running gateway and what the schedule acts on."""

    gw: LocalGateway
    store: RedisServer
    fleets: list[Proc]
    pod_specs: list[dict[str, Any]]
    workdir: Path
    windows: list[Window] = field(default_factory=list)
    restarts: int = 0

    async def run_fault(self, name: str, undo_after_s: float) -> None:
        window = Window(name, time.monotonic())
        self.windows.append(window)
        kind, _, arg = name.partition(":")
        undo = await asyncio.to_thread(getattr(self, kind), int(arg) if arg else None)
        if undo_after_s:
            await asyncio.sleep(undo_after_s)
        if undo is not None:
            await asyncio.to_thread(undo)
        window.end = time.monotonic() + GRACE_S

    # ---- faults: each returns what undoes it (or None), blocking calls (run in a thread) -----
    def kill_pod(self, i: int) -> Callable[[], None]:
        self.fleets[i].popen.kill()
        self.fleets[i].popen.wait(10)

        def restart() -> None:
            self.restarts += 1
            workdir = self.workdir / f"pod-{i}-{self.restarts}"
            workdir.mkdir()
            self.fleets[i], _ = start_fleet(workdir, {"time_scale": TIME_SCALE, "pods": [self.pod_specs[i]]})

        return restart

    def kill_replica(self, i: int) -> Callable[[], None]:
        name = self.gw.epp_replica_names(POOL)[i]
        self.gw.procs[name].popen.kill()
        self.gw.procs[name].popen.wait(10)

        def restart() -> None:
            proc = self.gw.restart(name)
            port = self.gw.epp_replica_ports[POOL][i]
            wait_until(lambda: grpc_serving(port), 60, name, proc.popen)

        return restart

    def kill_worker(self, i: int) -> None:
        pid = self.gw.procs[self.gw.epp_replica_names(POOL)[i]].popen.pid
        workers = children(pid)
        os.kill(workers[0], signal.SIGKILL)
        wait_until(
            lambda: len(children(pid)) == len(workers) and workers[0] not in children(pid), 60, "worker"
        )

    def stop_store(self, _: int | None) -> Callable[[], None]:
        self.store.stop()
        return self.store.restart

    def config_edit(self, _: int | None) -> Callable[[], None]:
        original = self.gw.config_path.read_text()
        config = self.gw.read_config()
        config["pools"][0]["fallbackEndpoints"] = 1  # Envoy's routes and the EPPs' picks change
        config["admission"] = {"retryAfterSeconds": 2}
        self.gw.write_config(config)
        return lambda: self._write_text(original)

    def config_invalid(self, _: int | None) -> Callable[[], None]:
        original = self.gw.config_path.read_text()
        self._write_text("pools: 5\n")
        return lambda: self._write_text(original)

    def _write_text(self, text: str) -> None:
        tmp = self.gw.config_path.with_suffix(".tmp")
        tmp.write_text(text)
        os.replace(tmp, self.gw.config_path)

    def processes(self) -> dict[str, int]:
        """name -> pid of every process now: the gateway's, each EPP's workers (named by pid: a
        restarted worker is another process), the pods, the store."""
        out = {name: p.popen.pid for name, p in self.gw.procs.items() if p.popen.poll() is None}
        for name in self.gw.epp_replica_names(POOL):
            if name in out:
                out.update({f"{name}/worker {pid}": pid for pid in children(out[name])})
        out.update({f"pod-{i}": f.popen.pid for i, f in enumerate(self.fleets) if f.popen.poll() is None})
        if self.store.popen.poll() is None:
            out["redis"] = self.store.popen.pid
        return out


def children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def resources(pid: int) -> dict[str, int] | None:
    try:
        return {**heaptrace.memory_kib(pid), "fds": len(list(Path(f"/proc/{pid}/fd").iterdir()))}
    except (OSError, KeyError, ValueError):
        return None


async def sample(chaos: Chaos, every_s: float, series: dict[str, list[dict[str, Any]]], t0: float) -> None:
    """Per process incarnation ("name pid"): its RSS and fds every `every_s` until cancelled."""
    while True:
        for name, pid in chaos.processes().items():
            res = resources(pid)
            if res is not None:
                key = name if name.endswith(f" {pid}") else f"{name} {pid}"
                series.setdefault(key, []).append({"minute": round((time.monotonic() - t0) / 60, 2), **res})
        await asyncio.sleep(every_s)


async def schedule(chaos: Chaos, seconds: float) -> None:
    start = time.monotonic()
    running: list[asyncio.Task[None]] = []
    for at, name, undo_s in SCHEDULE:
        await asyncio.sleep(max(0.0, start + at * seconds - time.monotonic()))
        running.append(asyncio.create_task(chaos.run_fault(name, undo_s)))
    await asyncio.gather(*running)


async def until_true(check: Callable[[], Awaitable[bool]], within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if await check():
            return True
        await asyncio.sleep(0.2)
    return False


async def end_state(chaos: Chaos, client: httpx.AsyncClient) -> dict[str, Any]:
    """In-flight everywhere once the load has stopped (each waited for up to 60 s), and the
    store's in-flight hashes."""
    gw = chaos.gw

    async def replicas() -> dict[str, int]:
        out = {}
        for name, port in zip(gw.epp_replica_names(POOL), gw.epp_replica_metrics_ports[POOL], strict=True):
            endpoints = (await client.get(f"http://127.0.0.1:{port}/debug/pool")).json()["endpoints"]
            out[name] = sum(e["inflight_requests"] for e in endpoints)
        return out

    async def envoy_active() -> int:
        stat = f"cluster.pool-{POOL}.upstream_rq_active"
        text = (
            await client.get(f"http://127.0.0.1:{gw.admin_port}/stats", params={"filter": f"^{stat}$"})
        ).text
        return sum(int(line.rpartition(": ")[2]) for line in text.splitlines() if line.startswith(stat))

    async def pods() -> dict[str, float]:
        out = {}
        for pod in gw.pods:
            text = (await client.get(f"http://{pod['address']}/metrics")).text
            out[pod["name"]] = sum(
                float(line.rpartition(" ")[2])
                for line in text.splitlines()
                if line.startswith(("vllm:num_requests_running", "vllm:num_requests_waiting"))
            )
        return out

    async def zero() -> bool:
        return (
            not any((await replicas()).values())
            and await envoy_active() == 0
            and not any((await pods()).values())
        )

    async def envoy_connections() -> dict[str, int]:
        """Envoy's open connections (what its file descriptors hold), per cluster and listener."""
        params = {"filter": "cx_active$"}
        text = (await client.get(f"http://127.0.0.1:{gw.admin_port}/stats", params=params)).text
        values = {
            k: int(v) for k, _, v in (line.rpartition(": ") for line in text.splitlines()) if v.isdigit()
        }
        return {k: v for k, v in values.items() if v}

    settled = await until_true(zero, 60.0)
    return {
        "settled": settled,
        "replicas_inflight": await replicas(),
        "envoy_active": await envoy_active(),
        "envoy_connections": await envoy_connections(),
        "pods_running_or_waiting": await pods(),
        "store": store_state(chaos.store),
    }


def store_state(store: RedisServer) -> dict[str, Any]:
    """The pool's keys in the store, and the requests its in-flight hashes still hold."""
    client = redis.Redis.from_url(store.url, decode_responses=True)
    keys = sorted(client.scan_iter(f"{KEY_PREFIX}:*"))
    held = 0
    for key in keys:
        if ":inflight:" in key:
            for pod, value in client.hgetall(key).items():
                if not pod.startswith(("busy:", "lora:")) and "," in value:
                    held += int(value.split(",")[0])
    return {"keys": keys, "inflight_requests_held": held}


def account(outcomes: list[Outcome], windows: list[Window], t0: float) -> dict[str, Any]:
    by_kind: dict[str, Counter[str]] = {}
    for o in outcomes:
        by_kind.setdefault(o.kind, Counter())[o.result] += 1
    per_window = Counter[str]()
    unaccounted = []
    for o in (o for o in outcomes if o.failed):
        hit = [w.fault for w in windows if w.overlaps(o)]
        per_window.update(hit)
        if not hit:
            unaccounted.append({"kind": o.kind, "result": o.result, "at_s": round(o.start - t0, 2)})
    return {
        "by_kind": {k: dict(v) for k, v in sorted(by_kind.items())},
        "failed": sum(o.failed for o in outcomes),
        "errors_per_window": dict(per_window),
        "unaccounted": unaccounted,
    }


async def soak(chaos: Chaos, args: argparse.Namespace) -> dict[str, Any]:
    outcomes: list[Outcome] = []
    series: dict[str, list[dict[str, Any]]] = {}
    seconds = args.minutes * 60
    async with chaos.gw.client(timeout=120, limits=httpx.Limits(max_connections=args.max_outstanding)) as c:
        await drive(c, [MODEL], args.warmup_s, args.rps, args.seed, args.max_outstanding, lambda o: None)
        t0 = time.monotonic()
        sampler = asyncio.create_task(sample(chaos, args.sample_s, series, t0))
        faults = asyncio.create_task(schedule(chaos, seconds))
        shed = await drive(
            c, [MODEL], seconds, args.rps, args.seed + 1, args.max_outstanding, outcomes.append
        )
        await faults
        elapsed = time.monotonic() - t0
        async with httpx.AsyncClient(timeout=5) as admin:
            end = await end_state(chaos, admin)
        await asyncio.sleep(args.sample_s)  # one more sample, settled
        sampler.cancel()
    return {
        "minutes": round(elapsed / 60, 2),
        "rps_target": args.rps,
        "requests": len(outcomes),
        "shed_by_client": shed,
        **account(outcomes, chaos.windows, t0),
        "faults": [
            {"fault": w.fault, "start_s": round(w.start - t0, 1), "end_s": round(w.end - t0, 1)}
            for w in chaos.windows
        ],
        "end": end,
        "resources": {
            key: {"first": rows[0], "last": rows[-1], "samples": len(rows), "series": rows}
            for key, rows in sorted(series.items())
        },
    }


def start(workdir: Path) -> Chaos:
    store = start_redis(workdir / "redis")
    fleets, pods, specs = [], [], []
    for i in range(PODS):
        spec = {"name": f"llama-{i}", "model": MODEL, "profile": "h100-llama3.1-8b", "port": free_port()}
        (workdir / f"pod-{i}").mkdir(parents=True)
        proc, listed = start_fleet(workdir / f"pod-{i}", {"time_scale": TIME_SCALE, "pods": [spec]})
        fleets.append(proc)
        pods += listed
        specs.append(spec)
    shared = {"redis": store.url, "publishIntervalMs": 50, "ttlMs": 1000, "keyPrefix": KEY_PREFIX}
    gw = start_local_gateway(
        workdir / "gw", pods=pods, config_extra={"sharedState": shared}, epp_replicas=2, epp_workers=2
    )
    return Chaos(gw, store, fleets, specs, workdir)


def main() -> None:
    parser = argparse.ArgumentParser(description="bounded chaos soak through the full local gateway")
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--rps", type=float, default=8.0)
    parser.add_argument("--max-outstanding", type=int, default=48)
    parser.add_argument("--warmup-s", type=float, default=15.0)
    parser.add_argument("--sample-s", type=float, default=30.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", type=Path, help="write the JSON summary here too")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="chaos-soak-") as tmp:
        chaos = start(Path(tmp))
        try:
            summary = asyncio.run(soak(chaos, args))
        finally:
            chaos.gw.stop()
            for f in chaos.fleets:
                f.stop()
            chaos.store.stop()
    text = json.dumps(summary, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text)
    problems = verdict(summary)
    if problems:
        raise SystemExit("soak failed: " + "; ".join(problems))


def verdict(summary: dict[str, Any]) -> list[str]:
    """What makes `make soak` fail: a failure outside every fault window, anything left in
    flight, or requests still held in the store's in-flight hashes."""
    end = summary["end"]
    problems = []
    if summary["unaccounted"]:
        problems.append(f"{len(summary['unaccounted'])} failures outside every fault window")
    if not end["settled"]:
        problems.append("in-flight not back to 0")
    if end["store"]["inflight_requests_held"]:
        problems.append(f"{end['store']['inflight_requests_held']} requests held in the store")
    return problems


if __name__ == "__main__":
    main()
