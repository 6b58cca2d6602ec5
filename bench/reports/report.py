"""The benchmark report: markdown sections (+ optional PNG plots) from committed run summaries.

Each scenario renders between marker comments into the page that holds them (bench/reports/pages.py:
the pages under docs/benchmarks/), so re-running replaces just that section and leaves
hand-written text alone. Tables come from bench/summaries alone
(reporting seeds, median and min-max over them; see bench/harness/summary.py). Raw per-request results,
`<results>/<mode>/<scenario>/<policy>/seed-<n>.json`, are saved here too (git-ignored) and
only feed the plots.
"""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from bench.harness.loadgen import RequestResult, RunResult
from bench.harness.stats import Spread, change_pct, summarize
from bench.harness.summary import REPORTING_SEEDS, load_summaries
from bench.reports.comparable import ADAPTER_ONLY_THRESHOLDS as ADAPTER_ONLY_THRESHOLDS  # re-exported
from bench.reports.comparable import ran
from bench.reports.comparable import shipped_default as shipped_default  # re-exported

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
    seed: int = 0


def raw_path(results_dir: str | Path, mode: str, scenario: str, policy: str, seed: int) -> Path:
    return Path(results_dir) / mode / scenario / policy / f"seed-{seed}.json"


def save_run(results_dir: str | Path, run: PolicyRun) -> Path:
    path = raw_path(results_dir, run.mode, run.scenario, run.policy, run.seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {
        "scenario": run.scenario,
        "policy": run.policy,
        "mode": run.mode,
        "seed": run.seed,
        "wall_s": run.wall_s,
        "started_at": run.started_at,
        "not_sent": run.not_sent,
        "meta": run.meta,
        "summary": summarize(run.results).to_dict(),
        "results": [r.to_dict() for r in run.results],
    }
    path.write_text(json.dumps(data, indent=1))
    return path


def run_from(
    scenario: str, policy: str, mode: str, run: RunResult, meta: dict[str, Any], seed: int = 0
) -> PolicyRun:
    return PolicyRun(
        scenario, policy, mode, run.results, run.wall_s, run.started_at, run.not_sent, meta, seed
    )


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
        seed=data.get("seed", 0),
    )


# ---------------------------------------------------------------- markdown

# (column header, where in a summary's stats, unit) of the main table; every cell is the median
# over the reporting seeds with [min-max].
COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("TTFT P50", "steady.ttft_p50", "s"),
    ("TTFT P95", "steady.ttft_p95", "s"),
    ("TTFT P99", "steady.ttft_p99", "s"),
    ("E2E P95", "steady.e2e_p95", "s"),
    ("ITL P95", "steady.itl_p95", "s"),
    ("sustained tok/s", "steady.output_tok_s", "tok/s"),
    ("goodput", "steady.goodput", "share"),
)
CHANGED = {"steady.ttft_p50", "steady.ttft_p95", "steady.ttft_p99", "steady.e2e_p95", "steady.output_tok_s"}


def stat(summary: Mapping[str, Any], dotted: str) -> Any:
    value: Any = summary["stats"]
    for key in dotted.split("."):
        value = value.get(key) if isinstance(value, Mapping) else None
    return value


def spread(runs: Sequence[Mapping[str, Any]], dotted: str) -> Spread | None:
    return Spread.of(stat(r, dotted) for r in runs)


def _ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value * 1000:,.0f} ms" if value < 10 else f"{value:,.1f} s"


def _fmt(value: float, unit: str) -> str:
    if unit == "s":
        return _ms(value)
    if unit == "share":
        return f"{value * 100:.1f} %"
    return f"{value:,.0f}"


def _range(s: Spread, unit: str) -> str:
    """ " [min-max]" in the median's unit (ms or s for times), empty for a single seed."""
    if s.n == 1:
        return ""
    if unit == "s":
        scale, form = (1000, "{:,.0f}") if s.median < 10 else (1, "{:,.1f}")
        return f" [{form.format(s.lo * scale)}-{form.format(s.hi * scale)}]"
    if unit == "share":
        return f" [{s.lo * 100:.1f}-{s.hi * 100:.1f}]"
    return f" [{s.lo:,.0f}-{s.hi:,.0f}]"


def _pct(value: float | None) -> str:
    return "" if value is None else f" ({value:+.0f} %)"


def cell(s: Spread | None, unit: str, base: Spread | None = None) -> str:
    """`median [min-max] (change of the median vs the baseline's median)`."""
    if s is None:
        return "n/a"
    delta = change_pct(s.median, base.median) if base is not None else None
    return _fmt(s.median, unit) + _range(s, unit) + _pct(delta)


def tokenized(runs: Sequence[Mapping[str, Any]]) -> bool:
    """Ran on a fleet tokenizing with the shipped tokenizer (bench/harness/fleet.py `FleetNeeds`): its
    pods see other token ids (and ~5 % more prompt tokens) than the usual fleet's, so it compares
    only with such runs."""
    return any((r.get("run", {}).get("fleet_options") or {}).get("tokenizer") for r in runs)


