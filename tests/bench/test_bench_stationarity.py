"""Offered load of every shipped scenario is stationary (trace generation only, no fleet)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from bench.harness.scenario import load_scenario
from bench.harness.stationarity import check_stationarity
from bench.harness.summary import REPORTING_SEEDS
from bench.harness.workloads import TraceRequest, chat_body, generate_trace, poisson_arrivals

SCENARIOS = sorted((Path(__file__).parents[2] / "bench" / "scenarios").glob("*.yaml"))


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.stem)
def test_every_scenario_offers_a_stationary_load(path: Path) -> None:
    scenario = load_scenario(path, "quick")
    for seed in REPORTING_SEEDS:
        verdict = check_stationarity(scenario.with_seed(seed).trace(), scenario.duration_s)
        assert verdict.ok, f"{path.stem} seed {seed}: {verdict.describe()}"


def test_sessions_all_starting_at_turn_zero_drift_and_staggering_fixes_it() -> None:
    workload = {"kind": "sessions", "model": "m", "sessions": 32, "turns": 64, "system_tokens": 2500,
                "question_tokens": 60, "answer_tokens": 100}  # fmt: skip
    arrivals = {"pattern": "gamma", "rate": 20, "burstiness": 0.5}
    growing = check_stationarity(generate_trace(workload, arrivals, 45, 1), 45)
    assert {c.name: c.ok for c in growing.checks} == {
        "arrival rate (req/s)": True, "mean prompt tokens": False, "mean max_tokens": True,
    }  # fmt: skip
    staggered = check_stationarity(generate_trace({**workload, "staggered": True}, arrivals, 45, 1), 45)
    assert staggered.ok, staggered.describe()


def _step_trace(first_rate: float, second_rate: float) -> list[TraceRequest]:
    rng = random.Random(4)
    times = poisson_arrivals(first_rate, 50, rng) + [50 + t for t in poisson_arrivals(second_rate, 50, rng)]
    body = chat_body("m", [{"role": "user", "content": "x" * 400}], 50)
    return [TraceRequest(t, body) for t in times]


def test_a_rate_step_fails_and_noise_does_not() -> None:
    step = check_stationarity(_step_trace(10, 20), 100)
    assert not step.ok and not step.checks[0].ok and step.checks[0].change == pytest.approx(1.0, abs=0.2)
    assert check_stationarity(_step_trace(15, 15), 100).ok


def test_too_short_or_bad_arguments_raise() -> None:
    with pytest.raises(ValueError, match="no arrivals"):
        check_stationarity(_step_trace(15, 15)[:3], 100)
    with pytest.raises(ValueError, match="even"):
        check_stationarity(_step_trace(15, 15), 100, windows=5)
