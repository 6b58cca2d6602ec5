"""Scenario YAML loader: shipped scenarios are valid; bad fields fail with their path named."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from bench.harness.llama_fleet import is_llama_fleet
from bench.harness.scenario import PROFILES, ScenarioError, load_scenario, parse_scenario
from modelsim.profiles import builtin_profiles

SCENARIOS = sorted((Path(__file__).parents[2] / "bench" / "scenarios").glob("*.yaml"))

BASE: dict[str, Any] = {
    "fleet": {"pods": [{"model": "m", "profile": "h100-llama3.1-8b", "replicas": 2}]},
    "workload": {"kind": "chat", "model": "m"},
    "arrivals": {"pattern": "poisson", "rate": 5},
    "duration_s": 100,
    "quick": {"duration_s": 10, "arrivals": {"rate": 2}},
}


def test_the_expected_scenarios_ship() -> None:
    names = {p.stem for p in SCENARIOS}
    assert {"uniform", "mixed-gpu", "bursty", "shared-prefix", "lora", "long-short"} <= names
    assert {"mixed-gpu-qwen3-32b", "bursty-qwen3-235b"} <= names  # the AWS Qwen rows
    families = {"family-skewed-fleet", "family-tenant-prefix-kv", "family-bursty-mixed", "family-lora-tight"}
    assert families | {"kv-cache-wins"} <= names  # issue #11's held-out families
    assert {"slo-mixed-gpu", "slo-uniform"} <= names  # issue #42's latency objectives
    assert {"slo-interactive-batch", "slo-interactive-batch-rt", "slo-interactive-batch-unseen"} <= names
    assert "slo-interactive-batch-unseen2" in names
    assert {"agentic-coding", "agentic-tool-bursts", "agentic-shared-system"} <= names  # issue #45


def test_scenario_profiles_are_exactly_modelsims() -> None:
    assert set(PROFILES) == set(builtin_profiles())


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.stem)
@pytest.mark.parametrize("mode", ["quick", "full"])
def test_shipped_scenarios_load_and_quick_is_shorter(path: Path, mode: str) -> None:
    scenario = load_scenario(path, mode)
    assert scenario.name == path.stem
    assert scenario.description
    full = load_scenario(path, "full")
    if mode == "quick":
        assert scenario.duration_s < full.duration_s
        assert 20 <= scenario.duration_s <= 90


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.stem)
def test_shipped_scenarios_set_a_ttft_slo_and_reseed(path: Path) -> None:
    scenario = load_scenario(path, "quick")
    assert scenario.slo_ttft_s is not None and 0 < scenario.slo_ttft_s <= 5
    assert scenario.path == str(path)
    other = scenario.with_seed(scenario.seed + 1)
    assert (other.workload, other.arrivals, other.duration_s) == (
        scenario.workload, scenario.arrivals, scenario.duration_s,
    )  # fmt: skip
    assert [r.at_s for r in other.trace()[:20]] != [r.at_s for r in scenario.trace()[:20]]


def test_quick_overrides_deep_merge() -> None:
    quick = parse_scenario(BASE, "quick", name="x")
    full = parse_scenario(BASE, "full", name="x")
    assert (quick.duration_s, quick.arrivals["rate"], quick.arrivals["pattern"]) == (10, 2, "poisson")
    assert (full.duration_s, full.arrivals["rate"]) == (100, 5)
    assert quick.fleet["pods"][0]["replicas"] == 2 and quick.fleet["time_scale"] == 1.0
    assert len(quick.trace()) > 0


def _with(path: str, value: Any) -> dict[str, Any]:
    data = copy.deepcopy(BASE)
    *parents, last = path.split(".")
    node = data
    for key in parents:
        node = node[int(key)] if isinstance(node, list) else node[key]
    if value is _DELETE:
        del node[last]
    else:
        node[last] = value
    return data


_DELETE = object()


@pytest.mark.parametrize(
    ("path", "value", "named"),
    [
        ("fleet.pods.0.profile", "tpu-v9", "fleet.pods[0].profile"),
        ("fleet.pods.0.replicas", 0, "fleet.pods[0].replicas"),
        ("fleet.pods.0.colour", "red", "fleet.pods[0].colour"),
        ("fleet.pods", [], "fleet.pods"),
        ("fleet.time_scale", "fast", "fleet.time_scale"),
        ("workload.kind", "poetry", "workload.kind"),
        ("workload.model", "other", "workload.model"),
        ("workload.groups", 3, "workload.groups"),  # not a chat parameter
        ("arrivals.pattern", "zigzag", "arrivals.pattern"),
        ("arrivals.rate", -1, "arrivals.rate"),
        ("arrivals.burstiness", 0.5, "arrivals.burstiness"),  # not a poisson parameter
        ("duration_s", _DELETE, "duration_s"),
        ("duration_s", "long", "duration_s"),
        ("seed", 1.5, "seed"),
        ("colour", "red", "colour"),
        ("quick", [1], "quick"),
        ("slo", {"ttft_s": 0}, "slo.ttft_s"),
        ("slo", {"tpot_s": 1}, "slo.tpot_s"),
    ],
)
def test_invalid_fields_are_named(path: str, value: Any, named: str) -> None:
    with pytest.raises(ScenarioError) as err:
        parse_scenario(_with(path, value), "full")
    assert str(err.value).startswith(named + ":"), str(err.value)


@pytest.mark.parametrize(
    ("key", "value"), [("tight_fraction", 1.5), ("tight_ms", 600_001), ("loose_ms", 0), ("tight_ms", "80")]
)
def test_slo_mix_objectives_are_checked(key: str, value: Any) -> None:
    data = _with("workload", {"kind": "slo_mix", "model": "m", key: value})
    with pytest.raises(ScenarioError, match=rf"^workload.{key}:"):
        parse_scenario(data, "full")


def test_bursty_spike_geometry_is_checked() -> None:
    data = _with("arrivals", {"pattern": "bursty", "rate": 2, "spike_len_s": 40, "spike_every_s": 30})
    with pytest.raises(ScenarioError, match=r"^arrivals.spike_len_s:"):
        parse_scenario(data, "full")


def test_file_errors_are_scenario_errors(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError, match="cannot read"):
        load_scenario(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("fleet: [unclosed")
    with pytest.raises(ScenarioError, match="invalid YAML"):
        load_scenario(bad)
    wrong = tmp_path / "wrong.yaml"
    wrong.write_text(yaml.safe_dump(_with("workload.kind", "poetry")))
    with pytest.raises(ScenarioError, match=r"^wrong.yaml: workload.kind:"):
        load_scenario(wrong)
    with pytest.raises(ScenarioError, match=r"^scenario:"):
        parse_scenario([1, 2])


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.stem)
def test_shipped_fleets_are_valid_modelsim_specs(path: Path) -> None:
    from modelsim.fleet import FleetSpec

    scenario = load_scenario(path, "full")
    if is_llama_fleet(scenario.fleet):  # real engines (tests/bench/test_llama_fleet.py)
        return
    spec = FleetSpec.from_dict(scenario.fleet)
    assert len(spec.pods) == sum(p["replicas"] for p in scenario.fleet["pods"])
    served = {name for pod in spec.pods for name in (pod.model, *pod.adapters)}
    assert {r.body["model"] for r in scenario.trace()[:200]} <= served


def test_lora_adapters_must_be_served() -> None:
    data = _with("workload", {"kind": "lora", "model": "m", "adapters": 3})
    with pytest.raises(ScenarioError, match=r"^workload.adapters: adapters not served by any pod: m-lora-00"):
        parse_scenario(data, "full")
