"""Runs told no summaries root write to git-ignored scratch, never into the committed evidence
(issue #45): `bench run` and `bench sim` write a committed root only when it is named."""

from __future__ import annotations

import argparse
import subprocess
from pathlib import Path

import pytest
import yaml

import bench.__main__ as cli
from bench.harness.summary import SCRATCH_DIR, SUMMARIES_DIR
from bench.vtime.cli import REPLICA_SUMMARIES, VIRTUAL_SUMMARIES

REPO = Path(__file__).resolve().parents[2]


def _scenario(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "seed": 3,
                "fleet": {"pods": [{"model": "llama3.1-8b", "profile": "h100-llama3.1-8b", "replicas": 2}]},
                "workload": {"kind": "chat", "model": "llama3.1-8b"},
                "arrivals": {"pattern": "poisson", "rate": 5},
                "duration_s": 60,
                "quick": {"duration_s": 2},
            }
        )
    )
    return path


def test_bench_sim_without_a_root_writes_scratch_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    scenario = _scenario(tmp_path)
    monkeypatch.chdir(tmp_path)
    assert cli.main(["sim", "--scenario", str(scenario), "--policy", "round-robin", "--seed", "1"]) == 0
    written = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("seed-*.json"))
    assert written == [f"{SCRATCH_DIR.as_posix()}/summaries-virtual/quick/tiny/round-robin/seed-1.json"]
    assert not (tmp_path / VIRTUAL_SUMMARIES).exists()


def test_defaults_are_scratch_and_a_named_root_is_kept(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    seen: list[str] = []

    async def fake_run(args: argparse.Namespace) -> int:
        seen.append(args.summaries)
        return 0

    def fake_sim(args: argparse.Namespace, seeds: list[int]) -> int:
        seen.append(args.summaries)
        return 0

    monkeypatch.setattr(cli, "cmd_run", fake_run)
    monkeypatch.setattr(cli, "cmd_sim", fake_sim)
    scenario = str(_scenario(tmp_path))
    for argv in (
        ["run", "--scenario", scenario, "--policy", "round-robin"],
        ["sim", "--scenario", scenario, "--policy", "epp-default"],
        ["sim", "--scenario", scenario, "--policy", "epp-default", "--replicas", "2"],
        ["run", "--scenario", scenario, "--policy", "round-robin", "--summaries", str(SUMMARIES_DIR)],
        ["sim", "--scenario", scenario, "--policy", "epp-default", "--summaries", str(VIRTUAL_SUMMARIES)],
    ):
        assert cli.main(argv) == 0
    assert seen == [
        str(SCRATCH_DIR / "summaries"),
        str(SCRATCH_DIR / "summaries-virtual"),
        str(SCRATCH_DIR / "summaries-virtual-replicas"),
        str(SUMMARIES_DIR),
        str(VIRTUAL_SUMMARIES),
    ]
    assert REPLICA_SUMMARIES.name == "summaries-virtual-replicas"


def test_the_scratch_root_is_git_ignored() -> None:
    probe = f"{SCRATCH_DIR.as_posix()}/summaries/quick/x/y/seed-1.json"
    ignored = subprocess.run(["git", "check-ignore", "-q", probe], cwd=REPO, check=False)
    assert ignored.returncode == 0, f"{probe} is not git-ignored"
