"""Virtual time (bench/vtime/): deterministic, and the EPP it runs is the production code."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from bench.__main__ import main as bench_main
from bench.harness.scenario import Scenario
from bench.vtime.cli import epp_extra, load_policy_modules, run_one, scaled
from epp.scheduling import registry

SCENARIO = Scenario(
    name="vtime-test",
    description="two H100s, Poisson chat at ~60 % of capacity",
    seed=1,
    fleet={"pods": [{"name": "h100", "model": "m", "profile": "h100-llama3.1-8b", "replicas": 2}]},
    workload={"kind": "chat", "model": "m"},
    arrivals={"pattern": "poisson", "rate": 14.0},
    duration_s=3.0,
    loadgen={},
    mode="quick",
)


def _outcome(policy: str, scenario: Scenario = SCENARIO) -> list[tuple[Any, ...]]:
    results, _, _ = run_one(scenario, policy, gateway_ms=0.0)
    return [(r.index, r.pod, r.status, r.ttft_s, r.e2e_s, r.output_tokens) for r in results]


@pytest.mark.parametrize("policy", ["epp-default", "oracle", "round-robin"])
def test_the_same_seed_gives_the_same_run(policy: str) -> None:
    first = _outcome(policy)
    assert first == _outcome(policy)
    assert all(status == 200 for _, _, status, *_ in first)
    assert {pod for _, pod, *_ in first} == {"h100-0", "h100-1"}
    assert first != _outcome(policy, SCENARIO.with_seed(2))


def _replace_scorer(name: str, fn: Callable[..., list[float]]) -> Callable[..., list[float]]:
    """Swap the function behind a registered scorer (the entries are frozen); returns the old one."""
    entry = registry.SCORERS[name]
    old = entry.fn
    object.__setattr__(entry, "fn", fn)
    return old


def test_the_sim_decides_with_the_registered_scorers() -> None:
    calls: list[int] = []
    original = registry.SCORERS["predicted-ttft"].fn

    def counting(request: Any, candidates: Any, ctx: Any) -> list[float]:
        calls.append(len(candidates))
        return original(request, candidates, ctx)

    _replace_scorer("predicted-ttft", counting)
    try:
        live = _outcome("epp-default")
    finally:
        _replace_scorer("predicted-ttft", original)
    assert len(calls) == len(live)  # one call per decision, over the pool's candidates
    # Bypassed (every pod scores alike): the decisions change.
    _replace_scorer("predicted-ttft", lambda request, candidates, ctx: [0.0] * len(candidates))
    try:
        bypassed = _outcome("epp-default")
    finally:
        _replace_scorer("predicted-ttft", original)
    assert [pod for _, pod, *_ in bypassed] != [pod for _, pod, *_ in live]
    assert _outcome("epp-default") == live


def test_ttft_only_stops_once_every_request_has_its_first_token() -> None:
    full, full_stats, _ = run_one(SCENARIO, "round-robin", gateway_ms=0.0)
    short, short_stats, _ = run_one(SCENARIO, "round-robin", gateway_ms=0.0, until_first_tokens=True)
    assert [r.ttft_s for r in short] == [r.ttft_s for r in full]
    assert all(r.ok for r in short) and short_stats.simulated_s < full_stats.simulated_s
    assert any(r.e2e_s is None for r in short) and all(r.e2e_s is not None for r in full)


def test_scaling_multiplies_pods_and_rate() -> None:
    big = scaled(SCENARIO, 5, 2.0)
    assert big.name == "vtime-test@10pods" and big.duration_s == 2.0
    assert big.fleet["pods"][0]["replicas"] == 10 and big.arrivals["rate"] == 70.0
    assert scaled(SCENARIO, 2, 1.0, first_spike_s=0.3).arrivals == {"pattern": "poisson", "rate": 28.0,
                                                                   "first_spike_s": 0.3}  # fmt: skip
    sessions = dataclasses.replace(
        SCENARIO, workload={"kind": "sessions", "model": "m", "sessions": 8, "turns": 4}
    )
    assert scaled(sessions, 3).workload == {"kind": "sessions", "model": "m", "sessions": 24, "turns": 4}


def test_bench_sim_writes_a_virtual_summary(tmp_path: Path) -> None:
    scenario = tmp_path / "s.yaml"
    data = {
        k: v
        for k, v in dataclasses.asdict(SCENARIO).items()
        if k not in ("path", "mode", "loadgen", "slo_ttft_s")
    }
    scenario.write_text(json.dumps(data))  # JSON is YAML
    argv = [
        "sim",
        "--scenario",
        str(scenario),
        "--policy",
        "epp-default",
        "--seed",
        "7",
        "--summaries",
        str(tmp_path),
    ]
    assert bench_main(argv) == 0
    summary = json.loads((tmp_path / "quick" / "vtime-test" / "epp-default" / "seed-7.json").read_text())
    assert summary["run"]["virtual"] is True and summary["policy"]["config"]["kind"] == "virtual"
    assert summary["policy"]["config"]["profile"]["weights"]["predicted-ttft"] > 0
    assert summary["stats"]["steady"]["ok"] > 0 and summary["run"]["decision_cpu"]["mean_us"] > 0
    assert 0 < summary["run"]["pick_cpu"]["mean_us"] < summary["run"]["decision_cpu"]["mean_us"]
    for engine in summary["run"]["engines"]:  # per-pod KV use, sampled after every engine step
        assert 0 < engine["kv_usage_mean"] <= engine["kv_usage_peak"] <= 1


def test_bench_sim_refuses_an_unknown_policy_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench_main(["sim", "--scenario", "bench/scenarios/uniform.yaml", "--policy", "nope"]) == 2
    err = capsys.readouterr().err.strip()
    assert "unknown virtual-time policy 'nope'" in err and "\n" not in err


# Flow control: two A10Gs offered several times what they serve, so the EPP's queue fills at once.
OVERLOAD = Scenario(
    name="vtime-flow",
    description="two A10Gs, priority-tenants traffic at several times their capacity",
    seed=1,
    fleet={"pods": [{"name": "a10g", "model": "m", "profile": "a10g-llama3.1-8b", "replicas": 2}]},
    workload={"kind": "priority_tenants", "model": "m", "critical_fraction": 0.2, "sheddable_fraction": 0.3},
    arrivals={"pattern": "poisson", "rate": 80.0},
    duration_s=2.0,
    loadgen={},
    mode="quick",
)


def _flow_run(policy: str, scenario: Scenario = OVERLOAD) -> tuple[list[Any], Any]:
    modules = load_policy_modules(["bench.harness.flow_policies"])
    results, _, router = run_one(scenario, policy, gateway_ms=0.0, extra=epp_extra(policy, modules))
    return results, router


def _rows(results: list[Any]) -> list[tuple[Any, ...]]:
    return [(r.index, r.tag, r.pod, r.status, r.error, r.ttft_s, r.e2e_s) for r in results]


def test_flow_control_runs_the_same_twice() -> None:
    first, _ = _flow_run("epp-flow-on")
    assert _rows(first) == _rows(_flow_run("epp-flow-on")[0])
    assert _rows(first) != _rows(_flow_run("epp-flow-off")[0])
    assert all(r.status in (200, 429) for r in first)  # every request answered: none left waiting


def test_a_queued_request_resumes_when_the_pool_has_room() -> None:
    results, router = _flow_run("epp-flow-on")
    outcomes = router.flow_outcomes()
    # Critical and standard requests waited in the EPP's queue and were routed from it later.
    assert outcomes["critical"]["dispatched"] > 0 and outcomes["standard"]["dispatched"] > 0
    served = [r for r in results if r.status == 200]
    assert sum(outcomes[band].get("dispatched", 0) for band in outcomes) < len(served)
    assert all(r.ttft_s is not None and r.pod for r in served)


def test_under_overload_only_sheddable_traffic_is_refused() -> None:
    results, router = _flow_run("epp-flow-on")
    refused = [r for r in results if r.status == 429]
    assert refused and all(r.tag.startswith("sheddable/") for r in refused)
    # Sheddable requests waited out their band's 1 s in the queue (the deadline resumes them).
    assert router.flow_outcomes()["sheddable"]["timeout"] > 0
    assert any(r.error == "flow_control_timeout" and r.e2e_s >= 1.0 for r in refused)


def test_bench_sim_refuses_a_missing_policy_module_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    argv = [
        "sim",
        "--scenario",
        "bench/scenarios/uniform.yaml",
        "--policy-module",
        "bench.nope",
        "--policy",
        "x",
    ]
    assert bench_main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("--policy-module:") and "bench.nope" in err and "\n" not in err
