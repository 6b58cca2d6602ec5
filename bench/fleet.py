"""Bring up a scenario's simulated fleet through modelsim and yield its pod URLs.

A thin adapter: the simulator owns `modelsim.fleet` (`FleetSpec`, `run_fleet`); this module
only maps a scenario's `fleet:` block onto it. With `--worker-urls` the runner skips it and
uses pods that are already running.

The fleet runs in its own process (`python -m modelsim fleet`), not in the load generator's:
in one process the two shared a single core, and at the scenarios' rates (20-60 req/s of
streamed answers) that core saturated (the load generator's TLS + SSE parsing ~55 % of it,
the pods ~45 %), so the simulated engines fell behind the wall clock and every policy's TTFT
grew with the machine's load rather than with its routing. Apart, each has a core's worth.
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
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import yaml

from modelsim.fleet import FleetSpec, SpecError

START_TIMEOUT_S = 60.0


class FleetUnavailable(RuntimeError):
    """The scenario's fleet cannot be started."""


@asynccontextmanager
async def running_fleet(spec: Mapping[str, Any]) -> AsyncIterator[list[str]]:
    """Start the fleet in a child process, yield its pod URLs once every pod listens."""
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
            yield [f"http://{pod['address']}" for pod in info["pods"]]
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
