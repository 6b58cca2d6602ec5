"""Bring up a scenario's simulated fleet through modelsim and yield its pod URLs.

A thin adapter: the simulator owns `modelsim.fleet` (`FleetSpec`, `run_fleet`); this module
only maps a scenario's `fleet:` block onto it. With `--worker-urls` the runner skips it and
uses pods that are already running.

The fleet runs in its own process (`python -m modelsim fleet`), not in the load generator's:
in one process the two shared a single core, and at the scenarios' rates (20-60 req/s of
streamed answers) that core saturated (the load generator's TLS + SSE parsing ~55 % of it,
the pods ~45 %), so the simulated engines fell behind the wall clock and every policy's TTFT
grew with the machine's load rather than with its routing. Apart, each has a core's worth.

A policy may need more of the fleet than the scenario's spec gives (`FleetNeeds`): KV events
(each pod publishes vLLM-format KV events on ZMQ, PUB and replay on ports the pod picks free on
loopback, reported in the ready file) and the shipped tokenizer (pods tokenize prompts with
modelsim/tokenizer_files/sim-llama3-12k instead of the approximate word-piece ids, so the EPP can
compute the same token ids and block hashes). The tokenizer changes the pods' ids and, a little,
their prompt tokens (the bench's pseudo-English is 0.97-1.03x the chars/4 target with it,
0.93-0.98x without: `python -m bench.probes.token_parity`), so `bench run` gives every policy of one
run the same fleet options (see `run_fleet_needs` there).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterable, Mapping
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml

from modelsim.build_tokenizer import NAME as SHIPPED_TOKENIZER
from modelsim.fleet import FleetSpec, SpecError

START_TIMEOUT_S = 60.0
# vLLM's --kv-events-config with port 0: each pod binds free loopback ports and reports them.
KV_EVENTS_FREE_PORTS: dict[str, Any] = {
    "enable_kv_cache_events": True,
    "endpoint": "tcp://127.0.0.1:0",
    "replay_endpoint": "tcp://127.0.0.1:0",
}


@dataclass(frozen=True)
class FleetNeeds:
    """What a policy needs of the simulated fleet beyond the scenario's own spec."""

    kv_events: bool = False  # every pod publishes KV events (KV_EVENTS_FREE_PORTS)
    tokenizer: bool = False  # every pod tokenizes with the shipped tokenizer (SHIPPED_TOKENIZER)

    def __or__(self, other: FleetNeeds) -> FleetNeeds:
        return FleetNeeds(self.kv_events or other.kv_events, self.tokenizer or other.tokenizer)

    @classmethod
    def union(cls, needs: Iterable[FleetNeeds]) -> FleetNeeds:
        out = cls()
        for need in needs:
            out = out | need
        return out

    def describe(self) -> dict[str, Any]:
        """For the run summary: what the fleet ran with beyond the scenario's spec."""
        return {**asdict(self), "tokenizer_name": SHIPPED_TOKENIZER if self.tokenizer else None}


def fleet_with(spec: Mapping[str, Any], needs: FleetNeeds) -> dict[str, Any]:
    """The scenario's fleet spec with `needs` applied to every pod entry (a pod's own
    `kv_events` / `tokenizer` setting is kept)."""
    out = dict(spec)
    if not (needs.kv_events or needs.tokenizer):
        return out
    pods = []
    for raw in spec.get("pods", []):
        pod = dict(raw) if isinstance(raw, Mapping) else raw
        if isinstance(pod, dict):
            if needs.kv_events:
                pod.setdefault("kv_events", dict(KV_EVENTS_FREE_PORTS))
            if needs.tokenizer:
                pod.setdefault("tokenizer", SHIPPED_TOKENIZER)
        pods.append(pod)
    out["pods"] = pods
    return out


class FleetUnavailable(RuntimeError):
    """The scenario's fleet cannot be started."""


