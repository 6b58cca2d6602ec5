"""`python -m bench`: run a scenario through a policy target, then render the report."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import yaml

from bench.__main__ import main
from bench.stub_server import start_stubs


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
    pods = await start_stubs(2, tokens=3)
    results = tmp_path / "results"
    try:
        code = await asyncio.to_thread(
            main,
            ["run", "--scenario", str(_scenario(tmp_path)), "--policy", "sglang-round_robin", "--policy", "url",
             "--target-opt", f"url={pods[0].url}", "--worker-urls", pods[0].url, pods[1].url,
             "--results", str(results), "--no-progress", "--max-requests", "30"],
        )  # fmt: skip
    finally:
        for pod in pods:
            await pod.stop()
    assert code == 0
    saved = json.loads((results / "tiny" / "sglang-round_robin.json").read_text())
    assert saved["summary"]["ok"] == saved["summary"]["requests"] > 5
    assert set(saved["summary"]["pods"]) == {"stub-0", "stub-1"}
    direct = json.loads((results / "tiny" / "url.json").read_text())
    assert set(direct["summary"]["pods"]) == {"stub-0"}
    assert (
        sum(p.stats.completions for p in pods) == saved["summary"]["requests"] + direct["summary"]["requests"]
    )

    doc = tmp_path / "benchmarks.md"
    assert main(["report", "--results", str(results), "--doc", str(doc), "--img", str(tmp_path / "img"),
                 "--baseline", "sglang-round_robin"]) == 0  # fmt: skip
    text = doc.read_text()
    assert "### tiny" in text and "| url |" in text and "Tiny smoke scenario." in text
    assert (tmp_path / "img" / "tiny-ttft-time.png").exists()


def test_bad_scenario_and_unknown_policy_exit_2(tmp_path: Path, capsys) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("workload: {kind: chat}\n")
    assert main(["run", "--scenario", str(bad), "--policy", "url"]) == 2
    assert "scenario error: bad.yaml: fleet: required field missing" in capsys.readouterr().err
    assert main(["run", "--scenario", str(bad), "--policy", "no-such-policy"]) == 2
    assert "unknown policy 'no-such-policy'" in capsys.readouterr().err


def test_trace_and_policies_commands(tmp_path: Path, capsys) -> None:
    assert main(["trace", "--scenario", str(_scenario(tmp_path))]) == 0
    assert "tiny (quick):" in capsys.readouterr().out
    assert main(["policies"]) == 0
    names = capsys.readouterr().out.split()
    assert {"sglang-cache_aware", "vllm-cache_aware", "vllm-round_robin", "url"} <= set(names)
