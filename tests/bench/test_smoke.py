"""The bench-smoke comparison: what counts as a regression (not how fast anything is)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.micro import smoke
from bench.micro.smoke import regressions

BASE = {"scrape_us": 100.0, "pick_p99_us_100": 500.0}


def test_within_twice_the_baseline_passes() -> None:
    assert regressions(BASE, {"scrape_us": 199.9, "pick_p99_us_100": 1000.0}) == []
    assert regressions(BASE, {"scrape_us": 20.0, "pick_p99_us_100": 10.0}) == []  # faster is fine


def test_more_than_twice_the_baseline_fails_naming_the_figure_and_the_ratio() -> None:
    problems = regressions(BASE, {"scrape_us": 250.0, "pick_p99_us_100": 400.0})
    assert problems == ["scrape_us: 250.0 is 2.5x the baseline 100.0 (limit 2x)"]


@pytest.mark.parametrize(
    ("baseline", "measured", "fragment"),
    [
        (BASE, {"scrape_us": 100.0}, "pick_p99_us_100: not measured"),
        ({"scrape_us": 0.0}, {"scrape_us": 1.0}, "not a positive number"),
        ({"scrape_us": 100.0}, {"scrape_us": 100.0, "new_us": 1.0}, "new_us: measured but has no baseline"),
    ],
)
def test_a_baseline_that_does_not_match_the_figures_fails(baseline, measured, fragment) -> None:
    assert any(fragment in p for p in regressions(baseline, measured))


def test_main_exits_non_zero_with_a_clear_message_on_a_regression(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "baseline.json"
    path.write_text(json.dumps(BASE))
    monkeypatch.setattr(smoke, "measure", lambda: {"scrape_us": 300.0, "pick_p99_us_100": 500.0})
    assert smoke.main(["--baseline", str(path)]) == 1
    assert "PERFORMANCE REGRESSION" in capsys.readouterr().err
    monkeypatch.setattr(smoke, "measure", lambda: {"scrape_us": 150.0, "pick_p99_us_100": 500.0})
    assert smoke.main(["--baseline", str(path)]) == 0
    assert smoke.main(["--baseline", str(path), "--update"]) == 0
    assert json.loads(path.read_text())["scrape_us"] == 150.0


def test_the_committed_baseline_has_every_measured_figure() -> None:
    committed = json.loads(smoke.DEFAULT_BASELINE.read_text())
    assert set(committed) == {"scrape_us", "pick_p99_us_100"} and all(v > 0 for v in committed.values())
