"""The chaos soak's bookkeeping (bench/probes/chaos_soak.py, chaos_report.py): a failure counts
against the fault windows it overlaps, one outside every window is unaccounted for, an
abandoning client is no failure; docs/reliability.md's block is the committed output's."""

from __future__ import annotations

import json
import re
from pathlib import Path

from bench.probes.chaos_report import BEGIN, END, render
from bench.probes.chaos_soak import Window, account, verdict
from bench.probes.chaos_traffic import ABANDONED, OK, Outcome

REPO = Path(__file__).parents[2]


def test_failures_are_held_against_the_windows_they_overlap() -> None:
    windows = [Window("kill_pod:0", 10.0, 20.0), Window("stop_store", 18.0, 30.0)]
    outcomes = [
        Outcome("chat", 1.0, 2.0, OK),
        Outcome("abandon", 2.0, 3.0, ABANDONED),  # the client left: not a failure
        Outcome("chat", 9.0, 11.0, "http_503"),  # overlaps the pod's window
        Outcome("chat_stream", 19.0, 19.5, "cut"),  # inside both
        Outcome("messages", 40.0, 41.0, "exc_ReadError"),  # outside every window
    ]
    out = account(outcomes, windows, t0=0.0)
    assert out["failed"] == 3
    assert out["errors_per_window"] == {"kill_pod:0": 2, "stop_store": 1}
    assert out["unaccounted"] == [{"kind": "messages", "result": "exc_ReadError", "at_s": 40.0}]
    assert out["by_kind"]["chat"] == {"ok": 1, "http_503": 1}


def test_the_committed_page_shows_the_committed_output() -> None:
    page = (REPO / "docs/reliability.md").read_text()
    block = page.split(BEGIN, 1)[1].split(END, 1)[0].strip()
    source = re.search(r"From `([^`]+)`", block)
    assert source is not None, "the block names no output"
    summary = json.loads((REPO / source.group(1)).read_text())
    assert block == render(summary, source.group(1)), "regenerate: python -m bench.probes.chaos_report"


def test_the_soak_fails_on_an_unaccounted_failure_or_anything_left_in_flight() -> None:
    clean = {"unaccounted": [], "end": {"settled": True, "store": {"inflight_requests_held": 0}}}
    assert verdict(clean) == []
    leaky = {"unaccounted": [{}], "end": {"settled": False, "store": {"inflight_requests_held": 2}}}
    assert verdict(leaky) == [
        "1 failures outside every fault window",
        "in-flight not back to 0",
        "2 requests held in the store",
    ]
    committed = REPO / "bench/results-committed/2026-12-07-chaos-soak/chaos-soak.json"
    assert verdict(json.loads(committed.read_text())) == []
