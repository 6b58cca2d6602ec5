"""`python -m bench refresh` (issue #53): the plan keys on what the summaries recorded against the
live default and scenario files; the executor runs it serially, resumes, and regenerates pages."""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from pathlib import Path

import pytest

from bench.harness import gateway_policies
from bench.harness.summary import REPORTING_SEEDS, summary_path
from bench.refresh.execute import JOURNAL, REGENERATE, execute
from bench.refresh.plan import LiveDefault, build_plan, render_plan, rerun_command
from bench.reports.comparable import shipped_default

REPO = Path(__file__).resolve().parents[2]
SCENARIO = "bench/scenarios/uniform.yaml"


def _summary(policy: str, seed: int, *, virtual: bool = False, digest: str | None = None, **config) -> dict:
    """A committed row's seed as `bench run` / `bench sim` records it (the fields the plan reads)."""
    from bench.harness.summary import file_digest

    command = ["python", "-m", "bench", "sim" if virtual else "run", "--scenario", SCENARIO,
               "--policy", policy.removesuffix("+tok"), "--seeds", "reporting", "--summaries", "/elsewhere"]  # fmt: skip
    return {
        "schema": 1,
        "scenario": {
            "name": "uniform",
            "file": SCENARIO,
            "mode": "quick",
            "digest": digest or file_digest(REPO / SCENARIO),
        },
        "seed": seed,
        "policy": {"name": policy, "config": config},
        "env": {"cpu_count": 2},
        "run": {"command": command, "wall_s": 36.0, **({"virtual": True} if virtual else {})},
    }


def _today(virtual: bool = False) -> dict:
    if virtual:
        return {"kind": "virtual", "profile": {"name": "default", **shipped_default()}}
    return {
        "kind": "gateway",
        "profile": shipped_default(),
        "default_revision": gateway_policies.DEFAULT_REVISION,
    }


def _tree(tmp_path: Path, rows: dict[tuple[str, str], dict]) -> Path:
    """A repository holding the scenario file and, per (root, policy), the reporting seeds."""
    (tmp_path / SCENARIO).parent.mkdir(parents=True)
    shutil.copy(REPO / SCENARIO, tmp_path / SCENARIO)
    for (root, policy), config in rows.items():
        virtual = "virtual" in root
        for seed in REPORTING_SEEDS:
            path = tmp_path / summary_path(root, "quick", "uniform", policy, seed)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(_summary(policy, seed, virtual=virtual, **config)))
    return tmp_path


def _current_tree(tmp_path: Path) -> Path:
    return _tree(
        tmp_path,
        {
            ("bench/summaries", "epp-default"): _today(),
            ("bench/summaries", "round-robin"): {"kind": "envoy"},
            ("bench/summaries", "vllm-cache_aware"): {"kind": "peer"},
            ("bench/summaries-virtual", "epp-default"): _today(virtual=True),
            ("bench/summaries-virtual", "round-robin"): {"kind": "virtual"},
        },
    )


def test_a_tree_of_the_shipped_default_has_an_empty_plan(tmp_path: Path) -> None:
    repo = _current_tree(tmp_path)
    plan = build_plan(repo)
    assert plan.units == []
    assert render_plan(plan, LiveDefault.now()).startswith("nothing stale")


def test_a_change_of_the_default_lists_the_rows_and_their_core_hours(tmp_path: Path, monkeypatch) -> None:
    repo = _current_tree(tmp_path)
    monkeypatch.setattr(gateway_policies, "DEFAULT_REVISION", gateway_policies.DEFAULT_REVISION + 1)
    plan = build_plan(repo)
    ids = {u.id for u in plan.units}
    # Ours at real time, with round-robin and the peer of its campaign; virtual time records no
    # revision, so its row is of today's default still.
    assert ids == {f"bench/summaries/quick/uniform/{p}/seed-{s}" for p in ("epp-default", "round-robin",
                   "vllm-cache_aware") for s in REPORTING_SEEDS}  # fmt: skip
    assert plan.core_hours == pytest.approx(9 * 36.0 * 2 / 3600)
    text = render_plan(plan, LiveDefault.now())
    assert (
        f"bench/summaries/quick/uniform/epp-default seeds 1,2,3: 0.060 core-h (default_revision {gateway_policies.DEFAULT_REVISION - 1}"
        in text
    )
    assert "9 run(s) in 3 row(s): 0.18 core-hours" in text
    assert {u.id for u in build_plan(repo, alone=True).units} == {
        f"bench/summaries/quick/uniform/epp-default/seed-{s}" for s in REPORTING_SEEDS
    }
    assert build_plan(repo, virtual_only=True).units == []


