"""`python -m bench sim-report`: docs/benchmarks/virtual-time.md from the virtual-time summaries.

Generated sections (marker comments, as bench/reports/report.py writes them; hand-written text
around them stays):

- `vtime-agreement`: per scenario, round-robin and epp-default in virtual time
  (bench/summaries-virtual/agreement: the real runs' recorded EPP config, measured gateway
  latency) vs the committed real-time summaries (bench/summaries), same seeds: TTFT P50/P95
  medians, the largest pod-share difference, the real runs' measurement terms (load-generator
  lag, simulated fleet's step lag), and the wall time of both.
- `vtime-oracle`: round-robin, epp-default and the oracle in virtual time (no gateway latency:
  routing alone), TTFT P95 and the default's distance to the oracle.
- `vtime-scale`: the scaled runs (`<scenario>@<N>pods`), with the CPU per decision.

Virtual summaries live apart from the real-time ones, so `bench report`'s tables never mix them.
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from bench.harness.summary import REPORTING_SEEDS, SUMMARIES_DIR, load_summaries
from bench.reports.report import write_section
from bench.vtime.cli import VIRTUAL_SUMMARIES

DOC = Path("docs/benchmarks/virtual-time.md")
TITLE = "# Routing quality in virtual time"
AGREE_POLICIES = ("round-robin", "epp-default")
ORACLE_POLICIES = ("round-robin", "epp-default", "oracle")
OFF_PCT = 15.0  # a difference worth explaining
TIE_MS = 1.0  # P95s closer than this are a tie (one engine step of the fastest profiles is ~10 ms)


def _median(values: Sequence[float | None]) -> float | None:
    data = [v for v in values if v is not None]
    return statistics.median(data) if data else None


def _steady(runs: Sequence[Mapping[str, Any]], key: str) -> float | None:
    return _median([r["stats"]["steady"].get(key) for r in runs])


def _ms(value: float | None) -> str:
    if value is None:
        return "n/a"
    return f"{value * 1000:,.0f}" if value >= 0.1 else f"{value * 1000:.1f}"


def _diff(virtual: float | None, real: float | None) -> str:
    if virtual is None or real is None or real <= 0:
        return "n/a"
    pct = (virtual - real) / real * 100
    mark = " **" if abs(pct) > OFF_PCT else ""
    return f"{pct:+.0f} %{mark}"


def _shares(runs: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """Median pod share over seeds."""
    pods = sorted({p for r in runs for p in r["stats"]["steady"].get("pod_share", {})})
    return {
        p: _median([r["stats"]["steady"].get("pod_share", {}).get(p, 0.0) for r in runs]) or 0.0 for p in pods
    }


def share_gap(a: Sequence[Mapping[str, Any]], b: Sequence[Mapping[str, Any]]) -> float:
    """The largest difference of one pod's median share between two sets of runs, points."""
    sa, sb = _shares(a), _shares(b)
    return max((abs(sa.get(p, 0.0) - sb.get(p, 0.0)) for p in {*sa, *sb}), default=0.0) * 100


def _fleet_lag(runs: Sequence[Mapping[str, Any]]) -> str:
    lags = [r["run"].get("fleet_lag") for r in runs]
    means = [g.get("mean_lag_ms") for g in lags if g]
    maxes = [g.get("max_lag_ms") for g in lags if g]
    if not means:
        return "n/a"
    return f"{_median(means):.1f} / {_median(maxes):.0f}"


def _wall(runs: Sequence[Mapping[str, Any]]) -> float | None:
    return _median([r["run"].get("wall_s") for r in runs])


