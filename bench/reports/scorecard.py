"""The targets of docs/benchmarks.md (the results page) checked against the run summaries: hit or missed, with figures.

Targets (TTFT, the shipped default `epp-default` vs `round-robin` on the same traces; issue
#11 asks the shipped default, not a tuned profile, to meet them): the AWS HyperPod Inference
Gateway's published cuts, tightened where we claim to beat them; plus better P95 than every
peer router, within 10 % of the oracle's P95 (1.5x on `lora`), N EPP replicas within 5 % of
one (`epp-default-Nreplicas`), and the precise prefix index beside the approximate one on the
same tokenizing fleet (`epp-default-precise` vs `epp-default+tok`).

Figures are over the reporting seeds: the median and the [min-max] range. A win counts only
outside the spread: a cut is hit when the medians' change meets the goal AND every seed of
ours is below every seed of the baseline; "below every peer" needs the same separation from
each peer. Parity (uniform) and closeness to the oracle compare medians.

Two of our rows (N replicas and one EPP, precise and approximate) are compared only when they
ran the same default (bench/reports/comparable.py); otherwise the row says why ("not
comparable: ..." or "stale: re-run ...") and gives no change and no verdict.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.harness.stats import Spread
from bench.harness.summary import REPORTING_SEEDS, load_summaries
from bench.reports.comparable import Runs, stale, why_not_comparable
from bench.reports.report import spread

OURS = "epp-default"
BASELINE = "round-robin"
ORACLE = "oracle"
PEER_PREFIXES = ("sglang-", "vllm-")
# Runs of a peer that are not comparable with the others of its scenario: `+tok` tokenizes on
# another fleet, `-pinned` ran with the router on its own core (the equal-CPU table's runs).
APART_SUFFIXES = ("+tok", "-pinned")
ORACLE_MARGIN = 0.10
# Scenarios where issue #11 allows more than ORACLE_MARGIN: the P95 may be this many times the oracle's.
ORACLE_FACTOR: Mapping[str, float] = {"lora": 1.5}
REPLICAS = (2, 4)
REPLICA_MARGIN = 0.05
PRECISE = "epp-default-precise"
APPROXIMATE_SAME_FLEET = "epp-default+tok"
# The held-out scenario families (issue #11): the shipped default profile, as a user gets it,
# must have the lowest TTFT P95 of every policy run but the oracle, at a TTFT P50 no more than
# 10 % above round-robin's.
FAMILY_PREFIX = "family-"
SHIPPED = "epp-default"
P50_MARGIN = 0.10


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


Figures = Mapping[str, Mapping[str, Spread | None]]  # policy -> metric -> spread over seeds
METRICS = ("ttft_p50", "ttft_p95", "ttft_p99")


def figures_of(policies: Mapping[str, Sequence[Mapping[str, Any]]]) -> dict[str, dict[str, Spread | None]]:
    """The steady-window TTFT percentiles of each policy's summaries, as spreads over seeds."""
    return {p: {m: spread(runs, f"steady.{m}") for m in METRICS} for p, runs in policies.items()}


def _change(ours: float | None, base: float | None) -> float | None:
    if ours is None or base is None or base <= 0:
        return None
    return ours / base - 1.0


def _fmt_s(value: Spread | None) -> str:
    if value is None:
        return "n/a"
    if value.n == 1:
        return f"{value.median:.3f} s"
    return f"{value.median:.3f} s [{value.lo:.3f}-{value.hi:.3f}]"


def _fmt_pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value * 100:+.1f} %"


def check_family(figures: Figures) -> list[tuple[str, str, bool | None]]:
    """The shipped default on a held-out family: lowest P95 median of all policies but the
    oracle (the runner-up and whether the ranges separate are shown), P50 vs round-robin's."""
    ours = figures.get(SHIPPED, {})
    o95, o50 = ours.get("ttft_p95"), ours.get("ttft_p50")
    if o95 is None:
        return [("TTFT P95 lowest of all policies but the oracle", "run missing", None)]
    others = {
        p: f["ttft_p95"]
        for p, f in figures.items()
        if p not in (SHIPPED, ORACLE) and not p.endswith("+tok") and f.get("ttft_p95") is not None
    }
    rows: list[tuple[str, str, bool | None]] = []
    if others:
        lower = sorted(p for p, v in others.items() if v is not None and v.median <= o95.median)
        runner = min(others.items(), key=lambda kv: kv[1].median if kv[1] else float("inf"))
        text = f"ours {_fmt_s(o95)}; next {runner[0]} {_fmt_s(runner[1])} ({len(others)} policies)"
        if lower:
            text += f"; as low or lower: {', '.join(lower)}"
        elif runner[1] is not None and not o95.below(runner[1]):
            text += "; ranges overlap"
        rows.append(("TTFT P95 lowest of all policies but the oracle", text, not lower))
    b50 = figures.get(BASELINE, {}).get("ttft_p50")
    if o50 is None or b50 is None:
        rows.append((f"TTFT P50 within +10 % of {BASELINE}", "run missing", None))
    else:
        change = _change(o50.median, b50.median)
        text = f"{_fmt_s(o50)} vs {_fmt_s(b50)}: {_fmt_pct(change)}"
        rows.append(
            (f"TTFT P50 within +10 % of {BASELINE}", text, change is not None and change <= P50_MARGIN)
        )
    return rows


