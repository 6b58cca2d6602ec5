"""A deployment runs what the benchmarks measured.

Every configuration a user starts from (`deploy/`'s gateway configs, the InferenceGatewayConfig
example, `make run`'s generated config) sends each model to a profile (the model's `profile`, else
`defaultProfile`). That profile's weights must be the shipped default's, or else a profile with
benchmark rows of its own: a committed run summary (bench/summaries) that ran those very weights.
Otherwise a cluster would run a profile no benchmark row describes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from devstack.launch import DEFAULT_FLEET, dev_trust, gateway_config_for
from gateway.config import parse_config
from gateway.profiles import BUILTIN_PROFILES

ROOT = Path(__file__).resolve().parents[2]
DEPLOY_CONFIGS = (
    "deploy/base/config/gateway.yaml",
    "deploy/overlays/dev/gateway.yaml",
    "deploy/base/inferencegatewayconfig.yaml",
)


def _benchmarked_weights() -> set[str]:
    """The weight sets of every committed run summary, as canonical JSON."""
    out: set[str] = set()
    for path in (ROOT / "bench" / "summaries").glob("*/*/*/seed-*.json"):
        profile = json.loads(path.read_text())["policy"].get("config", {}).get("profile")
        if profile and profile.get("weights"):
            out.add(_canonical(profile["weights"]))
    return out


def _canonical(weights: dict[str, float]) -> str:
    return json.dumps({k: float(v) for k, v in weights.items() if v > 0}, sort_keys=True)


def _load(relative: str) -> dict[str, Any]:
    data = yaml.safe_load((ROOT / relative).read_text())
    return data["spec"] if data.get("kind") == "InferenceGatewayConfig" else data


def _make_run_config() -> dict[str, Any]:
    pods = [
        {"model": group["model"], "address": f"127.0.0.1:{9000 + i}", "adapters": group.get("adapters", [])}
        for i, group in enumerate(DEFAULT_FLEET["pods"])
    ]
    config = gateway_config_for(pods, {})
    dev_trust(config)
    return config


def _routed_profiles(data: dict[str, Any]) -> dict[str, str]:
    """model name -> the profile its requests get when they name none."""
    config = parse_config(data)
    return {
        model.name: model.profile or config.default_profile for pool in config.pools for model in pool.models
    }


@pytest.mark.parametrize("source", [*DEPLOY_CONFIGS, "make run"])
def test_every_model_is_sent_to_the_shipped_default_or_a_benchmarked_profile(source: str) -> None:
    data = _make_run_config() if source == "make run" else _load(source)
    config = parse_config(data)
    profiles = config.scheduler_profiles()
    shipped = _canonical(dict(BUILTIN_PROFILES["default"].weights))
    benchmarked = _benchmarked_weights()
    assert shipped in benchmarked, "the shipped default itself has no committed benchmark row"
    routed = _routed_profiles(data)
    assert routed
    for model, name in routed.items():
        weights = _canonical(dict(profiles[name].weights))
        assert weights == shipped or weights in benchmarked, (
            f"{source}: model {model!r} runs profile {name!r} with weights {weights}, neither the "
            f"shipped default ({shipped}) nor any benchmarked run's"
        )


def test_the_check_catches_a_config_that_redefines_the_default() -> None:
    data = _load("deploy/base/config/gateway.yaml")
    data["profiles"]["default"] = {"weights": {"queue": 7, "kv-cache": 1}}
    profiles = parse_config(data).scheduler_profiles()
    assert _canonical(dict(profiles["default"].weights)) not in _benchmarked_weights()
