"""A latency objective changes `WeightedScheduler.pick`'s ranking (epp/scheduling/slo.py applied
in epp/scheduling/weighted.py), not only the pure `slo_order`: a pod the profile ranks first but
predicted to miss the objective gives way to the best-ranked pod that meets it."""

from __future__ import annotations

import dataclasses
import random

import pytest

from epp.datalayer.endpoint_records import EndpointState
from epp.scheduling.weighted import WeightedScheduler
from gateway.profiles import profile

from .factories import req, snap, state

PROMPT = "y" * 1600  # 400 estimated tokens
# Ranks by free KV alone (the prediction is not in its weights); 30 queued is not saturated.
KV_ONLY = profile("kv-only", {"kv-cache": 1}, thresholds={"queue": 50})


def pod(address: str, *, waiting: float, kv: float) -> EndpointState:
    """A pod at 20,000 prompt tokens/s whose typical prompt is 400 tokens."""
    return dataclasses.replace(
        state(address, waiting=waiting, kv=kv), prefill_tps=20_000.0, mean_prompt_tokens=400.0
    )


# `roomy`: free KV but 30 queued prompts (about 0.6 s to a first token); `busy`: fuller KV, no queue.
ROOMY, BUSY = pod("roomy", waiting=30, kv=0.0), pod("busy", waiting=0, kv=0.6)


def pick(slo_s: float | None) -> tuple[tuple[str, ...], bool | None]:
    scheduler = WeightedScheduler({"kv-only": KV_ONLY}, "kv-only", rng=random.Random(0))
    request = dataclasses.replace(req(PROMPT), slo_ttft_s=slo_s)
    decision = scheduler.pick(request, snap(ROOMY, BUSY))
    return decision.ranked, decision.slo_met


def test_without_an_objective_the_profiles_ranking_stands() -> None:
    assert pick(None) == (("roomy", "busy"), None)


def test_the_pick_commits_the_predicted_prefill_only_where_it_predicted() -> None:
    """kv-only predicts only for a request with an objective: then the pick charges the chosen
    pod's ledger with this prompt's prefill (400 tokens at 20,000/s), otherwise with nothing."""
    scheduler = WeightedScheduler({"kv-only": KV_ONLY}, "kv-only", rng=random.Random(0))
    plain = scheduler.pick(req(PROMPT), snap(ROOMY, BUSY))
    assert plain.prefill_s == 0.0
    timed = scheduler.pick(dataclasses.replace(req(PROMPT), slo_ttft_s=0.2), snap(ROOMY, BUSY))
    assert timed.prefill_s == pytest.approx(400 / 20_000)


def test_an_objective_every_pod_meets_keeps_the_ranking() -> None:
    assert pick(60.0) == (("roomy", "busy"), True)


def test_an_objective_only_the_second_pod_meets_moves_the_request_there() -> None:
    assert pick(0.2) == (("busy", "roomy"), True)


def test_an_objective_no_pod_meets_takes_the_least_late_pod_and_says_so() -> None:
    assert pick(0.000_001) == (("busy", "roomy"), False)
