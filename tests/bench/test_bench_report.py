"""Report: results round-trip through JSON, markdown tables with deltas, sections, PNG plots."""

from __future__ import annotations

from pathlib import Path

from bench.loadgen import RequestResult
from bench.report import (
    PolicyRun,
    build_report,
    load_results,
    plot_ttft_cdf,
    plot_ttft_timeseries,
    render_section,
    save_run,
    spike_windows,
    write_section,
)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
META = {
    "description": "Two policies on a toy fleet.",
    "fleet": {"pods": [{"model": "m", "profile": "h100-llama3.1-8b", "replicas": 2}]},
    "arrivals": {"pattern": "bursty", "rate": 2, "spike_len_s": 2, "spike_every_s": 5},
    "duration_s": 12,
}


def _results(ttft_scale: float, n: int = 40) -> list[RequestResult]:
    out = [
        RequestResult(i, "chat", i * 0.3, i * 0.3, 0.001, ttft_scale * (i + 1), ttft_scale * (i + 1) + 1, [0.01],
                      50, 50, 200, None, f"pod-{i % 2}")
        for i in range(n)
    ]  # fmt: skip
    out.append(RequestResult(n, "chat", 1.0, 1.0, status=429, error="HTTP 429: full"))
    return out


def _runs() -> dict[str, PolicyRun]:
    return {
        "round-robin": PolicyRun("toy", "round-robin", "quick", _results(0.1), 12.0, 1.0, 0, META),
        "epp": PolicyRun("toy", "epp", "quick", _results(0.05), 12.0, 1.0, 0, META),
    }


def test_section_has_table_with_changes_vs_round_robin() -> None:
    md = render_section("toy", _runs(), images=["img/toy-ttft-cdf.png"])
    assert md.startswith("### toy\n")
    assert "Two policies on a toy fleet." in md
    assert "fleet 2x h100-llama3.1-8b" in md and "bursty at 2 req/s" in md
    rows = {line.split("|")[1].strip(): line for line in md.splitlines() if line.startswith("| ")}
    assert "(-50 %)" in rows["epp"]  # every TTFT percentile halves
    assert "(" not in rows["round-robin"].split("|")[3]  # no self-comparison
    assert "http-429: 1" in rows["epp"]
    assert "| 41 |" in rows["epp"]
    assert "![toy-ttft-cdf](img/toy-ttft-cdf.png)" in md


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
    runs = _runs()
    for path in (
        plot_ttft_cdf(runs, tmp_path / "cdf.png"),
        plot_ttft_timeseries(runs, tmp_path / "ts.png", spikes=[(3, 5)]),
    ):
        data = path.read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 5000


def test_spike_windows() -> None:
    assert spike_windows(META["arrivals"], 12) == [(3.0, 5.0), (8.0, 10.0)]
    assert spike_windows({"pattern": "poisson"}, 12) == []


def test_save_load_and_build_report(tmp_path: Path) -> None:
    for run in _runs().values():
        save_run(tmp_path / "results", run)
    loaded = load_results(tmp_path / "results")
    assert set(loaded["toy"]) == {"round-robin", "epp"}
    assert loaded["toy"]["epp"].results == _runs()["epp"].results
    doc = tmp_path / "docs" / "benchmarks.md"
    names = build_report(tmp_path / "results", doc, tmp_path / "docs" / "img")
    assert names == ["toy"]
    text = doc.read_text()
    assert "### toy" in text and "](img/toy-ttft-cdf.png)" in text and "](img/toy-ttft-time.png)" in text
    assert text.index("| round-robin |") < text.index("| epp |")  # baseline first
    assert (tmp_path / "docs" / "img" / "toy-ttft-time.png").read_bytes().startswith(PNG_MAGIC)
