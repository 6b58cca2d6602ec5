"""The targets of docs/benchmarks.md checked against saved results: hit or missed, with figures.

Targets (TTFT, `epp-best` vs `round-robin` on the same trace): the AWS HyperPod Inference
Gateway's published cuts, tightened where we claim to beat them; plus better P95 than every
peer router and within 10 % of the oracle's P95.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from bench.report import PolicyRun, load_results
from bench.stats import Summary, summarize

OURS = "epp-best"
BASELINE = "round-robin"
ORACLE = "oracle"
PEER_PREFIXES = ("sglang-", "vllm-")
ORACLE_MARGIN = 0.10


@dataclass(frozen=True)
class Target:
    metric: str  # ttft_p95 | ttft_p99
    max_change: float | None  # e.g. -0.97: at least a 97 % cut
    band: float | None = None  # uniform: |change| <= band


TARGETS: Mapping[str, tuple[Target, ...]] = {
    "mixed-gpu": (Target("ttft_p95", -0.97),),
    "bursty": (Target("ttft_p95", -0.94), Target("ttft_p99", -0.98)),
    "bursty-headroom": (Target("ttft_p95", -0.94), Target("ttft_p99", -0.98)),
    "shared-prefix": (Target("ttft_p95", -0.50), Target("ttft_p99", -0.60)),
    "shared-prefix-long": (Target("ttft_p95", -0.50), Target("ttft_p99", -0.60)),
    "uniform": (Target("ttft_p95", None, band=0.05),),
}


def _change(ours: float | None, base: float | None) -> float | None:
    if ours is None or base is None or base <= 0:
        return None
    return ours / base - 1.0


def _fmt_s(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f} s"


def _fmt_pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value * 100:+.1f} %"


def check_scenario(scenario: str, summaries: Mapping[str, Summary]) -> list[tuple[str, str, bool | None]]:
    """(what, figures, hit) rows for one scenario; hit None when a policy's run is missing."""
    rows: list[tuple[str, str, bool | None]] = []
    ours = summaries.get(OURS)
    base = summaries.get(BASELINE)
    for target in TARGETS.get(scenario, ()):
        label = f"TTFT {target.metric[-3:].upper()} vs {BASELINE}"
        if ours is None or base is None:
            rows.append((label, "run missing", None))
            continue
        change = _change(getattr(ours, target.metric), getattr(base, target.metric))
        if target.band is not None:
            goal = f"within +-{target.band * 100:.0f} %"
            hit = change is not None and abs(change) <= target.band
        else:
            goal = f"<= {target.max_change * 100:.0f} %" if target.max_change is not None else ""
            hit = change is not None and target.max_change is not None and change <= target.max_change
        figures = (
            f"{_fmt_s(getattr(ours, target.metric))} vs {_fmt_s(getattr(base, target.metric))}: "
            f"{_fmt_pct(change)} (goal {goal})"
        )
        rows.append((label, figures, hit))
    if ours is None:
        return rows
    peers = {p: s for p, s in summaries.items() if p.startswith(PEER_PREFIXES)}
    if peers:
        worse = [p for p, s in peers.items() if s.ttft_p95 is not None and (ours.ttft_p95 or 0) >= s.ttft_p95]
        best_peer = min(peers.items(), key=lambda kv: kv[1].ttft_p95 or float("inf"))
        figures = f"ours {_fmt_s(ours.ttft_p95)}; best peer {best_peer[0]} {_fmt_s(best_peer[1].ttft_p95)}"
        if worse:
            figures += f"; not beaten: {', '.join(sorted(worse))}"
        rows.append(("TTFT P95 below every peer", figures, not worse))
    oracle = summaries.get(ORACLE)
    if oracle is not None and oracle.ttft_p95:
        gap = _change(ours.ttft_p95, oracle.ttft_p95)
        figures = f"ours {_fmt_s(ours.ttft_p95)} vs oracle {_fmt_s(oracle.ttft_p95)}: {_fmt_pct(gap)}"
        rows.append(("TTFT P95 within 10 % of the oracle", figures, gap is not None and gap <= ORACLE_MARGIN))
    return rows


def render_scorecard(runs: Mapping[str, Mapping[str, PolicyRun]]) -> str:
    lines = [
        "## Targets: hit or missed",
        "",
        f"Generated from the saved runs by `python -m bench report` (`{OURS}` is ours).",
        "",
        "| scenario | target | figures | result |",
        "|---|---|---|---|",
    ]
    for scenario in sorted(runs):
        summaries = {policy: summarize(run.results) for policy, run in runs[scenario].items()}
        for what, figures, hit in check_scenario(scenario, summaries):
            result = "n/a" if hit is None else ("hit" if hit else "**missed**")
            lines.append(f"| {scenario} | {what} | {figures} | {result} |")
    return "\n".join(lines) + "\n"


def scorecard_for(results_dir: str | Path) -> str:
    return render_scorecard(load_results(results_dir))
