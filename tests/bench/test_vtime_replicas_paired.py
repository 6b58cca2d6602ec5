"""The seed-by-seed replica table: ratios on the seeds both runs have, the control row first."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.vtime.replicas_paired import main, paired, rows


def _write(root: Path, scenario: str, label: str, seeds: dict[int, tuple[float, float]]) -> None:
    directory = root / "quick" / scenario / label
    directory.mkdir(parents=True)
    for seed, (p50, p95) in seeds.items():
        steady = {"ttft_p50": p50, "ttft_p95": p95}
        (directory / f"seed-{seed}.json").write_text(json.dumps({"stats": {"steady": steady}}))


def test_paired_reads_only_common_seeds_and_counts_worse_and_better() -> None:
    base = {"seed-1.json": (1.0, 2.0), "seed-2.json": (1.0, 2.0), "seed-3.json": (1.0, 2.0)}
    runs = {
        "seed-1.json": (1.0, 2.2),
        "seed-2.json": (1.0, 1.8),
        "seed-3.json": (1.0, 2.0),
        "seed-9.json": (9.0, 9.0),
    }
    row = paired("2 replicas", runs, base)
    assert row is not None
    assert row.seeds == 3
    assert row.p95_ratio == pytest.approx(1.0)
    assert (row.p95_worse, row.p95_better) == (1, 1)
    assert row.p50_change_pct == pytest.approx(0.0)
    assert paired("none", {}, base) is None


def test_rows_put_the_control_first_and_skip_missing_counts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root, control = tmp_path / "runs", tmp_path / "control"
    _write(root, "s", "epp-default", {1: (1.0, 2.0), 2: (1.0, 4.0)})
    _write(root, "s", "epp-default-2replicas", {1: (1.1, 2.0), 2: (1.1, 4.0)})
    _write(control, "s", "epp-default", {1: (0.9, 2.0), 2: (1.0, 4.0)})
    table = rows(root, "quick", "s", "epp-default", [2, 4], control)
    assert [r.label for r in table] == ["one EPP, other scrape phases", "2 replicas"]
    assert table[1].p50_change_pct == pytest.approx(10.0)
    assert main(["--summaries", str(root), "--control", str(control), "--markdown"]) == 0
    assert "| s | 2 replicas | 2 | +10.0 / +0.0 % |" in capsys.readouterr().out


def test_variant_rows_compare_against_the_policys_one_epp(tmp_path: Path) -> None:
    _write(tmp_path, "s", "epp-default", {1: (1.0, 2.0)})
    _write(tmp_path, "s", "epp-other-2replicas", {1: (1.0, 3.0)})
    table = rows(tmp_path, "quick", "s", "epp-default", [2], None, ["epp-other"])
    assert [r.label for r in table] == ["epp-other, 2 replicas"]
    assert table[0].p95_change_pct == pytest.approx(50.0)
