"""`python -m bench`: run a scenario through a policy target, then render the report."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
import yaml

from bench.__main__ import main
from bench.harness.summary import REPORTING_SEEDS, TUNING_SEEDS
from bench.micro.stub_server import start_stubs


def _scenario(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "description": "Tiny smoke scenario.",
                "seed": 3,
                "fleet": {"pods": [{"model": "llama3.1-8b", "profile": "h100-llama3.1-8b", "replicas": 2}]},
                "workload": {"kind": "shared_prefix", "model": "llama3.1-8b", "groups": 2},
                "arrivals": {"pattern": "bursty", "rate": 10, "spike_len_s": 0.5, "spike_every_s": 1},
                "duration_s": 60,
                "quick": {"duration_s": 2},
            }
        )
    )
    return path


async def test_run_through_sglang_and_url_policies_then_report(tmp_path: Path) -> None:
    pytest.importorskip(
        "sglang_router", reason="sglang-router is in the bench extra: pip install -e '.[bench]'"
    )
    pods = await start_stubs(2, tokens=3)
    results, summaries = tmp_path / "results", tmp_path / "summaries"
    try:
        code = await asyncio.to_thread(
            main,
            ["run", "--scenario", str(_scenario(tmp_path)), "--policy", "sglang-round_robin", "--policy", "url",
             "--target-opt", f"url={pods[0].url}", "--worker-urls", pods[0].url, pods[1].url,
             "--results", str(results), "--summaries", str(summaries), "--no-progress",
             "--max-requests", "30", "--seeds", "2"],
        )  # fmt: skip
    finally:
        for pod in pods:
            await pod.stop()
    assert code == 0
    first, second = REPORTING_SEEDS[:2]
    saved = json.loads((results / "quick" / "tiny" / "sglang-round_robin" / f"seed-{first}.json").read_text())
    assert saved["summary"]["ok"] == saved["summary"]["requests"] > 5
    assert set(saved["summary"]["pods"]) == {"stub-0", "stub-1"}
    sent = 0
    for policy in ("sglang-round_robin", "url"):
        for seed in (first, second):
            summary = json.loads((summaries / "quick" / "tiny" / policy / f"seed-{seed}.json").read_text())
            assert summary["seed"] == seed and summary["seed_set"] == "reporting"
            assert summary["run"]["max_requests"] == 30 and summary["run"]["machine_before"]["loadavg"]
            assert summary["scenario"]["digest"].startswith("sha256:")
            assert summary["env"]["packages"]["sglang-router"] is not None
            sent += summary["stats"]["whole_run"]["requests"]
    peer = json.loads(
        (summaries / "quick" / "tiny" / "sglang-round_robin" / f"seed-{first}.json").read_text()
    )
    assert peer["policy"]["config"]["router"] == "sglang-router"
    assert "--policy" in peer["policy"]["config"]["argv"] and peer["policy"]["config"]["argv"][0] == "python"
    url = json.loads((summaries / "quick" / "tiny" / "url" / f"seed-{first}.json").read_text())
    assert set(url["stats"]["steady"]["pod_share"]) == {"stub-0"}
    assert sum(p.stats.completions for p in pods) == sent
    # Two seeds = two different traces of the same shape.
    other = json.loads((results / "quick" / "tiny" / "url" / f"seed-{second}.json").read_text())
    direct = json.loads((results / "quick" / "tiny" / "url" / f"seed-{first}.json").read_text())
    assert [r["scheduled_s"] for r in other["results"]] != [r["scheduled_s"] for r in direct["results"]]

    root = tmp_path / "repo"
    assert main(["report", "--summaries", str(summaries), "--root", str(root),
                 "--baseline", "sglang-round_robin", "--results", str(results)]) == 0  # fmt: skip
    text = (root / "docs" / "benchmarks" / "scenarios.md").read_text()
    assert "### tiny" in text and f"| url | {first}, {second} |" in text and "Tiny smoke scenario." in text
    assert "Smoke run: traces cut to 30 requests" in text
    assert (root / "docs" / "img" / "tiny-ttft-time.png").exists() and "](../img/tiny-ttft-time.png)" in text


def test_seed_options(tmp_path: Path, capsys) -> None:
    from bench.__main__ import run_seeds

    class Args:
        seed: list[int] = []
        seeds: str | None = None

    args = Args()
    assert run_seeds(args) == list(REPORTING_SEEDS)  # type: ignore[arg-type]
    args.seeds = "tuning"
    assert run_seeds(args) == list(TUNING_SEEDS)  # type: ignore[arg-type]
    args.seeds = "1"
    assert run_seeds(args) == [REPORTING_SEEDS[0]]  # type: ignore[arg-type]
    args.seed = [7, 7, 9]
    assert run_seeds(args) == [7, 9]  # type: ignore[arg-type]
    args.seed, args.seeds = [], "many"
    with pytest.raises(SystemExit, match="--seeds expects"):
        run_seeds(args)  # type: ignore[arg-type]
    assert main(["run", "--scenario", str(_scenario(tmp_path)), "--policy", "url", "--policy", "sglang-random",
                 "--label", "x"]) == 2  # fmt: skip
    assert "--label names one policy" in capsys.readouterr().err


def test_bad_scenario_and_unknown_policy_exit_2(tmp_path: Path, capsys) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("workload: {kind: chat}\n")
    assert main(["run", "--scenario", str(bad), "--policy", "url"]) == 2
    assert "scenario error: bad.yaml: fleet: required field missing" in capsys.readouterr().err
    assert main(["run", "--scenario", str(bad), "--policy", "no-such-policy"]) == 2
    assert "unknown policy 'no-such-policy'" in capsys.readouterr().err


def test_trace_and_policies_commands(tmp_path: Path, capsys) -> None:
    assert main(["trace", "--scenario", str(_scenario(tmp_path))]) == 0
    out = capsys.readouterr().out
    assert "tiny (quick, seed 3):" in out and "stationary:" in out
    assert main(["policies"]) == 0
    names = capsys.readouterr().out.split()
    assert {"sglang-cache_aware", "vllm-cache_aware", "vllm-round_robin", "url"} <= set(names)