def baseline_for(
    runs: Sequence[Mapping[str, Any]], policies: Mapping[str, Sequence[Mapping[str, Any]]], baseline: str
) -> str | None:
    """The row's reference: `baseline` run on the same fleet (`<baseline>+tok` on the tokenizing
    one); None when that run is absent."""
    for name in (baseline, f"{baseline}+tok"):
        base = policies.get(name)
        if base is not None and tokenized(base) == tokenized(runs):
            return name
    return None


SHIPPED_PREFIX = "epp-default"  # the shipped default profile and its variants (replicas, precise, +tok)


def ran_earlier_default(policy: str, runs: Sequence[Mapping[str, Any]]) -> bool:
    """An `epp-default*` row some of whose runs used another default profile than today's."""
    if not policy.startswith(SHIPPED_PREFIX):
        return False
    return any(not ran(policy, r).is_current() for r in runs)


def render_table(policies: Mapping[str, Sequence[Mapping[str, Any]]], baseline: str = BASELINE) -> str:
    head = " | ".join(c[0] for c in COLUMNS)
    lines = [
        f"| policy | seeds | requests (steady) | {head} | errors |",
        "|---|---|---|" + "---|" * len(COLUMNS) + "---|",
    ]
    for policy, runs in policies.items():
        cells = []
        ref_name = baseline_for(runs, policies, baseline)
        base = None if ref_name is None or ref_name == policy else policies[ref_name]
        for _, key, unit in COLUMNS:
            ref = spread(base, key) if base is not None and key in CHANGED else None
            cells.append(cell(spread(runs, key), unit, ref))
        requests = spread(runs, "steady.requests")
        errors: Counter[str] = Counter()
        for r in runs:
            errors.update(stat(r, "steady.error_kinds") or {})
        error_text = str(sum(errors.values()))
        if errors:
            error_text += " (" + ", ".join(f"{k}: {v}" for k, v in sorted(errors.items())) + ")"
        seeds = ", ".join(str(r["seed"]) for r in runs)
        name = f"{policy} (earlier default)" if ran_earlier_default(policy, runs) else policy
        lines.append(
            f"| {name} | {seeds} | {_fmt(requests.median, '') if requests else 'n/a'} | "
            + " | ".join(cells)
            + f" | {error_text} |"
        )
    return "\n".join(lines)


def _median_of(runs: Sequence[Mapping[str, Any]]):
    def med(key: str) -> float | None:
        s = spread(runs, key)
        return None if s is None else s.median

    return med