def agreement_table(real_root: str | Path, virtual_root: str | Path, mode: str) -> str:
    real = load_summaries(real_root, mode, REPORTING_SEEDS)
    virtual = load_summaries(virtual_root, mode, REPORTING_SEEDS)
    rows = [
        "| scenario | policy | seeds | TTFT P50 ms real / virtual | diff | TTFT P95 ms real / virtual | diff "
        "| max pod-share gap, points | real: loadgen lag P99 ms | real: fleet step lag mean / max ms "
        "| wall s real / virtual | ratio |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    ratios: list[float] = []
    for scenario in sorted(virtual):
        for policy in AGREE_POLICIES:
            v_runs = virtual[scenario].get(policy, [])
            r_all = real.get(scenario, {}).get(policy, [])
            seeds = sorted({r["seed"] for r in v_runs} & {r["seed"] for r in r_all})
            if not seeds:
                continue
            v = [r for r in v_runs if r["seed"] in seeds]
            r = [x for x in r_all if x["seed"] in seeds]
            rp50, vp50 = _steady(r, "ttft_p50"), _steady(v, "ttft_p50")
            rp95, vp95 = _steady(r, "ttft_p95"), _steady(v, "ttft_p95")
            rw, vw = _wall(r), _wall(v)
            ratio = rw / vw if rw and vw else None
            if ratio:
                ratios.append(ratio)
            rows.append(
                f"| {scenario} | {policy} | {','.join(map(str, seeds))} | {_ms(rp50)} / {_ms(vp50)} | {_diff(vp50, rp50)} "
                f"| {_ms(rp95)} / {_ms(vp95)} | {_diff(vp95, rp95)} | {share_gap(r, v):.0f} "
                f"| {_ms(_steady(r, 'lag_p99'))} | {_fleet_lag(r)} | {rw or 0:.0f} / {vw or 0:.1f} "
                f"| {ratio or 0:.0f}x |"
            )
    lines = [
        "Medians over the seeds both modes ran; ** marks a difference over 15 %. Virtual runs: "
        "`epp-default` with the profile and scrape settings each real summary recorded (several "
        "ran the earlier GIE-weight default), gateway latency +1.9 ms (round-robin) / +7.1 ms "
        "(full gateway) per request, scrape pages 2 ms old when recorded.",
        "",
        *rows,
    ]
    if ratios:
        lines += ["", f"Wall time, real-time run / virtual-time run: median {statistics.median(ratios):.0f}x "
                  f"(range {min(ratios):.0f}-{max(ratios):.0f}x) over {len(ratios)} scenario-policy pairs."]  # fmt: skip
    return "\n".join(lines)


def oracle_table(virtual_root: str | Path, mode: str) -> str:
    data = load_summaries(virtual_root, mode, REPORTING_SEEDS)
    rows = [
        "| scenario | seeds | round-robin P50 / P95 ms | epp-default P50 / P95 ms | oracle P50 / P95 ms "
        "| oracle lowest P95 | epp-default P95 - oracle P95 | prefix-cache hit % (rr / epp / oracle) "
        "| adapter loads (rr / epp / oracle) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for scenario in sorted(s for s in data if "@" not in s):
        policies = data[scenario]
        if not all(p in policies for p in ORACLE_POLICIES):
            continue
        seeds = sorted(set.intersection(*({r["seed"] for r in policies[p]} for p in ORACLE_POLICIES)))
        runs = {p: [r for r in policies[p] if r["seed"] in seeds] for p in ORACLE_POLICIES}
        p50 = {p: _steady(runs[p], "ttft_p50") for p in ORACLE_POLICIES}
        p95 = {p: _steady(runs[p], "ttft_p95") for p in ORACLE_POLICIES}
        verdict = _bound_verdict(p95)
        gap = (
            None
            if p95["epp-default"] is None or p95["oracle"] is None
            else p95["epp-default"] - p95["oracle"]
        )
        gap_txt = (
            "n/a" if gap is None else f"{gap * 1000:+,.0f} ms ({_diff(p95['epp-default'], p95['oracle'])})"
        )
        rows.append(
            f"| {scenario} | {','.join(map(str, seeds))} | "
            + " | ".join(f"{_ms(p50[p])} / {_ms(p95[p])}" for p in ORACLE_POLICIES)
            + f" | {verdict} | {gap_txt.replace(' **', '')} | "
            + " / ".join(_engine_figure(runs[p], "prefix_hit_rate", 100) for p in ORACLE_POLICIES)
            + " | "
            + " / ".join(_engine_figure(runs[p], "adapter_loads", 1, total=True) for p in ORACLE_POLICIES)
            + " |"
        )
    return "\n".join(rows)


def _engine_figure(runs: Sequence[Mapping[str, Any]], key: str, scale: float, total: bool = False) -> str:
    """A per-pod engine total of the runs (`run.engines`): the pods' mean (or sum), median over seeds."""
    per_run = []
    for run in runs:
        values = [e[key] for e in run["run"].get("engines", []) if e.get(key) is not None]
        if values:
            per_run.append(sum(values) if total else statistics.fmean(values))
    value = _median(per_run)
    return "n/a" if value is None else f"{value * scale:.0f}"


def _bound_verdict(p95: Mapping[str, float | None]) -> str:
    """yes: the oracle's P95 is the lowest; tie: another is lower by under TIE_MS; else no, by how much."""
    oracle = p95["oracle"]
    if oracle is None:
        return "n/a"
    rivals = {p: v for p, v in p95.items() if p != "oracle" and v is not None}
    if not rivals or oracle <= min(rivals.values()):
        return "yes"
    best = min(rivals, key=lambda p: rivals[p])
    by = (oracle - rivals[best]) * 1000
    return f"tie ({best} {by:.1f} ms lower)" if by < TIE_MS else f"**no**: {best} {by:,.0f} ms lower"


def scale_table(virtual_root: str | Path, mode: str) -> str:
    data = load_summaries(virtual_root, mode, REPORTING_SEEDS)
    rows = [
        "| scenario | pods | offered req/s | policy | TTFT P50 / P95 ms | errors | decision CPU P50 / P99 us "
        "| of which pick, P50 us | wall s (simulated s) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for scenario in sorted((s for s in data if "@" in s), key=lambda s: (int(s.split("@")[1][:-4]), s)):
        for policy in ORACLE_POLICIES:
            for run in data[scenario].get(policy, []):
                st, info = run["stats"]["steady"], run["run"]
                cpu = info.get("decision_cpu", {})
                pick = info.get("pick_cpu", {}).get("p50_us")
                pods = sum(int(p.get("replicas", 1)) for p in run["scenario"]["fleet"]["pods"])
                rate = run["scenario"]["arrivals"]["rate"]
                rows.append(
                    f"| {scenario.split('@')[0]} | {pods:,} | {rate:,.0f} | {policy} | {_ms(st['ttft_p50'])} / "
                    f"{_ms(st['ttft_p95'])} | {st['errors']} | {cpu.get('p50_us') or 0:,.0f} / "
                    f"{cpu.get('p99_us') or 0:,.0f} | {'' if pick is None else f'{pick:,.0f}'} "
                    f"| {info['wall_s']:,.0f} ({info['simulated_s']:.1f}) |"
                )
    return "\n".join(rows)


def _spread(values: Sequence[float | None], scale: float, fmt: str = "{:,.0f}") -> str:
    """Median [min-max] over seeds."""
    data = sorted(v * scale for v in values if v is not None)
    if not data:
        return "n/a"
    mid = fmt.format(statistics.median(data))
    return mid if len(data) == 1 else f"{mid} [{fmt.format(data[0])}-{fmt.format(data[-1])}]"


def _per_pod(runs: Sequence[Mapping[str, Any]], key: str) -> list[float]:
    """A per-pod engine figure (`run.engines`), median over seeds, in pod order."""
    pods = sorted({e["pod"] for r in runs for e in r["run"].get("engines", []) if e.get(key) is not None})
    values = {
        p: _median([e.get(key) for r in runs for e in r["run"].get("engines", []) if e["pod"] == p])
        for p in pods
    }
    return [v for v in values.values() if v is not None]


def family_table(virtual_root: str | Path, mode: str, prefix: str) -> str:
    """Every policy on every scenario whose name starts with `prefix` (a family's page), reporting
    seeds: TTFT P50 / P95, the pods' prefix-cache hit rate, KV use per pod, pod shares."""
    data = load_summaries(virtual_root, mode, REPORTING_SEEDS)
    return policy_table({s: data[s] for s in sorted(data) if s.startswith(prefix) and "@" not in s})


def sessions_table(campaign: str | Path, scenarios: Sequence[str]) -> str:
    """Issue #51's table: `policy_table` over a campaign folder whose scenarios ran in either
    mode (each long enough for >= 400 steady requests), in `scenarios`' order, with the share of
    a session's turns sent where its previous turn went."""
    data = {**load_summaries(campaign, "quick"), **load_summaries(campaign, "full")}
    return policy_table({s: data[s] for s in scenarios if s in data}, stickiness=True)


def policy_table(
    data: Mapping[str, Mapping[str, Sequence[Mapping[str, Any]]]], stickiness: bool = False
) -> str:
    """One row per scenario and policy (round-robin, then the oracle, then the rest by name)."""
    extra = " session stickiness % |" if stickiness else ""
    rows = [
        "| scenario | policy | seeds | requests (steady) | TTFT P50 ms | TTFT P95 ms | prefix-cache hit % "
        f"| KV use per pod, mean over steps % | KV peak % (highest pod) | pod share % | preemptions | goodput % |{extra}",
        "|---|---|---|---|---|---|---|---|---|---|---|---|" + ("---|" if stickiness else ""),
    ]
    for scenario, policies in data.items():
        order = [p for p in ("round-robin", "oracle") if p in policies]
        for policy in order + sorted(p for p in policies if p not in order):
            runs = policies[policy]
            steady = [r["stats"]["steady"] for r in runs]
            kv_mean = " / ".join(f"{v * 100:.0f}" for v in _per_pod(runs, "kv_usage_mean")) or "n/a"
            kv_peak = _median(
                [
                    max((e.get("kv_usage_peak") or 0.0 for e in r["run"].get("engines", [])), default=None)
                    for r in runs
                ]
            )
            share = " / ".join(f"{v * 100:.0f}" for v in _shares(runs).values())
            sticky = f" {_spread([s.get('session_stickiness') for s in steady], 100)} |" if stickiness else ""
            rows.append(
                f"| {scenario} | {policy} | {','.join(str(r['seed']) for r in runs)} | "
                f"{_median([s.get('requests') for s in steady]) or 0:.0f} | "
                f"{_spread([s.get('ttft_p50') for s in steady], 1000)} | "
                f"{_spread([s.get('ttft_p95') for s in steady], 1000)} | "
                f"{_engine_figure(runs, 'prefix_hit_rate', 100)} | {kv_mean} | "
                f"{'n/a' if kv_peak is None else f'{kv_peak * 100:.0f}'} | {share} | "
                f"{_engine_figure(runs, 'preemptions', 1, total=True)} | "
                f"{_spread([s.get('goodput') for s in steady], 100)} |{sticky}"
            )
    return "\n".join(rows)


def render_doc(
    real: str | Path, virtual: str | Path, mode: str, doc: str | Path = DOC, family_docs: Sequence[str] = ()
) -> None:
    """Write the three generated sections into `doc` (its other text stays), and each family's
    table into its own page (FAMILY_DOCS: prefix -> page, section `vtime-<prefix>`)."""
    write_section(doc, "vtime-agreement", agreement_table(real, Path(virtual) / "agreement", mode), TITLE)
    write_section(doc, "vtime-oracle", oracle_table(virtual, mode), TITLE)
    write_section(doc, "vtime-scale", scale_table(virtual, mode), TITLE)
    for prefix in family_docs:
        page, title = FAMILY_DOCS[prefix]
        write_section(page, f"vtime-{prefix.rstrip('-')}", family_table(virtual, mode, prefix), title)


# Families with their own page: scenario-name prefix -> (page, its title line).
FAMILY_DOCS = {"agentic-": (Path("docs/benchmarks/agentic.md"), "# Benchmarks: agentic traffic")}


def cmd_sim_report(args: argparse.Namespace) -> int:
    render_doc(
        args.real, args.virtual, args.mode, args.doc, tuple(FAMILY_DOCS) if args.doc == str(DOC) else ()
    )
    print(f"rendered the virtual-time tables into {args.doc}")
    return 0


def add_parser(sub: Any) -> None:
    rep = sub.add_parser(
        "sim-report", help="render the virtual-time summaries into docs/benchmarks/virtual-time.md"
    )
    rep.add_argument("--real", default=str(SUMMARIES_DIR), help="the real-time summaries")
    rep.add_argument("--virtual", default=str(VIRTUAL_SUMMARIES))
    rep.add_argument("--mode", choices=("quick", "full"), default="quick")
    rep.add_argument("--doc", default=str(DOC))
