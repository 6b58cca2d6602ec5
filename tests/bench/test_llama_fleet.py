"""The real-engine scenarios (issue #41): llama-server fleets in scenario files, the engine's
counters in run summaries, the twins' settings and the report's tables."""

from __future__ import annotations

import asyncio
import copy
import re
from pathlib import Path
from typing import Any

import httpx
import pytest

from bench.harness.llama_fleet import (
    cache_share,
    engine_counters,
    engine_record,
    is_llama_fleet,
    parse_counters,
    running_llama_fleet,
    server_specs,
)
from bench.harness.scenario import ScenarioError, load_scenario, parse_scenario
from bench.reports.llamacpp import DOC, SUMMARIES, render_comparison, render_scenario, write_doc
from devstack.llamacpp.model import MODEL_NAME
from devstack.llamacpp.server import ServerSpec, missing_engine, server_argv

ROOT = Path(__file__).parents[2]
PAGES = ROOT / "tests" / "llamacpp" / "pages"
REAL = ("llama-sessions", "llama-sessions-hetero")
LLAMA: dict[str, Any] = {
    "fleet": {"engine": "llama.cpp", "pods": [{"threads": 1, "replicas": 2}, {"threads": 2}]},
    "workload": {"kind": "chat", "model": MODEL_NAME},
    "arrivals": {"pattern": "poisson", "rate": 2},
    "duration_s": 30,
}


def test_a_llama_fleet_parses_into_one_server_per_replica() -> None:
    scenario = parse_scenario(LLAMA)
    assert is_llama_fleet(scenario.fleet) and scenario.models == {MODEL_NAME}
    assert [s.threads for s in server_specs(scenario.fleet)] == [1, 1, 2]


@pytest.mark.parametrize(
    ("path", "value", "named"),
    [
        ("fleet.pods", [{"threads": 0}], "fleet.pods[0].threads"),
        ("fleet.pods", [{"profile": "h100-llama3.1-8b"}], "fleet.pods[0].profile"),
        ("fleet.time_scale", 10, "fleet.time_scale"),
        ("fleet.engine", "ollama", "fleet.engine"),
        ("workload.model", "llama3.1-8b", "workload.model"),
    ],
)
def test_llama_fleet_errors_name_the_field(path: str, value: Any, named: str) -> None:
    data = copy.deepcopy(LLAMA)
    head, key = path.split(".")
    data[head][key] = value
    with pytest.raises(ScenarioError, match="^" + re.escape(named)):
        parse_scenario(data)


def test_cache_ram_reaches_the_engine_command_line() -> None:
    argv = server_argv(ServerSpec(cache_ram_mib=32), 1234)
    assert argv[argv.index("--cache-ram") + 1] == "32"
    assert "--cache-ram" not in server_argv(ServerSpec(), 1234)


@pytest.mark.parametrize("name", REAL)
def test_each_real_scenario_has_a_modelsim_twin_on_the_same_trace(name: str) -> None:
    real = load_scenario(ROOT / "bench" / "scenarios" / f"{name}.yaml")
    twin = load_scenario(ROOT / "bench" / "scenarios" / f"{name}-sim.yaml")
    assert is_llama_fleet(real.fleet) and not is_llama_fleet(twin.fleet)
    assert (real.workload, real.arrivals, real.duration_s, real.seed) == (
        twin.workload, twin.arrivals, twin.duration_s, twin.seed,
    )  # fmt: skip
    assert sum(p["replicas"] for p in real.fleet["pods"]) == sum(
        p.get("replicas", 1) for p in twin.fleet["pods"]
    )
    for seed in (1, 2, 3):
        assert [r.body for r in real.with_seed(seed).trace()] == [
            r.body for r in twin.with_seed(seed).trace()
        ]


def test_llama_server_counters_and_the_cache_share() -> None:
    busy = parse_counters((PAGES / "busy.prom").read_text())
    assert {"prompt_tokens_total", "prompt_tokens_cached_total", "tokens_predicted_total"} <= set(busy)
    share = cache_share([{"prompt_tokens_total": 30.0, "prompt_tokens_cached_total": 10.0}] * 2)
    assert share == {
        "prompt_tokens_computed": 60.0,
        "prompt_tokens_cached": 20.0,
        "prompt_cache_hit_share": 0.25,
    }
    assert cache_share([])["prompt_cache_hit_share"] is None


