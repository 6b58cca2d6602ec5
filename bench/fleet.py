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
        child = _spawn(spec, Path(tmp))
        try:
            deadline = time.monotonic() + START_TIMEOUT_S
            while (info := _ready(child, Path(tmp))) is None:
                if time.monotonic() > deadline:
                    raise FleetUnavailable(f"modelsim fleet not ready after {START_TIMEOUT_S:.0f} s")
                await asyncio.sleep(0.05)
            yield [f"http://{pod['address']}" for pod in info["pods"]]
        finally:
            _stop(child)


def _spawn(spec: Mapping[str, Any], tmp: Path) -> subprocess.Popen[bytes]:
    spec_file = tmp / "fleet.yaml"
    spec_file.write_text(yaml.safe_dump(dict(spec)))
    with (tmp / "fleet.log").open("wb") as log:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "modelsim",
                "fleet",
                "--spec",
                str(spec_file),
                "--ready-file",
                str(tmp / "ready.json"),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )


def _ready(child: subprocess.Popen[bytes], tmp: Path) -> dict[str, Any] | None:
    """The fleet's ready info once written; FleetUnavailable if the child died first."""
    ready_file = tmp / "ready.json"
    if ready_file.exists():
        info: dict[str, Any] = json.loads(ready_file.read_text())
        return info
    if child.poll() is not None:
        tail = (tmp / "fleet.log").read_text(errors="replace")[-2000:]
        raise FleetUnavailable(f"modelsim fleet exited with {child.returncode}: {tail}")
    return None


def _stop(child: subprocess.Popen[bytes]) -> None:
    if child.poll() is None:
        child.terminate()
        try:
            child.wait(timeout=10)
        except subprocess.TimeoutExpired:
            child.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.wait(timeout=5)
