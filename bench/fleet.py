"""Bring up a scenario's simulated fleet through modelsim and yield its pod URLs.

A thin adapter: the simulator owns `modelsim.fleet` (`FleetSpec`, `run_fleet`); this module
only maps a scenario's `fleet:` block onto it. With `--worker-urls` the runner skips it and
uses pods that are already running.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

from modelsim.fleet import FleetSpec, SpecError, run_fleet


class FleetUnavailable(RuntimeError):
    """The scenario's fleet cannot be started."""


@asynccontextmanager
async def running_fleet(spec: Mapping[str, Any]) -> AsyncIterator[list[str]]:
    try:
        fleet_spec = FleetSpec.from_dict(dict(spec))
    except SpecError as exc:
        raise FleetUnavailable(f"fleet: {exc}") from exc
    async with run_fleet(fleet_spec) as fleet:
        yield [pod.url for pod in fleet.pods]
