"""Small run summaries of our rows for the report's tests: today's default or an earlier one,
N replicas, a commit, written where `bench report` reads them."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from bench.harness.gateway_policies import DEFAULT_REVISION
from bench.harness.loadgen import RequestResult
from bench.harness.scenario import parse_scenario
from bench.harness.summary import REPORTING_SEEDS, build_summary, write_summary
from bench.reports.report import shipped_default


def results(scale: float, n: int = 40) -> list[RequestResult]:
    return [
        RequestResult(i, "chat", i * 0.3, i * 0.3, 0.001, scale * (i + 1), scale * (i + 1) + 1, [0.01],
                      50, 50, 200, None, f"pod-{i % 2}")
        for i in range(n)
    ]  # fmt: skip


def today(**changes: Any) -> dict[str, Any]:
    """The policy config of a run of today's default; `changes` override its keys."""
    return {"profile": shipped_default(), "default_revision": DEFAULT_REVISION, "single_hop": True, **changes}


def earlier() -> dict[str, Any]:
    """A 2026-12-02-style run: two-hop, no default_revision, the GIE weights."""
    profile = copy.deepcopy(shipped_default())
    profile["weights"] = {"queue": 2, "kv-cache": 2, "prefix-cache": 3}
    return {"profile": profile, "single_hop": False}


def write(
    root: Path,
    policy: str,
    config: dict[str, Any],
    scale: float,
    *opts: str,
    commit: str = "c1",
    scenario_name: str = "bursty",
    command: str = "run",
) -> None:
    """Summaries of `policy` on a toy scenario, reporting seeds, TTFT proportional to `scale`;
    `opts` go into the recorded `bench <command>` (`replicas=2` as `--target-opt replicas=2`)."""
    scenario = parse_scenario(
        {
            "name": scenario_name,
            "fleet": {"pods": [{"model": "m", "profile": "h100-llama3.1-8b", "replicas": 2}]},
            "workload": {"kind": "chat", "model": "m"},
            "arrivals": {"pattern": "poisson", "rate": 2},
            "duration_s": 12,
        },
        "quick",
    )
    argv = ["python", "-m", "bench", command, "--scenario", f"bench/scenarios/{scenario_name}.yaml"]
    argv += ["--policy", "epp-default", "--label", policy]
    for opt in opts:
        argv += ["--target-opt", opt]
    for k, seed in enumerate(REPORTING_SEEDS):
        summary = build_summary(
            scenario=scenario.with_seed(seed), policy=policy, policy_config=config,
            results=results(scale * (1 + 0.01 * k)), run={"command": argv},
            env={"git": {"commit": commit}, "packages": {}},
        )  # fmt: skip
        write_summary(root, summary)