def render_phases(policies: Mapping[str, Sequence[Mapping[str, Any]]]) -> str:
    """Warm-up and drain, apart from the steady figures (medians over seeds)."""
    lines = [
        "| policy | pod share (steady) | warm-up requests | warm-up TTFT P95 | drain s | drain tokens "
        "| whole-run tok/s incl. drain | oracle probe P50 / P95 |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for policy, runs in policies.items():
        med = _median_of(runs)
        probe = (med("steady.probe_p50"), med("steady.probe_p95"))
        probe_text = "" if probe[0] is None else f"{_ms(probe[0])} / {_ms(probe[1])}"
        shares = [stat(r, "steady.pod_share") or {} for r in runs]
        pods = sorted({p for share in shares for p in share})
        share = ", ".join(
            f"{p} {(Spread.of(s.get(p, 0.0) for s in shares) or Spread(0, 0, 0, 0)).median * 100:.0f}"
            for p in pods
        )
        lines.append(
            f"| {policy} | {share + ' %' if share else ''} | {_fmt(med('warmup.requests') or 0, '')} "
            f"| {_ms(med('warmup.ttft_p95'))} "
            f"| {med('drain.duration_s') or 0:.1f} | {med('drain.output_tokens') or 0:,.0f} "
            f"| {med('whole_run.output_tok_s_incl_drain') or 0:,.0f} | {probe_text} |"
        )
    return "\n".join(lines)


def provenance(policies: Mapping[str, Sequence[Mapping[str, Any]]]) -> str:
    """Commits, package versions and machine load of the runs behind a table, in one line."""
    runs = [r for rs in policies.values() for r in rs]
    commits = sorted(
        {
            f"{(r['env']['git'].get('commit') or 'unknown')[:10]}{' (dirty)' if r['env']['git'].get('dirty') else ''}"
            for r in runs
        }
    )
    packages: dict[str, set[str]] = {}
    for r in runs:
        for name, version in r["env"].get("packages", {}).items():
            packages.setdefault(name, set()).add(version or "absent")
    loads = [
        r["run"][k]["loadavg"][0]
        for r in runs
        for k in ("machine_before", "machine_after")
        if r["run"].get(k, {}).get("loadavg")
    ]
    cpus = sorted({str(r["env"].get("cpu_count")) for r in runs})
    text = f"Runs: commit {', '.join(commits)}; " + ", ".join(
        f"{n} {'/'.join(sorted(v))}" for n, v in sorted(packages.items())
    )
    if loads:
        text += f"; 1-minute load average before/after runs {min(loads):.2f}-{max(loads):.2f}"
    text += f"; {'/'.join(cpus)} CPUs."
    return text


def render_section(
    scenario: str,
    policies: Mapping[str, Sequence[Mapping[str, Any]]],
    images: Sequence[str] = (),
    baseline: str = BASELINE,
) -> str:
    """Markdown for one scenario from its summaries: setup, the steady table, phases, provenance."""
    first = next(iter(policies.values()))[0]
    sc = first["scenario"]
    lines = [f"### {scenario}", ""]
    if sc.get("description"):
        lines += [str(sc["description"]), ""]
    pods = sc["fleet"].get("pods", [])
    a = sc["arrivals"]
    setup = [
        "fleet " + ", ".join(f"{p.get('replicas', 1)}x {p['profile']}" for p in pods),
        f"arrivals {a.get('pattern', 'poisson')} at {a.get('rate')} req/s",
        f"{sc['duration_s']:g} s ({sc['mode']} mode)",
    ]
    if sc.get("slo_ttft_s") is not None:
        setup.append(f"goodput = share of steady-window requests with TTFT <= {sc['slo_ttft_s']:g} s")
    window = first["stats"]["window"]
    setup.append(
        f"steady window = arrivals after the first {window['warmup_fraction'] * 100:.0f} % of the trace"
    )
    lines += ["Setup: " + "; ".join(setup) + ".", ""]
    cut = sorted({r["run"].get("max_requests") for rs in policies.values() for r in rs} - {None})
    if cut:
        lines += [f"**Smoke run: traces cut to {cut[0]} requests; not a result.**", ""]
    unsent = sorted(
        f"{p} seed {r['seed']} left {r['run']['not_sent']} requests unsent"
        for p, rs in policies.items()
        for r in rs
        if r["run"].get("not_sent")
    )
    if unsent:
        lines += ["**Incomplete (wall-time limit): " + "; ".join(unsent) + ".**", ""]
    lines.append(render_table(policies, baseline))
    note = "Median over the seeds listed, [min-max] over them, errors summed over them"
    if baseline in policies:
        note += f"; changes in parentheses compare medians with `{baseline}`"
    if any(tokenized(runs) for runs in policies.values()):
        note += (
            f"; rows on the tokenizing fleet (precise policies, `+tok`: the shipped tokenizer's ids,"
            f" ~1.0x the chars / 4 prompt tokens) compare with `{baseline}+tok` only"
        )
    lines += ["", note + ".", "", render_phases(policies)]
    lag = max((stat(r, "steady.lag_p99") or 0.0) for rs in policies.values() for r in rs)
    lines += ["", f"Load-generator send lag P99 (worst run): {lag * 1000:.1f} ms. " + provenance(policies)]
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
    summaries_dir: str | Path,
    doc_path: str | Path | Callable[[str], Path],
    img_dir: str | Path,
    baseline: str = BASELINE,
    mode: str = "quick",
    results_dir: str | Path | None = None,
) -> list[str]:
    """Render every scenario with reporting-seed summaries; returns their names.

    `doc_path` is the page, or a function giving the page for a section key (bench/reports/pages.py).
    Tables come from the committed summaries alone. Plots need the raw per-request results
    (git-ignored): with `results_dir`, a scenario's TTFT CDF is drawn from the first reporting
    seed present there; without, sections carry no plots.
    """
    place = doc_path if callable(doc_path) else (lambda _key, page=Path(doc_path): page)
    img_dir = Path(img_dir)
    all_runs = load_summaries(summaries_dir, mode, REPORTING_SEEDS)
    for scenario, policies in sorted(all_runs.items()):
        ordered = dict(sorted(policies.items(), key=lambda kv: (kv[0] != baseline, kv[0])))
        images = []
        if results_dir is not None:
            raw = _raw_runs(Path(results_dir), mode, scenario, ordered)
            if raw:
                first = next(iter(raw.values()))
                tag = f"{scenario} (seed {first.seed})"
                images.append(plot_ttft_cdf(raw, img_dir / f"{scenario}-ttft-cdf.png", f"{tag}: TTFT CDF"))
                arrivals = first.meta.get("arrivals", {})
                if arrivals.get("pattern") in ("bursty", "gamma"):
                    spikes = spike_windows(arrivals, float(first.meta.get("duration_s", 0)))
                    path = img_dir / f"{scenario}-ttft-time.png"
                    images.append(plot_ttft_timeseries(raw, path, f"{tag}: TTFT over time", spikes))
        key = f"scenario:{scenario}"
        page = place(key)
        rel = [Path(os.path.relpath(p, page.parent)).as_posix() for p in images]
        write_section(page, key, render_section(scenario, ordered, rel, baseline))
    return sorted(all_runs)


def _raw_runs(
    results_dir: Path, mode: str, scenario: str, policies: Mapping[str, Sequence[Mapping[str, Any]]]
) -> dict[str, PolicyRun]:
    for seed in REPORTING_SEEDS:
        found = {}
        for policy in policies:
            path = raw_path(results_dir, mode, scenario, policy, seed)
            if path.exists():
                found[policy] = load_run(path)
        if found:
            return found
    return {}
