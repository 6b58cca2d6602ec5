"""Equal CPU for every router: `bench run --pin-router`.

Without it every router gets whatever the machine's cores leave: ours is five processes
(Envoy, BBR, the EPP, beside the fleet and the load generator), a peer one binary, and
contention costs the first more (bench/results-committed/contended/). With it, the router
under test (our Envoy + BBR + EPP, the peer's process, or Envoy alone for round-robin) gets
the first allowed CPU to itself, and the harness (this process: the load generator; the
simulated fleet, which inherits this process's affinity when it starts) the others. The router
is whatever processes this one started while the policy's target came up, found in /proc and
pinned thread by thread (`sched_setaffinity` sets one thread; later threads inherit it).
Each run summary records the split (`run.cpu_pinning`) beside the fleet's step lag
(`run.fleet_lag`) and the load generator's send lag (`stats.steady.lag_p99`), which show
whether the harness kept up on its share.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PROC = Path("/proc")


class PinningError(RuntimeError):
    """The machine cannot give the router a CPU of its own."""


@dataclass(frozen=True)
class CpuPlan:
    router: frozenset[int]
    harness: frozenset[int]


def cpu_plan() -> CpuPlan:
    """The first CPU this process may use for the router, the rest for the harness."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        raise PinningError(
            f"--pin-router needs at least 2 CPUs (router and harness); this process may use {cpus}"
        )
    return CpuPlan(frozenset(cpus[:1]), frozenset(cpus[1:]))


def _ppid(pid: int) -> int | None:
    try:
        stat = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    # "pid (comm) state ppid ...": comm may hold spaces or parentheses, so split after the last ")".
    return int(stat.rsplit(")", 1)[1].split()[1])


def descendants(pid: int) -> set[int]:
    """Every live process below `pid` (children, their children, ...)."""
    children: dict[int, list[int]] = {}
    for entry in PROC.iterdir():
        if entry.name.isdigit():
            parent = _ppid(int(entry.name))
            if parent is not None:
                children.setdefault(parent, []).append(int(entry.name))
    out: set[int] = set()
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in out:
                out.add(child)
                todo.append(child)
    return out


def pin_process(pid: int, cpus: frozenset[int]) -> None:
    """Every thread of `pid` onto `cpus` (a thread that ended meanwhile is skipped)."""
    for task in (PROC / str(pid) / "task").iterdir():
        try:
            os.sched_setaffinity(int(task.name), cpus)
        except (ProcessLookupError, FileNotFoundError):
            continue


@contextlib.contextmanager
def pinned_to(cpus: frozenset[int] | None) -> Iterator[None]:
    """This process (every thread) on `cpus` for the block, then back where it was; None: as is."""
    if cpus is None:
        yield
        return
    original = frozenset(os.sched_getaffinity(0))
    pin_process(os.getpid(), cpus)
    try:
        yield
    finally:
        pin_process(os.getpid(), original)


def _name(pid: int) -> str:
    try:
        return (PROC / str(pid) / "comm").read_text().strip()
    except OSError:
        return "?"


def affinity(pid: int) -> list[int]:
    try:
        return sorted(os.sched_getaffinity(pid))
    except ProcessLookupError:
        return []


def pin_router(started_before: set[int], cpus: frozenset[int]) -> list[dict[str, Any]]:
    """Pin the processes this one started since `started_before` was taken (the router under
    test) to `cpus`; returns them as the summary records them."""
    router = sorted(descendants(os.getpid()) - started_before)
    for pid in router:
        pin_process(pid, cpus)
    return [{"pid": pid, "name": _name(pid), "cpus": affinity(pid)} for pid in router]


def record(plan: CpuPlan, router: list[dict[str, Any]], fleet_external: bool) -> dict[str, Any]:
    """`run.cpu_pinning` of a summary: who ran on which CPUs, checked at the run's end."""
    return {
        "router_cpus": sorted(plan.router),
        "harness_cpus": sorted(plan.harness),
        "load_generator_cpus": affinity(os.getpid()),
        "fleet": "external (--worker-urls): not pinned" if fleet_external else "pinned with the harness",
        "router_processes": [{**p, "cpus_at_end": affinity(p["pid"])} for p in router],
    }
