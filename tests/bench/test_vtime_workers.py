"""#39: a multi-core EPP decides as one process does. In virtual time every request takes the
workers' path (parsed by an ext_proc worker, the record through the IPC frame, `on_prepared`
in the deciding process); the run must equal the one-process run request for request."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from bench.harness.scenario import load_scenario
from bench.vtime.cli import replica_label, run_one
from epp.parse import WorkerParser


def _outcome(scenario: str, workers: int, replicas: int = 1) -> list[tuple[Any, ...]]:
    short = dataclasses.replace(
        load_scenario(f"bench/scenarios/{scenario}.yaml", "quick").with_seed(1), duration_s=6.0
    )
    results, _, router = run_one(short, "epp-default", gateway_ms=1.0, workers=workers, replicas=replicas)
    assert router.name == replica_label("epp-default", replicas, workers)
    return [(r.index, r.pod, r.status, r.ttft_s, r.output_tokens) for r in results]


@pytest.mark.parametrize("scenario", ["shared-prefix", "lora"])
def test_workers_decide_as_one_process(scenario: str, monkeypatch: pytest.MonkeyPatch) -> None:
    parsed = 0
    real = WorkerParser.__call__

    def counting(self: WorkerParser, *args: Any) -> Any:
        nonlocal parsed
        parsed += 1
        record = real(self, *args)
        assert record is not None  # the worker parsed: the deciding process gets its record
        return record

    monkeypatch.setattr(WorkerParser, "__call__", counting)
    one = _outcome(scenario, 0)
    assert parsed == 0
    two = _outcome(scenario, 2)
    assert parsed == len(two) > 50
    assert {pod for _, pod, *_ in one} and all(status == 200 for _, _, status, *_ in one)
    assert two == one


def test_workers_and_replicas_decide_as_replicas_alone() -> None:
    assert _outcome("shared-prefix", 3, replicas=2) == _outcome("shared-prefix", 0, replicas=2)
