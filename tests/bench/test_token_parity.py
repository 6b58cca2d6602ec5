"""The shipped tokenizer tokenizes the bench's text at about the workloads' chars / 4 target,
so a tokenizing fleet (precise policies) carries the scenarios' designed load."""

from __future__ import annotations

import pytest

from bench.probes.token_parity import MAX_RATIO, SCENARIOS_DIR, main, measure
from modelsim.build_tokenizer import OUT
from modelsim.tokenizer import HFTokenizer


def test_shipped_tokenizer_matches_the_workloads_target() -> None:
    shipped = HFTokenizer(OUT)
    for name, requests in (("shared-prefix", 20), ("mixed-gpu", 60)):
        parity = measure(SCENARIOS_DIR / f"{name}.yaml", 100, requests, shipped)
        assert parity.requests == requests
        assert 1 / MAX_RATIO <= parity.ratio <= MAX_RATIO, parity.line()
        assert 0.9 <= parity.approx / parity.target <= 1.0  # the usual fleet, for comparison


def test_parity_check_fails_when_a_tokenizer_is_off(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["--scenario", str(SCENARIOS_DIR / "mixed-gpu.yaml"), "--requests", "20"]
    assert main(args) == 0
    assert main([*args, "--max-ratio", "1.0001"]) == 1  # no tokenizer is exact: the bound bites
    assert "OFF" in capsys.readouterr().out