def test_a_change_of_the_profile_makes_both_clocks_stale(tmp_path: Path, monkeypatch) -> None:
    repo = _current_tree(tmp_path)
    changed = shipped_default()
    changed["weights"] = {**changed["weights"], "kv-cache": 9.0}
    monkeypatch.setattr("bench.reports.comparable.shipped_default", lambda: changed)
    plan = build_plan(repo, virtual_only=True)
    assert {u.id for u in plan.units} == {
        f"bench/summaries-virtual/quick/uniform/epp-default/seed-{s}" for s in REPORTING_SEEDS
    }
    assert plan.units[0].reasons == ["earlier default profile"]
    assert plan.core_hours == pytest.approx(3 * 36.0 / 3600)  # virtual time: one core


def test_a_changed_scenario_file_makes_every_row_of_it_stale(tmp_path: Path) -> None:
    repo = _current_tree(tmp_path)
    (repo / SCENARIO).write_text((repo / SCENARIO).read_text() + "\n# changed\n")
    plan = build_plan(repo)
    assert len(plan.units) == 5 * len(REPORTING_SEEDS)
    assert all(u.reasons == [f"scenario file {SCENARIO} changed"] for u in plan.units)


def test_the_rerun_command_sets_seed_root_and_this_rows_policy_alone() -> None:
    summary = _summary("epp-default", 2, virtual=True)
    summary["run"]["command"] = ["python", "-m", "bench", "sim", "--ttft-only", "--policy", "round-robin",
                                 "--policy", "epp-default", "--scenario", SCENARIO, "--seed", "1"]  # fmt: skip
    command, problem = rerun_command(summary, "bench/summaries-virtual", 2)
    assert problem == "" and command is not None
    assert command[1:] == ["-m", "bench", "sim", "--ttft-only", "--scenario", SCENARIO, "--policy", "epp-default",
                           "--seed", "2", "--summaries", "bench/summaries-virtual"]  # fmt: skip
    tok = _summary("epp-default+tok", 1)
    command, _ = rerun_command(tok, "bench/summaries", 1)
    assert command is not None and "--fleet-tokenizer" in command and command[-1] == "--no-progress"


def _fake_runner(repo: Path, live: LiveDefault, fail_at: int | None = None):
    """Stands in for `python -m bench run|sim`: writes the summary the command names, of today's default."""
    calls: list[list[str]] = []

    def run(command: Sequence[str], cwd: Path) -> int:
        calls.append(list(command))
        if "--seed" not in command:
            return 0  # a page generator
        if fail_at is not None and len(calls) == fail_at:
            return 3
        seed = int(command[command.index("--seed") + 1])
        root = command[command.index("--summaries") + 1]
        policy = command[command.index("--policy") + 1]
        virtual = command[3] == "sim"
        config = _today(virtual) if policy == "epp-default" else {"kind": "envoy"}
        path = cwd / summary_path(root, "quick", "uniform", policy, seed)
        path.write_text(json.dumps(_summary(policy, seed, virtual=virtual, **config)))
        return 0

    return run, calls


def test_refresh_runs_serially_resumes_after_a_failure_and_regenerates_the_pages(
    tmp_path: Path, monkeypatch
) -> None:
    repo = _current_tree(tmp_path)
    monkeypatch.setattr(gateway_policies, "DEFAULT_REVISION", gateway_policies.DEFAULT_REVISION + 1)
    live = LiveDefault.now()
    lines: list[str] = []
    run, calls = _fake_runner(repo, live, fail_at=4)
    assert execute(build_plan(repo, live), repo, live, runner=run, out=lines.append) == 1
    assert "stopped at" in lines[-1] and (repo / JOURNAL).is_file()
    assert (
        lines[0].startswith("[1/9] bench/summaries/quick/uniform/epp-default/seed-1") and "ETA 0:" in lines[0]
    )
    # Ours is current now, so a fresh plan is empty: its companions live on in the journal.
    fresh = build_plan(repo, live)
    assert fresh.units == []
    run, calls = _fake_runner(repo, live)
    lines.clear()
    assert execute(fresh, repo, live, runner=run, out=lines.append) == 0
    assert lines[0] == "resuming: 3 of 9 run(s) done before"
    ran_units = [c for c in calls if "--seed" in c]
    assert len(ran_units) == 6 and ran_units[0][ran_units[0].index("--policy") + 1] == "round-robin"
    pages = [c[1:] for c in calls if "--seed" not in c]
    assert pages == [list(args) for args in REGENERATE]
    assert not (repo / JOURNAL).exists() and build_plan(repo, live).units == []


def test_a_rerun_that_leaves_its_row_stale_stops_the_refresh(tmp_path: Path, monkeypatch) -> None:
    repo = _current_tree(tmp_path)
    monkeypatch.setattr(gateway_policies, "DEFAULT_REVISION", gateway_policies.DEFAULT_REVISION + 1)
    live = LiveDefault.now()
    lines: list[str] = []
    assert execute(build_plan(repo, live), repo, live, runner=lambda c, cwd: 0, out=lines.append) == 1
    assert "no new summary at bench/summaries/quick/uniform/epp-default/seed-1.json" in lines[-1]
