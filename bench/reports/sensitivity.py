"""The A10G sensitivity table of docs/benchmarks/scenarios.md, from the committed summaries alone.

The mixed-GPU result rests on an estimated A10G profile; `bench/scenarios/mixed-gpu-a10g-*.yaml`
run the same trace with the A10G's step time scaled to -30 % / as estimated / +30 % speed. This
renders, per variant and policy, TTFT P95 and E2E P95 (median over the seeds present, min-max)
with the change of the median vs round-robin, the share of requests that completed, and the
share routed to the A10G pods.

    python -m bench.reports.sensitivity [--summaries bench/summaries] [--doc docs/benchmarks/scenarios.md]
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from bench.harness.stats import Spread
from bench.harness.summary import REPORTING_SEEDS, SUMMARIES_DIR, load_summaries
from bench.reports.report import BASELINE, cell, spread, write_section

VARIANTS: tuple[tuple[str, str], ...] = (
    ("mixed-gpu-a10g-slow", "-30 %"),
    ("mixed-gpu-a10g-est", "as estimated"),
    ("mixed-gpu-a10g-fast", "+30 %"),
)
SECTION = "a10g-sensitivity"


def _share(runs: Sequence[Mapping[str, Any]], key: str) -> Spread | None:
    values = []
    for r in runs:
        steady = r["stats"]["steady"]
        if key == "ok":
            values.append(steady["ok"] / steady["requests"] if steady["requests"] else None)
        else:
            pods = steady.get("pod_share") or {}
            values.append(sum(v for k, v in pods.items() if k.startswith(key)))
    return Spread.of(values)


def render(all_runs: Mapping[str, Mapping[str, Sequence[Mapping[str, Any]]]]) -> str:
    lines = [
        "| A10G speed | policy | seeds | completed (steady window) | TTFT P95 | E2E P95 | A10G share of completed |",
        "|---|---|---|---|---|---|---|",
    ]
    for scenario, label in VARIANTS:
        policies = all_runs.get(scenario, {})
        base = policies.get(BASELINE)
        for policy in sorted(policies, key=lambda p: (p != BASELINE, p)):
            runs = policies[policy]
            ref = base if base is not None and policy != BASELINE else None
            ttft = cell(spread(runs, "steady.ttft_p95"), "s", spread(ref, "steady.ttft_p95") if ref else None)
            e2e = cell(spread(runs, "steady.e2e_p95"), "s", spread(ref, "steady.e2e_p95") if ref else None)
            seeds = ",".join(str(r["seed"]) for r in runs)
            lines.append(
                f"| {label} | {policy} | {seeds} | {cell(_share(runs, 'ok'), 'share')} | {ttft} | {e2e} "
                f"| {cell(_share(runs, 'a10g'), 'share')} |"
            )
    return "\n".join(lines) + "\n"


def section_for(summaries_dir: str, mode: str = "quick") -> str | None:
    """The table, or None when no variant has a reporting-seed summary (`bench report` skips it)."""
    all_runs = load_summaries(summaries_dir, mode, REPORTING_SEEDS)
    if not any(all_runs.get(name) for name, _ in VARIANTS):
        return None
    return render(all_runs)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.reports.sensitivity", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--summaries", default=str(SUMMARIES_DIR))
    parser.add_argument("--doc", help="also write the table into this markdown file (its own markers)")
    args = parser.parse_args(argv)
    table = section_for(args.summaries)
    if table is None:
        print(f"no A10G sensitivity summaries under {args.summaries}", file=sys.stderr)
        return 1
    print(table)
    if args.doc:
        write_section(args.doc, SECTION, table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