def test_a_vllm_page_gives_the_same_figures_from_its_prefix_cache_counters() -> None:
    page = (
        "# TYPE vllm:prefix_cache_queries counter\n"
        'vllm:prefix_cache_queries_total{model_name="m"} 100.0\n'
        "# TYPE vllm:prefix_cache_hits counter\n"
        'vllm:prefix_cache_hits_total{model_name="m"} 40.0\n'
    )
    assert parse_counters(page) == {"prompt_tokens_total": 60.0, "prompt_tokens_cached_total": 40.0}
    assert parse_counters("# TYPE other counter\nother_total 1\n") == {}


def _summary(policy: str, seed: int, ttft: float, share: float, engine: bool) -> dict[str, Any]:
    run: dict[str, Any] = {
        "engine_counters": {"prompt_cache_hit_share": share, "prompt_tokens_computed": 1000.0 * seed},
        "machine_before": {},
    }
    if engine:
        run["engine"] = {"version": "llama.cpp 0c1e570 (test)"}
    return {
        "scenario": {
            "description": "d", "arrivals": {"pattern": "gamma", "rate": 3}, "duration_s": 30, "mode": "quick",
            "file": "bench/scenarios/x.yaml",
        },
        "seed": seed,
        "policy": {"name": policy},
        "stats": {
            "window": {"warmup_fraction": 0.1},
            "steady": {"ttft_p50": ttft, "ttft_p95": 2 * ttft, "output_tok_s": 100.0, "requests": 80, "error_kinds": {}},
        },
        "run": run,
        "env": {"git": {"commit": "abc", "dirty": False}, "packages": {}, "cpu_count": 2},
    }  # fmt: skip


def test_the_report_shows_the_engine_cache_and_flags_twin_differences() -> None:
    real = {
        p: [_summary(p, s, t, 0.5, engine=True) for s in (1, 2, 3)]
        for p, t in (("round-robin+tok", 1.0), ("epp-default+tok", 0.5))
    }
    twin = {
        p: [_summary(p, s, t, 0.6, engine=False) for s in (1, 2, 3)]
        for p, t in (("round-robin+tok", 1.1), ("epp-default+tok", 0.25))
    }
    table = render_scenario("llama-x", real)
    assert table.index("| round-robin+tok") < table.index("| epp-default+tok")
    assert "| 500 ms [500-500] (-50 %) |" in table and "| 50 % [50-50] |" in table
    assert "llama.cpp 0c1e570 (test)" in table
    comparison = render_comparison({"llama-x": real, "llama-x-sim": twin})
    rows = {line.split(" | ")[1]: line for line in comparison.splitlines() if line.startswith("| llama-x")}
    assert "| +10 % |" in rows["round-robin+tok"]  # within 15 %: not flagged
    assert "**-50 %**" in rows["epp-default+tok"]
    assert "50 % [50-50] / 60 % [60-60]" in rows["epp-default+tok"]


@pytest.mark.integration
@pytest.mark.skipif(
    missing_engine() is not None, reason=f"{missing_engine()} (`make llama-server` builds it; .ci/run does)"
)
def test_a_llama_fleet_starts_fresh_and_its_counters_are_read() -> None:
    async def run() -> None:
        fleet = parse_scenario(LLAMA).fleet
        fleet = {**fleet, "pods": [{**fleet["pods"][0], "replicas": 1}]}
        async with running_llama_fleet(fleet) as pods:
            urls = [f"http://{p['address']}" for p in pods]
            before = await engine_counters(urls)
            assert before is not None and before["prompt_tokens_computed"] == 0
            body = {
                "model": MODEL_NAME,
                "messages": [{"role": "user", "content": "hello " * 40}],
                "max_tokens": 4,
            }
            async with httpx.AsyncClient(timeout=30) as client:
                for _ in range(2):  # the second from the slot's prompt cache
                    (await client.post(urls[0] + "/v1/chat/completions", json=body)).raise_for_status()
            after = await engine_counters(urls)
        assert after is not None and after["prompt_tokens_cached"] > 0 and after["prompt_tokens_computed"] > 0
        assert engine_record()["version"].startswith("llama.cpp ")

    asyncio.run(run())


def test_the_committed_page_is_the_generated_one(tmp_path: Path) -> None:
    """`python -m bench.reports.llamacpp` on the committed summaries changes nothing."""
    page = tmp_path / "llamacpp.md"
    committed = (ROOT / DOC).read_text()
    page.write_text(committed)
    write_doc(ROOT / SUMMARIES, page)
    assert page.read_text() == committed, "run `python -m bench.reports.llamacpp` and commit the page"
