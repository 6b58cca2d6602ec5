"""`bench run --pin-router`: the router's processes (every thread) on one CPU, the harness on
the others, recorded in the summary; a clear error where the machine has one CPU."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from bench.__main__ import main
from bench.harness.pinning import PinningError, cpu_plan, descendants, pin_router, pinned_to
from bench.micro.stub_server import start_stubs

CPUS = sorted(os.sched_getaffinity(0))
needs_two = pytest.mark.skipif(len(CPUS) < 2, reason="pinning needs 2 CPUs")
# A child that starts a thread and a grandchild, then waits to be killed.
TREE = (
    "import subprocess, sys, threading, time\n"
    "threading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n"
    "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
    "time.sleep(60)\n"
)


def _threads(pid: int) -> list[int]:
    return [int(t.name) for t in Path(f"/proc/{pid}/task").iterdir()]


def _wait_for(condition, timeout_s: float = 20.0):
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


def _started_since(before: set[int], count: int) -> set[int] | None:
    new = descendants(os.getpid()) - before
    return new if len(new) >= count else None


@needs_two
def test_every_thread_of_every_process_started_since_the_snapshot_is_pinned() -> None:
    plan = cpu_plan()
    assert plan.router == {CPUS[0]} and plan.harness == set(CPUS[1:])
    before = descendants(os.getpid())
    child = subprocess.Popen([sys.executable, "-c", TREE])
    try:
        # The child, its grandchild, and the child's extra thread.
        tree = _wait_for(lambda: _started_since(before, 2))
        _wait_for(lambda: len(_threads(child.pid)) >= 2)
        pinned = pin_router(before, plan.router)
        assert {p["pid"] for p in pinned} == tree and child.pid in tree
        for pid in tree:
            for tid in _threads(pid):
                assert os.sched_getaffinity(tid) == plan.router
        assert all(p["cpus"] == [CPUS[0]] and p["name"] for p in pinned)
        assert os.sched_getaffinity(0) == set(CPUS)  # this process is untouched
    finally:
        for pid in descendants(os.getpid()) - before:
            os.kill(pid, 9)
        child.wait()


@needs_two
def test_pinned_to_restores_the_affinity_of_every_thread() -> None:
    with pinned_to(frozenset(CPUS[1:])):
        assert all(os.sched_getaffinity(t) == set(CPUS[1:]) for t in _threads(os.getpid()))
    assert all(os.sched_getaffinity(t) == set(CPUS) for t in _threads(os.getpid()))


def test_one_cpu_is_a_clear_error(monkeypatch, tmp_path: Path, capsys) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0})
    with pytest.raises(PinningError, match="needs at least 2 CPUs"):
        cpu_plan()
    scenario = tmp_path / "s.yaml"
    scenario.write_text(yaml.safe_dump(_tiny()))
    assert main(["run", "--scenario", str(scenario), "--policy", "url", "--pin-router"]) == 2
    assert "--pin-router needs at least 2 CPUs" in capsys.readouterr().err


def _tiny() -> dict:
    return {
        "description": "Tiny pinning scenario.",
        "fleet": {"pods": [{"model": "llama3.1-8b", "profile": "h100-llama3.1-8b", "replicas": 2}]},
        "workload": {"kind": "chat", "model": "llama3.1-8b"},
        "arrivals": {"pattern": "poisson", "rate": 10},
        "duration_s": 2,
    }


@needs_two
async def test_a_pinned_run_records_the_router_and_the_harness_cpus(tmp_path: Path) -> None:
    pytest.importorskip(
        "sglang_router", reason="sglang-router is in the bench extra: pip install -e '.[bench]'"
    )
    scenario = tmp_path / "tiny.yaml"
    scenario.write_text(yaml.safe_dump(_tiny()))
    pods = await start_stubs(2, tokens=3)
    try:
        code = await asyncio.to_thread(
            main,
            ["run", "--scenario", str(scenario), "--policy", "sglang-round_robin", "--pin-router",
             "--worker-urls", pods[0].url, pods[1].url, "--seed", "1", "--max-requests", "10",
             "--results", str(tmp_path / "results"), "--summaries", str(tmp_path / "summaries"), "--no-progress"],
        )  # fmt: skip
    finally:
        for pod in pods:
            await pod.stop()
    assert code == 0
    summary = json.loads(next((tmp_path / "summaries").rglob("seed-1.json")).read_text())
    pinning = summary["run"]["cpu_pinning"]
    assert pinning["router_cpus"] == CPUS[:1] and pinning["harness_cpus"] == CPUS[1:]
    assert pinning["load_generator_cpus"] == CPUS[1:]
    assert pinning["fleet"].startswith("external")
    assert pinning["router_processes"] and all(
        p["cpus_at_end"] == CPUS[:1] for p in pinning["router_processes"]
    )
    assert "lag_p99" in summary["stats"]["steady"] and "fleet_lag" in summary["run"]
    assert os.sched_getaffinity(0) == set(CPUS)  # the run gave this process its CPUs back
