"""bench/vtime/decisions.py: a refactor's before/after check tells identical runs from changed ones."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.vtime import decisions


def _run(pod: str) -> dict[str, object]:
    return {"rows": [[0, pod, 200, "0.25", "1.5", 9, None, ["0.01"]]], "decisions": 1, "steps": 3}


def test_identical_runs_pass_and_a_changed_pick_fails(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before, same, moved = tmp_path / "a.json", tmp_path / "b.json", tmp_path / "c.json"
    before.write_text(json.dumps({"uniform/epp-default": _run("p1")}))
    same.write_text(json.dumps({"uniform/epp-default": _run("p1")}))
    moved.write_text(json.dumps({"uniform/epp-default": _run("p2")}))
    assert decisions.main(["diff", str(before), str(same)]) == 0
    assert "identical (1 requests, 1 decisions)" in capsys.readouterr().out
    assert decisions.main(["diff", str(before), str(moved)]) == 1
    assert "1 of 1 requests differ" in capsys.readouterr().out
