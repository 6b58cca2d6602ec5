"""Results on disk (JSON) and the benchmark report (markdown sections + PNG plots).

One run = one scenario under one policy, saved as `<results>/<scenario>/<policy>.json`. The
report renders one markdown section per scenario into `docs/benchmarks.md`, between marker
comments so re-running replaces just that section and leaves hand-written text alone.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from bench.loadgen import RequestResult, RunResult
from bench.stats import Summary, compare, summarize

BASELINE = "round-robin"


@dataclass
class PolicyRun:
    scenario: str
    policy: str
    mode: str
    results: list[RequestResult]
    wall_s: float = 0.0
    started_at: float = 0.0
    not_sent: int = 0
    meta: dict[str, Any] = field(default_factory=dict)  # fleet, workload, arrivals, duration, notes


def save_run(results_dir: str | Path, run: PolicyRun) -> Path:
    path = Path(results_dir) / run.scenario / f"{run.policy}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {
        "scenario": run.scenario,
        "policy": run.policy,
        "mode": run.mode,
        "wall_s": run.wall_s,
        "started_at": run.started_at,
        "not_sent": run.not_sent,
        "meta": run.meta,
        "summary": summarize(run.results).to_dict(),
        "results": [r.to_dict() for r in run.results],
    }
    path.write_text(json.dumps(data, indent=1))
    return path


def run_from(scenario: str, policy: str, mode: str, run: RunResult, meta: dict[str, Any]) -> PolicyRun:
    return PolicyRun(scenario, policy, mode, run.results, run.wall_s, run.started_at, run.not_sent, meta)


def load_run(path: str | Path) -> PolicyRun:
    data = json.loads(Path(path).read_text())
    return PolicyRun(
        scenario=data["scenario"],
        policy=data["policy"],
        mode=data.get("mode", "quick"),
        results=[RequestResult.from_dict(r) for r in data["results"]],
        wall_s=data.get("wall_s", 0.0),
        started_at=data.get("started_at", 0.0),
        not_sent=data.get("not_sent", 0),
        meta=data.get("meta", {}),
    )


def load_results(results_dir: str | Path) -> dict[str, dict[str, PolicyRun]]:
    """{scenario: {policy: run}} for every saved run under `results_dir`."""
    out: dict[str, dict[str, PolicyRun]] = {}
    for path in sorted(Path(results_dir).glob("*/*.json")):
        run = load_run(path)
        out.setdefault(run.scenario, {})[run.policy] = run
    return out


# ---------------------------------------------------------------- markdown


def _ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value * 1000:,.0f} ms" if value < 10 else f"{value:,.1f} s"


def _pct(value: float | None) -> str:
    return "" if value is None else f" ({value:+.0f} %)"


def render_table(summaries: Mapping[str, Summary], baseline: str = BASELINE) -> str:
    base = summaries.get(baseline)
    lines = [
        "| policy | requests | TTFT P50 | TTFT P95 | TTFT P99 | E2E P95 | output tok/s | errors |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for policy, s in summaries.items():
        delta = compare(s, base) if base is not None and policy != baseline else {}
        errors = str(s.errors)
        if s.error_kinds:
            errors += " (" + ", ".join(f"{k}: {v}" for k, v in sorted(s.error_kinds.items())) + ")"
        lines.append(
            f"| {policy} | {s.requests} | {_ms(s.ttft_p50)}{_pct(delta.get('ttft_p50'))} "
            f"| {_ms(s.ttft_p95)}{_pct(delta.get('ttft_p95'))} | {_ms(s.ttft_p99)}{_pct(delta.get('ttft_p99'))} "
            f"| {_ms(s.e2e_p95)}{_pct(delta.get('e2e_p95'))} "
            f"| {s.output_tok_s:,.0f}{_pct(delta.get('output_tok_s'))} | {errors} |"
        )
    return "\n".join(lines)


def render_section(
    scenario: str,
    runs: Mapping[str, PolicyRun],
    images: Sequence[str] = (),
    baseline: str = BASELINE,
) -> str:
    """Markdown for one scenario: setup line, the table (changes vs `baseline` in %), plots."""
    summaries = {policy: summarize(run.results) for policy, run in runs.items()}
    first = next(iter(runs.values()))
    meta = first.meta
    lines = [f"### {scenario}", ""]
    if meta.get("description"):
        lines += [str(meta["description"]), ""]
    setup = []
    if "fleet" in meta:
        pods = meta["fleet"].get("pods", [])
        setup.append("fleet " + ", ".join(f"{p.get('replicas', 1)}x {p['profile']}" for p in pods))
    if "arrivals" in meta:
        a = meta["arrivals"]
        setup.append(f"arrivals {a.get('pattern', 'poisson')} at {a.get('rate')} req/s")
    if "duration_s" in meta:
        setup.append(f"{meta['duration_s']:g} s ({first.mode} mode)")
    if setup:
        lines += ["Setup: " + "; ".join(setup) + ".", ""]
    lines.append(render_table(summaries, baseline))
    if baseline in summaries:
        lines += ["", f"Changes in parentheses are relative to `{baseline}`."]
    lag = max((s.lag_p99 or 0.0) for s in summaries.values())
    lines += ["", f"Load-generator send lag P99 (worst policy): {lag * 1000:.1f} ms."]
    for image in images:
        lines += ["", f"![{Path(image).stem}]({image})"]
    return "\n".join(lines) + "\n"


def _markers(key: str) -> tuple[str, str]:
    return f"<!-- bench:{key}:start -->", f"<!-- bench:{key}:end -->"


def write_section(doc_path: str | Path, key: str, markdown: str, title: str = "# Benchmarks") -> None:
    """Insert or replace the block for `key` in the document, keeping everything else."""
    path = Path(doc_path)
    text = path.read_text() if path.exists() else f"{title}\n\n"
    start, end = _markers(key)
    block = f"{start}\n{markdown.rstrip()}\n{end}"
    pattern = re.compile(re.escape(start) + r".*?" + re.escape(end), re.S)
    if pattern.search(text):
        text = pattern.sub(lambda _: block, text)
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


# ---------------------------------------------------------------- plots


def plot_ttft_cdf(runs: Mapping[str, PolicyRun], path: str | Path, title: str = "") -> Path:
    """TTFT CDF, one line per policy, log-scaled x: tails are what routing changes."""
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for policy, run in runs.items():
        ttft = sorted(r.ttft_s for r in run.results if r.ok and r.ttft_s is not None)
        if not ttft:
            continue
        ys = [(i + 1) / len(ttft) for i in range(len(ttft))]
        ax.step(ttft, ys, where="post", label=f"{policy} (n={len(ttft)})")
    ax.set_xscale("log")
    ax.set_xlabel("TTFT (s)")
    ax.set_ylabel("fraction of requests")
    ax.set_title(title or "TTFT CDF")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    return _save(fig, path)


def plot_ttft_timeseries(
    runs: Mapping[str, PolicyRun],
    path: str | Path,
    title: str = "",
    spikes: Sequence[tuple[float, float]] = (),
) -> Path:
    """TTFT of each request against its send time, per policy; shaded spans mark traffic spikes."""
    fig, ax = plt.subplots(figsize=(8, 4.2))
    for start, end in spikes:
        ax.axvspan(start, end, color="orange", alpha=0.15)
    for policy, run in runs.items():
        points = sorted((r.sent_s, r.ttft_s) for r in run.results if r.ok and r.ttft_s is not None)
        if points:
            ax.plot(*zip(*points, strict=True), ".", markersize=3, alpha=0.6, label=policy)
    ax.set_yscale("log")
    ax.set_xlabel("send time (s)")
    ax.set_ylabel("TTFT (s)")
    ax.set_title(title or "TTFT over time")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(loc="upper left", fontsize=8, markerscale=3)
    return _save(fig, path)


def _save(fig: Any, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def spike_windows(arrivals: Mapping[str, Any], duration_s: float) -> list[tuple[float, float]]:
    if arrivals.get("pattern") != "bursty":
        return []
    length = float(arrivals.get("spike_len_s", 5.0))
    every = float(arrivals.get("spike_every_s", 30.0))
    start = float(arrivals.get("first_spike_s", every - length))
    spans = []
    while start < duration_s:
        spans.append((start, min(start + length, duration_s)))
        start += every
    return spans


def build_report(
    results_dir: str | Path, doc_path: str | Path, img_dir: str | Path, baseline: str = BASELINE
) -> list[str]:
    """Render every saved scenario into `doc_path` (+ plots in `img_dir`); returns scenario names."""
    doc_path, img_dir = Path(doc_path), Path(img_dir)
    all_runs = load_results(results_dir)
    for scenario, runs in sorted(all_runs.items()):
        ordered = dict(sorted(runs.items(), key=lambda kv: (kv[0] != baseline, kv[0])))
        cdf = plot_ttft_cdf(ordered, img_dir / f"{scenario}-ttft-cdf.png", f"{scenario}: TTFT CDF")
        images = [cdf]
        meta = next(iter(ordered.values())).meta
        if meta.get("arrivals", {}).get("pattern") in ("bursty", "gamma"):
            spikes = spike_windows(meta["arrivals"], float(meta.get("duration_s", 0)))
            images.append(
                plot_ttft_timeseries(
                    ordered, img_dir / f"{scenario}-ttft-time.png", f"{scenario}: TTFT over time", spikes
                )
            )
        rel = [Path(os.path.relpath(p, doc_path.parent)).as_posix() for p in images]
        write_section(doc_path, f"scenario:{scenario}", render_section(scenario, ordered, rel, baseline))
    return sorted(all_runs)