def check_scenario(
    scenario: str, figures: Figures, runs: Mapping[str, Runs] | None = None
) -> list[tuple[str, str, bool | None]]:
    """(what, figures, hit) rows for one scenario; hit None when a policy's runs are missing or
    two rows compared ran different defaults. `runs`: each policy's summaries, which say what
    default they ran (bench/reports/comparable.py); without them rows are taken as comparable."""
    reason = None if runs is None else stale(OURS, runs.get(OURS, ()))
    if scenario.startswith(FAMILY_PREFIX):
        return _refused_if(reason, check_family(figures))
    return (
        _refused_if(reason, _against_others(scenario, figures))
        + check_replicas(figures, runs)
        + check_precise(figures, runs)
    )


def _refused_if(
    reason: str | None, rows: list[tuple[str, str, bool | None]]
) -> list[tuple[str, str, bool | None]]:
    """Rows of ours against other routers, each saying `reason` and no figures when ours is stale."""
    return rows if reason is None else [(what, reason, None) for what, _, _ in rows]


def _against_others(scenario: str, figures: Figures) -> list[tuple[str, str, bool | None]]:
    """Ours against round-robin (the scenario's cuts), the peers and the oracle."""
    rows: list[tuple[str, str, bool | None]] = []
    ours = figures.get(OURS)
    base = figures.get(BASELINE)
    for target in TARGETS.get(scenario, ()):
        label = f"TTFT {target.metric[-3:].upper()} vs {BASELINE}"
        o = ours.get(target.metric) if ours else None
        b = base.get(target.metric) if base else None
        if o is None or b is None:
            rows.append((label, "run missing", None))
            continue
        change = _change(o.median, b.median)
        if target.band is not None:
            goal = f"within +-{target.band * 100:.0f} %"
            hit = change is not None and abs(change) <= target.band
        else:
            goal = f"<= {target.max_change * 100:.0f} %" if target.max_change is not None else ""
            meets = change is not None and target.max_change is not None and change <= target.max_change
            hit = meets and o.below(b)
            if meets and not hit:
                goal += "; ranges overlap"
        figures_text = f"{_fmt_s(o)} vs {_fmt_s(b)}: {_fmt_pct(change)} (goal {goal})"
        rows.append((label, figures_text, hit))
    o95 = ours.get("ttft_p95") if ours else None
    if o95 is None:
        return rows
    peers = {
        p: f["ttft_p95"]
        for p, f in figures.items()
        if p.startswith(PEER_PREFIXES) and not p.endswith(APART_SUFFIXES) and f.get("ttft_p95")
    }
    if peers:
        not_beaten = sorted(p for p, s in peers.items() if s is not None and not o95.below(s))
        best = min(peers.items(), key=lambda kv: kv[1].median if kv[1] else float("inf"))
        text = f"ours {_fmt_s(o95)}; best peer {best[0]} {_fmt_s(best[1])}"
        if not_beaten:
            text += f"; not beaten outside the spread: {', '.join(not_beaten)}"
        rows.append(("TTFT P95 below every peer", text, not not_beaten))
    oracle = figures.get(ORACLE, {}).get("ttft_p95")
    if oracle is not None and oracle.median > 0:
        gap = _change(o95.median, oracle.median)
        text = f"ours {_fmt_s(o95)} vs oracle {_fmt_s(oracle)}: {_fmt_pct(gap)}"
        factor = ORACLE_FACTOR.get(scenario)
        if factor is None:
            rows.append(
                ("TTFT P95 within 10 % of the oracle", text, gap is not None and gap <= ORACLE_MARGIN)
            )
        else:
            within = gap is not None and gap <= factor - 1.0
            rows.append((f"TTFT P95 within {factor:g}x the oracle's", text, within))
    return rows


def refused(runs: Mapping[str, Runs] | None, a: str, b: str, *, replicas_differ: bool = False) -> str | None:
    """Why rows `a` and `b` may not be compared ("not comparable: ..." or "stale: re-run ..."),
    None when they may (or when the summaries are not at hand)."""
    if runs is None or a not in runs or b not in runs:
        return None
    return why_not_comparable(a, runs[a], b, runs[b], replicas_differ=replicas_differ)