@asynccontextmanager
async def running_fleet(spec: Mapping[str, Any]) -> AsyncIterator[list[str]]:
    """Start the fleet in a child process, yield its pod URLs once every pod listens."""
    async with running_fleet_pods(spec) as pods:
        yield [f"http://{pod['address']}" for pod in pods]


@asynccontextmanager
async def running_fleet_pods(spec: Mapping[str, Any]) -> AsyncIterator[list[dict[str, Any]]]:
    """As `running_fleet`, yielding the pods as the fleet reports them (modelsim's ready file:
    name, model, address, and `kv_events_port` / `kv_replay_port` when events are on)."""
    try:
        FleetSpec.from_dict(dict(spec))  # a bad spec is reported here, not by the child
    except SpecError as exc:
        raise FleetUnavailable(f"fleet: {exc}") from exc
    with tempfile.TemporaryDirectory(prefix="bench-fleet-") as tmp:
        spec_file, ready_file, log_file = (
            Path(tmp, "fleet.yaml"),
            Path(tmp, "ready.json"),
            Path(tmp, "fleet.log"),
        )
        child = await asyncio.to_thread(_spawn, spec, spec_file, ready_file, log_file)
        try:
            info = await _wait_ready(child, ready_file, log_file)
            yield list(info["pods"])
        finally:
            _stop(child)


def _spawn(
    spec: Mapping[str, Any], spec_file: Path, ready_file: Path, log_file: Path
) -> subprocess.Popen[bytes]:
    spec_file.write_text(yaml.safe_dump(dict(spec)))
    with log_file.open("wb") as log:  # the child keeps its own descriptor
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "modelsim",
                "fleet",
                "--spec",
                str(spec_file),
                "--ready-file",
                str(ready_file),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )


async def _wait_ready(child: subprocess.Popen[bytes], ready_file: Path, log_file: Path) -> dict[str, Any]:
    deadline = time.monotonic() + START_TIMEOUT_S
    while not await asyncio.to_thread(ready_file.exists):
        if child.poll() is not None:
            tail = (await asyncio.to_thread(log_file.read_text, errors="replace"))[-2000:]
            raise FleetUnavailable(f"modelsim fleet exited with {child.returncode}: {tail}")
        if time.monotonic() > deadline:
            raise FleetUnavailable(f"modelsim fleet not ready after {START_TIMEOUT_S:.0f} s")
        await asyncio.sleep(0.05)
    info: dict[str, Any] = json.loads(await asyncio.to_thread(ready_file.read_text))
    return info


def _stop(child: subprocess.Popen[bytes]) -> None:
    if child.poll() is None:
        child.terminate()
        try:
            child.wait(timeout=10)
        except subprocess.TimeoutExpired:
            child.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.wait(timeout=5)


async def fleet_lag(urls: list[str]) -> dict[str, Any] | None:
    """How far the simulated engines fell behind the wall clock during the run (modelsim's
    ``/sim/state``, wall milliseconds): the mean lag per step and the largest. A step starting
    later than ``max_lag_wall_s`` (20 ms) stretches the simulated timeline, so a max at 20 ms
    marks lost simulated time; None when the pods are not modelsim's."""
    import aiohttp

    pods: dict[str, dict[str, float]] = {}
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session:
            for url in urls:
                async with session.get(url.rstrip("/") + "/sim/state") as resp:
                    state = await resp.json()
                steps = max(1, int(state["steps"]))
                pods[str(state["pod"])] = {
                    "mean_lag_ms": round(float(state["lag_sum_wall_s"]) / steps * 1000, 3),
                    "max_lag_ms": round(float(state["max_lag_wall_s"]) * 1000, 3),
                    "steps": steps,
                }
    except (aiohttp.ClientError, TimeoutError, ValueError, KeyError, TypeError):
        return None
    return {
        "mean_lag_ms": max(p["mean_lag_ms"] for p in pods.values()) if pods else 0.0,
        "max_lag_ms": max(p["max_lag_ms"] for p in pods.values()) if pods else 0.0,
        "pods": pods,
    }
