"""`python -m bench slo-report`: docs/benchmarks/slo.md's tables from the latency-objective runs.

Per scenario with objectives (`workload.kind: slo_mix`, bench/scenarios/slo-*.yaml) and policy:
SLO attainment (share of requests whose TTFT met their own objective, failures as misses),
overall and per class (each tag the scenario's runs report attainment for: tight and loose,
interactive and batch), goodput (requests per second of the steady window that met
their objective), TTFT P50/P95 and errors; each the median over the reporting seeds [min-max].
Two generated sections: `slo-virtual` (bench/summaries-virtual/slo: these runs count the gateway's
measured latency, so they stay out of virtual-time.md's routing-alone tables) and `slo-real`
(bench/summaries).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from bench.harness.stats import Spread
from bench.harness.summary import REPORTING_SEEDS, SUMMARIES_DIR, load_summaries
from bench.reports.report import write_section
from bench.vtime.cli import VIRTUAL_SUMMARIES

DOC = Path("docs/benchmarks/slo.md")
SLO_VIRTUAL_SUMMARIES = VIRTUAL_SUMMARIES / "slo"
TITLE = "# Latency objectives"
# Table order: ours with and without objectives, the baseline, the peers, the reference.
FIRST = ("epp-slo", "epp-default", "round-robin")
LAST = ("oracle",)
# Class columns: the tighter class first; other tags after, alphabetically.
CLASS_ORDER = ("tight", "interactive", "loose", "batch")

Runs = Sequence[Mapping[str, Any]]


def _spread(runs: Runs, pick: Callable[[Mapping[str, Any]], float | None]) -> Spread | None:
    return Spread.of(pick(r["stats"]["steady"]) for r in runs)


def _fmt(spread: Spread | None, fmt: Callable[[float], str]) -> str:
    if spread is None:
        return "n/a"
    if spread.n == 1:
        return fmt(spread.median)
    return f"{fmt(spread.median)} [{fmt(spread.lo)}-{fmt(spread.hi)}]"


def _pct(value: float) -> str:
    return f"{value * 100:.1f}"


def _ms(value: float) -> str:
    return f"{value * 1000:,.0f}" if value >= 0.1 else f"{value * 1000:.1f}"


def _rps(value: float) -> str:
    return f"{value:.1f}"


def _tag(tag: str) -> Callable[[Mapping[str, Any]], float | None]:
    return lambda st: st.get("by_tag", {}).get(tag, {}).get("slo_attainment")


def _classes(policies: Mapping[str, Runs]) -> list[str]:
    """The tags the runs report an attainment for, in `CLASS_ORDER`."""
    tags = {
        tag
        for runs in policies.values()
        for r in runs
        for tag, st in r["stats"]["steady"].get("by_tag", {}).items()
        if "slo_attainment" in st
    }
    known = [t for t in CLASS_ORDER if t in tags]
    return [*known, *sorted(tags - set(known))]


def _order(policies: Sequence[str]) -> list[str]:
    head = [p for p in FIRST if p in policies]
    tail = [p for p in LAST if p in policies]
    return [*head, *sorted(p for p in policies if p not in head and p not in tail), *tail]


def slo_tables(root: str | Path, mode: str) -> str:
    """One table per scenario whose runs carry objectives; "" when there is none."""
    data = load_summaries(root, mode, REPORTING_SEEDS)
    out = []
    for scenario in sorted(data):
        policies = data[scenario]
        if not any("slo_attainment" in r["stats"]["steady"] for runs in policies.values() for r in runs):
            continue
        first = next(iter(policies.values()))[0]["scenario"]
        classes = _classes(policies)
        out += [
            f"**{scenario}**: {first['description']}",
            "",
            f"| policy | seeds | SLO attainment % | {''.join(f'{c} % | ' for c in classes)}goodput req/s "
            "| TTFT P50 ms | TTFT P95 ms | errors |",
            f"|---|---|---|{'---|' * len(classes)}---|---|---|---|",
        ]
        for policy in _order(list(policies)):
            runs = policies[policy]
            errors = _spread(runs, lambda st: st["errors"])
            out.append(
                f"| {policy} | {','.join(str(r['seed']) for r in runs)} "
                f"| {_fmt(_spread(runs, lambda st: st.get('slo_attainment')), _pct)} "
                f"| {''.join(f'{_fmt(_spread(runs, _tag(c)), _pct)} | ' for c in classes)}"
                f"{_fmt(_spread(runs, lambda st: st.get('slo_goodput_rps')), _rps)} "
                f"| {_fmt(_spread(runs, lambda st: st['ttft_p50']), _ms)} "
                f"| {_fmt(_spread(runs, lambda st: st['ttft_p95']), _ms)} "
                f"| {_fmt(errors, lambda v: f'{v:.0f}')} |"
            )
        out.append("")
    return "\n".join(out)


def render_doc(virtual: str | Path, real: str | Path, mode: str, doc: str | Path = DOC) -> None:
    """Write both generated sections into `doc` (its other text stays)."""
    none = "_No runs yet._"
    write_section(doc, "slo-virtual", slo_tables(virtual, mode) or none, TITLE)
    write_section(doc, "slo-real", slo_tables(real, mode) or none, TITLE)


def cmd_slo_report(args: argparse.Namespace) -> int:
    render_doc(args.virtual, args.real, args.mode, args.doc)
    print(f"rendered the latency-objective tables into {args.doc}")
    return 0


def add_parser(sub: Any) -> None:
    rep = sub.add_parser("slo-report", help="render the latency-objective runs into docs/benchmarks/slo.md")
    rep.add_argument("--virtual", default=str(SLO_VIRTUAL_SUMMARIES), help="the virtual-time summaries")
    rep.add_argument("--real", default=str(SUMMARIES_DIR), help="the real-time summaries")
    rep.add_argument("--mode", choices=("quick", "full"), default="quick")
    rep.add_argument("--doc", default=str(DOC))
