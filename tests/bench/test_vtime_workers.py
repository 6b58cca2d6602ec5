"""#39: a multi-core EPP decides as one process does. In virtual time every request takes the
workers' path (parsed by an ext_proc worker, the record through the IPC frame, `on_prepared`
in the deciding process); the run must equal the one-process run request for request."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from bench.harness.scenario import load_scenario
from bench.vtime import workers_table
from bench.vtime.cli import replica_label, run_one
from epp.requestcontrol.parse import WorkerParser


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


def _summary(root: Path, label: str, p95: float, commit: str = "a" * 40) -> None:
    path = root / "quick" / "s" / label / "seed-1.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    stats = {"steady": {"ttft_p50": 0.01, "ttft_p95": p95}}
    run = {"engines": [{"pod": "p", "steps": 3}], "decisions": 9}
    path.write_text(json.dumps({"env": {"git": {"commit": commit}}, "stats": stats, "run": run}))


def test_workers_table_tells_a_different_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _summary(tmp_path, "epp-default", 0.1)
    _summary(tmp_path, "epp-default-2workers", 0.1)
    assert workers_table.main(["--summaries", str(tmp_path)]) == 0
    assert "1 of 1 pairs the same run" in capsys.readouterr().out
    _summary(tmp_path, "epp-default-2workers", 0.2)
    assert workers_table.main(["--summaries", str(tmp_path)]) == 1
    _summary(tmp_path, "epp-default-2workers", 0.2, commit="b" * 40)
    assert workers_table.main(["--summaries", str(tmp_path)]) == 0
    assert "not comparable" in capsys.readouterr().out