def stale_of(runs: Mapping[str, Runs] | None, *names: str) -> str | None:
    """The first of `names` whose row ran an earlier default: its "stale: re-run ..." cell."""
    if runs is None:
        return None
    return next((r for r in (stale(n, runs.get(n, ())) for n in names) if r is not None), None)


def check_replicas(
    figures: Figures, runs: Mapping[str, Runs] | None = None
) -> list[tuple[str, str, bool | None]]:
    """N EPP replicas (`epp-default-Nreplicas`) vs one: TTFT P95 and P50 medians within +5 %.
    One is `epp-default-1replica` where the replicas campaign ran its own baseline (same commit
    and session: replicas are compared on one machine state), else `epp-default`."""
    one_name = f"{OURS}-1replica" if f"{OURS}-1replica" in figures else OURS
    one = figures.get(one_name, {})
    rows: list[tuple[str, str, bool | None]] = []
    for n in REPLICAS:
        many_name = f"{OURS}-{n}replicas"
        many = figures.get(many_name)
        if many is None:
            continue
        reason = refused(runs, many_name, one_name, replicas_differ=True) or stale_of(
            runs, many_name, one_name
        )
        for metric in ("ttft_p95", "ttft_p50"):
            o, m = one.get(metric), many.get(metric)
            label = f"{n} EPP replicas: TTFT {metric[-3:].upper()} within +5 % of one"
            if reason is not None:
                rows.append((label, reason, None))
                continue
            if o is None or m is None:
                rows.append((label, "run missing", None))
                continue
            change = _change(m.median, o.median)
            text = f"{_fmt_s(m)} vs {_fmt_s(o)}: {_fmt_pct(change)}"
            rows.append((label, text, change is not None and change <= REPLICA_MARGIN))
    return rows


def check_precise(
    figures: Figures, runs: Mapping[str, Runs] | None = None
) -> list[tuple[str, str, bool | None]]:
    """The precise index (KV events) vs the approximate one on the same tokenizing fleet: the
    P95 change, a finding rather than a goal (hit when precise is not worse)."""
    precise = figures.get(PRECISE, {}).get("ttft_p95")
    approx = figures.get(APPROXIMATE_SAME_FLEET, {}).get("ttft_p95")
    if precise is None or approx is None:
        return []
    label = "TTFT P95, precise vs approximate prefix (same fleet)"
    reason = refused(runs, PRECISE, APPROXIMATE_SAME_FLEET) or stale_of(runs, PRECISE, APPROXIMATE_SAME_FLEET)
    if reason is not None:
        return [(label, reason, None)]
    change = _change(precise.median, approx.median)
    text = f"precise {_fmt_s(precise)} vs approximate {_fmt_s(approx)}: {_fmt_pct(change)}"
    return [(label, text, change is not None and change <= 0)]


def render_scorecard(
    scenarios: Mapping[str, Figures], runs: Mapping[str, Mapping[str, Runs]] | None = None
) -> str:
    seeds = ", ".join(map(str, REPORTING_SEEDS))
    lines = [
        "## Targets: hit or missed",
        "",
        f"Generated from the committed summaries by `python -m bench report` (`{OURS}`, the",
        "shipped default profile, is ours: each run records the default it ran, and a target of",
        '"stale: re-run" gives no figures: ours ran an earlier default (`python -m bench refresh`);',
        f"steady-window TTFT, median [min-max] over the reporting seeds {seeds}; a win counts only",
        "outside the spread). Two of our rows are compared only when they ran the same default",
        "(profile, `default_revision`, single- or two-hop, options but the replica count):",
        'otherwise the row says "not comparable" or "stale: re-run" instead of a change.',
        "",
        "| scenario | target | figures | result |",
        "|---|---|---|---|",
    ]
    for scenario in sorted(scenarios):
        own = None if runs is None else runs.get(scenario)
        for what, text, hit in check_scenario(scenario, scenarios[scenario], own):
            result = "n/a" if hit is None else ("hit" if hit else "**missed**")
            lines.append(f"| {scenario} | {what} | {text} | {result} |")
    return "\n".join(lines) + "\n"


def scorecard_for(summaries_dir: str | Path, mode: str = "quick") -> str | None:
    """The scorecard section, or None when no summaries exist (the page keeps its old one)."""
    runs = load_summaries(summaries_dir, mode, REPORTING_SEEDS)
    if not runs:
        return None
    return render_scorecard({name: figures_of(policies) for name, policies in runs.items()}, runs)
