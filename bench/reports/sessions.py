"""Issue #51's tables in docs/benchmarks/agentic.md, generated from its committed campaigns.

- `sessions-51`: every policy on the five session scenarios, virtual time, reporting seeds, each
  long enough for >= 400 steady requests (bench/vtime/report.py `sessions_table`);
- `sessions-51-others`: the shipped default before (DEFAULT_REVISION 3) and after (5) on the
  other scenarios, virtual time: TTFT P50 / P95 per seed and the change;
- `sessions-51-meltdown`: the same table for agentic-coding on the tuning seeds 100-106,
  revision 4 against 5 (the saturation filter's meltdown); `sessions-51-kv-tuning`: kv-cache-wins
  on the tuning seeds 100-104, revision 3 against 5; `sessions-51-replicas`: the shipped
  default with one EPP against 2 and 4 replicas sharing state, agentic scenarios.

    python -m bench.reports.sessions --write

tests/bench/test_generated_pages.py fails when the page and the campaigns disagree.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from pathlib import Path
from statistics import median
from typing import Any

from bench.harness.summary import REPORTING_SEEDS, load_summaries
from bench.reports.report import write_section
from bench.vtime.report import sessions_table

PAGE = Path("docs/benchmarks/agentic.md")
TITLE = "# Benchmarks: agentic traffic"
CAMPAIGN = Path("bench/results-committed/2026-12-07-sessions-virtual")
OTHERS = Path("bench/results-committed/2026-12-07-sessions-others-virtual")
# agentic-coding on tuning seeds, revision 4 (before) and 5 (after): the meltdown revision 5 fixed.
MELTDOWN = Path("bench/results-committed/2026-12-07-sessions-meltdown-tuning-virtual")
MELTDOWN_SEEDS = tuple(range(100, 107))
# kv-cache-wins on tuning seeds, revision 3 (before) and 5 (after): its reporting seed 2's outlier.
KV_TUNING = Path("bench/results-committed/2026-12-07-kv-cache-wins-tuning-virtual")
KV_TUNING_SEEDS = tuple(range(100, 105))
REPLICAS = Path("bench/results-committed/2026-12-07-sessions-replicas-virtual")
REPLICA_COUNTS = (2, 4)
SCENARIOS = (
    "agentic-coding",
    "agentic-tool-bursts",
    "agentic-shared-system",
    "sessions-affinity",
    "llama-sessions-sim",
)


def _runs(root: Path, seeds: Sequence[int]) -> dict[str, dict[str, list[dict[str, Any]]]]:
    return {**load_summaries(root, "quick", seeds), **load_summaries(root, "full", seeds)}


def _ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value * 1000:,.1f}"


def others_table(root: Path, seeds: Sequence[int] = REPORTING_SEEDS) -> str:
    """`before/` and `after/` summary roots under `root`: one row per scenario and seed."""
    before, after = _runs(root / "before", seeds), _runs(root / "after", seeds)
    rows = [
        "| scenario | seed | before TTFT P50 / P95 ms | after TTFT P50 / P95 ms | P95 change |",
        "|---|---|---|---|---|",
    ]
    for scenario in sorted(set(before) & set(after)):
        pairs = (
            _by_seed(before[scenario].get("epp-default", [])),
            _by_seed(after[scenario].get("epp-default", [])),
        )
        for seed in sorted(set(pairs[0]) & set(pairs[1])):
            b, a = pairs[0][seed], pairs[1][seed]
            change = "n/a"
            if b.get("ttft_p95") and a.get("ttft_p95") is not None:
                change = f"{(a['ttft_p95'] / b['ttft_p95'] - 1) * 100:+.1f} %"
            rows.append(
                f"| {scenario} | {seed} | {_ms(b.get('ttft_p50'))} / {_ms(b.get('ttft_p95'))} | "
                f"{_ms(a.get('ttft_p50'))} / {_ms(a.get('ttft_p95'))} | {change} |"
            )
    return "\n".join(rows)


def replicas_table(single_root: Path, replicas_root: Path, seeds: Sequence[int] = REPORTING_SEEDS) -> str:
    """The shipped default's TTFT P95 with one EPP and with `REPLICA_COUNTS` replicas sharing
    state: the median over the seeds [min-max] and the change of the medians."""
    one, many = _runs(single_root, seeds), _runs(replicas_root, seeds)
    head = " | ".join(f"{n} replicas P95 ms | change" for n in REPLICA_COUNTS)
    rows = [
        f"| scenario | seeds | one EPP P95 ms | {head} |",
        "|---|---|---|" + "---|---|" * len(REPLICA_COUNTS),
    ]
    for scenario in sorted(set(one) & set(many)):
        base = _p95s(one[scenario].get("epp-default", []))
        if not base:
            continue
        cells = []
        for n in REPLICA_COUNTS:
            runs = _p95s(many[scenario].get(f"epp-default-{n}replicas", []))
            change = f"{(median(runs) / median(base) - 1) * 100:+.1f} %" if runs else "n/a"
            cells.append(f"{_spread_ms(runs)} | {change}")
        seeds_run = ",".join(str(int(r["seed"])) for r in one[scenario]["epp-default"])
        rows.append(f"| {scenario} | {seeds_run} | {_spread_ms(base)} | {' | '.join(cells)} |")
    return "\n".join(rows)


def _p95s(runs: Sequence[Mapping[str, Any]]) -> list[float]:
    return [float(r["stats"]["steady"]["ttft_p95"]) for r in runs if r["stats"]["steady"].get("ttft_p95")]


def _spread_ms(values: Sequence[float]) -> str:
    if not values:
        return "n/a"
    return f"{median(values) * 1000:,.0f} [{min(values) * 1000:,.0f}-{max(values) * 1000:,.0f}]"


def _by_seed(runs: Sequence[Mapping[str, Any]]) -> dict[int, Mapping[str, Any]]:
    return {int(r["seed"]): r["stats"]["steady"] for r in runs}


def render(repo: Path, page: Path) -> None:
    write_section(page, "sessions-51", sessions_table(repo / CAMPAIGN, SCENARIOS), TITLE)
    write_section(page, "sessions-51-others", others_table(repo / OTHERS), TITLE)
    write_section(page, "sessions-51-meltdown", others_table(repo / MELTDOWN, MELTDOWN_SEEDS), TITLE)
    write_section(page, "sessions-51-replicas", replicas_table(repo / CAMPAIGN, repo / REPLICAS), TITLE)
    write_section(page, "sessions-51-kv-tuning", others_table(repo / KV_TUNING, KV_TUNING_SEEDS), TITLE)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="rewrite the page's generated sections")
    args = parser.parse_args(argv)
    if args.write:
        render(Path("."), PAGE)
        print(f"wrote {PAGE}")
    else:
        print(sessions_table(CAMPAIGN, SCENARIOS))
        print(others_table(OTHERS))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
