"""Run summaries: steady window, sustained throughput, goodput, provenance, seed sets."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

import pytest
import yaml

from bench.harness.loadgen import RequestResult, without_probe_time
from bench.harness.scenario import load_scenario
from bench.harness.stats import goodput, phase_stats, slo_attainment, steady_window, tokens_between
from bench.harness.summary import (
    PACKAGES,
    REPORTING_SEEDS,
    TUNING_SEEDS,
    build_summary,
    load_summaries,
    seed_set,
    write_summary,
)


def _req(i: int, at: float, ttft: float, tokens: int = 10, gap: float = 0.1, **kw) -> RequestResult:
    """A request sent on schedule whose `tokens` chunks come `gap` apart after the first."""
    e2e = ttft + gap * (tokens - 1)
    return RequestResult(
        i, "t", at, at, 0.0, ttft, e2e, [gap] * (tokens - 1), tokens, tokens, 200, None, f"pod-{i % 2}", **kw
    )


def test_window_phases_and_sustained_tokens() -> None:
    # Arrivals every second from 0 to 99 s, 10 tokens each over 0.9 s after a 0.1 s TTFT.
    results = [_req(i, float(i), 0.1) for i in range(100)]
    w = steady_window(results)
    assert (w.start_s, w.end_s) == pytest.approx((9.9, 99.0))
    stats = phase_stats(results, slo_ttft_s=0.5)
    assert stats["warmup"]["requests"] == 10  # arrivals at 0..9 s
    assert stats["steady"]["requests"] == 90
    # One request's 10 tokens per second in steady state: 10 tok/s, the drain excluded.
    assert stats["steady"]["output_tok_s"] == pytest.approx(10.0, rel=0.02)
    assert stats["drain"]["requests_completing"] in (1, 2)  # the last arrival (and float rounding)
    assert stats["drain"]["duration_s"] == pytest.approx(1.0)
    assert stats["drain"]["output_tokens"] == pytest.approx(10, abs=1)  # the last one's, after 99 s
    assert stats["steady"]["goodput"] == 1.0
    assert stats["steady"]["goodput_rps"] == pytest.approx(90 / 89.1)
    assert stats["steady"]["pod_share"] == {"pod-0": 0.5, "pod-1": 0.5}
    assert len(stats["by_window"]) == 10 and sum(w["requests"] for w in stats["by_window"]) == 100


def test_a_backlog_shows_in_the_drain_not_in_sustained_throughput() -> None:
    # Same work, but TTFT grows 0.5 s per request: the tail completes long after the last arrival.
    steady = phase_stats([_req(i, float(i), 0.1) for i in range(50)])
    backlog = phase_stats([_req(i, float(i), 0.1 + 0.5 * i) for i in range(50)])
    assert backlog["drain"]["duration_s"] > 20 > steady["drain"]["duration_s"]
    assert backlog["steady"]["output_tok_s"] < steady["steady"]["output_tok_s"]
    assert backlog["steady"]["ttft_p95"] > 20  # late arrivals keep their slow TTFTs in the window
    assert backlog["by_window"][-1]["ttft_p50"] > backlog["by_window"][0]["ttft_p50"]


def test_goodput_counts_failures_as_misses() -> None:
    results = [_req(0, 0, 0.1), _req(1, 1, 0.9), RequestResult(2, "t", 2, status=503, error="HTTP 503: x")]
    assert goodput(results, 0.5) == pytest.approx(1 / 3)
    assert goodput(results, None) is None and goodput([], 0.5) is None


def test_slo_attainment_holds_each_request_to_its_own_objective() -> None:
    # tight (0.1 s): met, missed, refused; loose (1 s): met at 0.9 s; one without an objective.
    def asked(i: int, ttft: float, slo: float, tag: str) -> RequestResult:
        return dataclasses.replace(_req(i, 10.0 + i, ttft), tag=tag, slo_ttft_s=slo)

    refused = RequestResult(2, "tight", 12.0, 12.0, status=429, error="HTTP 429: x", slo_ttft_s=0.1)
    results = [
        asked(0, 0.05, 0.1, "tight"),
        asked(1, 0.2, 0.1, "tight"),
        refused,
        asked(3, 0.9, 1.0, "loose"),
    ]
    assert slo_attainment(results) == pytest.approx(2 / 4)
    assert slo_attainment([_req(0, 0, 0.1)]) is None  # no request asked for one
    warm = [_req(100 + i, float(i), 5.0) for i in range(10)]  # arrivals 0-9 s: warm-up, no objective
    steady = phase_stats([*warm, *results, _req(4, 14.0, 5.0)])["steady"]
    assert steady["slo_attainment"] == pytest.approx(2 / 4)  # the request without one is left out
    assert steady["slo_goodput_rps"] == pytest.approx(2 / (14.0 - 1.4))  # met per steady second
    assert steady["by_tag"]["tight"]["slo_attainment"] == pytest.approx(1 / 3)
    assert steady["by_tag"]["loose"]["slo_attainment"] == 1.0
    assert "slo_attainment" not in steady["by_tag"]["t"]
    assert "slo_attainment" not in phase_stats(warm)["steady"]


def test_tokens_between_splits_a_request_across_the_boundary() -> None:
    r = _req(0, 0.0, 1.0, tokens=5, gap=1.0)  # chunks at 1, 2, 3, 4, 5 s
    assert tokens_between([r], 0.0, 3.0) == 2
    assert tokens_between([r], 3.0, 10.0) == 3


def test_probe_time_is_taken_out_and_reported_apart() -> None:
    results = without_probe_time(
        [_req(i, float(i), 0.3, probe_s=0.2) for i in range(20)] + [_req(20, 20, 0.3)]
    )
    assert results[0].ttft_s == pytest.approx(0.1) and results[0].probe_s == 0.2
    assert results[-1].ttft_s == 0.3  # no probe header: untouched
    stats = phase_stats(results)["steady"]
    assert stats["probe_p50"] == pytest.approx(0.2)


def test_seed_sets_are_disjoint_and_named() -> None:
    assert not set(REPORTING_SEEDS) & set(TUNING_SEEDS)
    assert seed_set(REPORTING_SEEDS[0]) == "reporting" and seed_set(TUNING_SEEDS[0]) == "tuning"
    assert seed_set(-5) == "other"


def _scenario_file(tmp_path: Path) -> Path:
    path = tmp_path / "toy.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "description": "Toy.",
                "slo": {"ttft_s": 0.5},
                "fleet": {"pods": [{"model": "m", "profile": "h100-llama3.1-8b", "replicas": 2}]},
                "workload": {"kind": "chat", "model": "m"},
                "arrivals": {"pattern": "poisson", "rate": 5},
                "duration_s": 20,
            }
        )
    )
    return path


def test_summary_records_provenance_and_stays_small(tmp_path: Path) -> None:
    path = _scenario_file(tmp_path)
    scenario = load_scenario(path, "quick").with_seed(REPORTING_SEEDS[0])
    results = [_req(i, i * 0.2, 0.1 + (0.6 if i % 10 == 0 else 0)) for i in range(100)]
    env = {"git": {"commit": "abc", "dirty": False}, "packages": {p: "1" for p in PACKAGES}, "cpu_count": 2}
    run = {"wall_s": 21.0, "machine_before": {"loadavg": [0.5, 0.4, 0.3]}, "max_requests": None}
    config = {"kind": "gateway", "profile": {"weights": {"queue": 2}}}
    summary = build_summary(
        scenario=scenario, policy="epp-best", policy_config=config, results=results, run=run, env=env
    )
    assert summary["scenario"]["digest"] == "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()
    assert summary["seed"] == REPORTING_SEEDS[0] and summary["seed_set"] == "reporting"
    assert summary["policy"]["config"]["profile"]["weights"] == {"queue": 2}
    assert summary["scenario"]["slo_ttft_s"] == 0.5
    assert summary["stats"]["steady"]["goodput"] == pytest.approx(0.9, abs=0.02)
    written = write_summary(tmp_path / "summaries", summary)
    assert (
        written == tmp_path / "summaries" / "quick" / "toy" / "epp-best" / f"seed-{REPORTING_SEEDS[0]}.json"
    )
    assert written.stat().st_size < 8000
    assert json.loads(written.read_text())["policy"]["name"] == "epp-best"

    tuning = dict(summary, seed=TUNING_SEEDS[0])
    write_summary(tmp_path / "summaries", tuning)
    loaded = load_summaries(tmp_path / "summaries", "quick")
    assert [s["seed"] for s in loaded["toy"]["epp-best"]] == [REPORTING_SEEDS[0]]  # tuning seed left out
    assert load_summaries(tmp_path / "summaries", "full") == {}


def test_environment_names_the_commit_and_packages() -> None:
    from bench.harness.summary import environment

    env = environment()
    assert set(env["packages"]) == set(PACKAGES)
    assert env["packages"]["inference-gateway"] is not None  # this project, installed editable
    assert env["git"]["commit"] is None or len(env["git"]["commit"]) == 40
    assert env["cpu_count"] >= 1


def test_a_shipped_scenario_is_named_by_its_repo_path() -> None:
    path = Path(__file__).parents[2] / "bench" / "scenarios" / "uniform.yaml"
    scenario = load_scenario(path, "full").with_seed(REPORTING_SEEDS[1])
    summary = build_summary(
        scenario=scenario, policy="round-robin", policy_config={}, results=[_req(0, 0, 0.1), _req(1, 1, 0.1)],
        run={}, env={},
    )  # fmt: skip
    assert summary["scenario"]["file"] == "bench/scenarios/uniform.yaml"
    assert summary["scenario"]["mode"] == "full" and summary["scenario"]["slo_ttft_s"] == 0.5
