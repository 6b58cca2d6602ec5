"""Replicas against one EPP seed by seed, beside one EPP against itself (the noise floor).

    python -m bench.vtime.replicas_paired --summaries <root> [--control <root>] \\
        [--scenario S ...] [--policy epp-default] [--variant P ...] [--replicas 2,4,8] [--markdown]

On small, chaotic traces (a few multi-turn sessions, ~100 requests a run) the median over seeds
of a TTFT percentile moves by tens of percent between two runs of the same router, so "within
3 % of one EPP" cannot be read off three seeds. This table reads the same seeds of one EPP and
of N replicas and gives, per replica count: the change of the medians over the seeds, the median
of the per-seed ratios (replicas / one EPP on the same trace) and on how many seeds the P95 is
more than 3 % worse or better. `--control` names a root holding one EPP's runs of the same
seeds with other scrape phases (`bench sim --router-seed <seed + 1000>`): its row is what one
EPP does against itself, the spread a replica row has to be read against. `--variant P` adds
the replica runs of policy P (e.g. `epp-noscrapeshare`, bench/vtime/replica_policies.py) against
the same one-EPP runs.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.vtime.cli import replica_label

MARGIN = 0.03  # a seed counts as worse / better beyond this ratio


@dataclass(frozen=True)
class Paired:
    """One row: `label`'s seeds against the one-EPP run of the same seeds."""

    label: str
    seeds: int
    p50_change_pct: float  # median over seeds vs one EPP's median over the same seeds
    p95_change_pct: float
    p50_ratio: float  # median of per-seed ratios
    p95_ratio: float
    p95_worse: int  # seeds whose P95 ratio is above 1 + MARGIN
    p95_better: int


def _ttfts(directory: Path) -> dict[str, tuple[float, float]]:
    """seed file name -> (TTFT P50, P95) of the steady window."""
    out = {}
    for path in sorted(directory.glob("seed-*.json")):
        steady = json.loads(path.read_text())["stats"]["steady"]
        if steady.get("ttft_p50") and steady.get("ttft_p95"):
            out[path.name] = (steady["ttft_p50"], steady["ttft_p95"])
    return out


def paired(
    label: str, runs: dict[str, tuple[float, float]], base: dict[str, tuple[float, float]]
) -> Paired | None:
    """`runs` against `base` on the seeds both have."""
    seeds = sorted(set(runs) & set(base))
    if not seeds:
        return None

    def change(i: int) -> float:
        return (
            statistics.median(runs[s][i] for s in seeds) / statistics.median(base[s][i] for s in seeds) - 1
        ) * 100

    r95 = [runs[s][1] / base[s][1] for s in seeds]
    return Paired(
        label=label,
        seeds=len(seeds),
        p50_change_pct=change(0),
        p95_change_pct=change(1),
        p50_ratio=statistics.median(runs[s][0] / base[s][0] for s in seeds),
        p95_ratio=statistics.median(r95),
        p95_worse=sum(r > 1 + MARGIN for r in r95),
        p95_better=sum(r < 1 - MARGIN for r in r95),
    )


def rows(
    root: Path,
    mode: str,
    scenario: str,
    policy: str,
    counts: Sequence[int],
    control: Path | None,
    variants: Sequence[str] = (),
) -> list[Paired]:
    """The control row (if any), then `policy`'s replica rows, then each variant policy's
    replica rows, all against one EPP running `policy`."""
    base = _ttfts(root / mode / scenario / policy)
    out: list[Paired] = []
    if control is not None:
        row = paired("one EPP, other scrape phases", _ttfts(control / mode / scenario / policy), base)
        if row:
            out.append(row)
    for variant in (policy, *variants):
        for n in counts:
            name = f"{n} replicas" if variant == policy else f"{variant}, {n} replicas"
            row = paired(name, _ttfts(root / mode / scenario / replica_label(variant, n)), base)
            if row:
                out.append(row)
    return out


def render(table: Sequence[tuple[str, Paired]], markdown: bool) -> str:
    head = [
        "scenario",
        "run",
        "seeds",
        "P50 / P95 medians vs one EPP",
        "per-seed ratio P50 / P95",
        "P95 worse / better",
    ]
    lines = [
        [
            scenario,
            r.label,
            str(r.seeds),
            f"{r.p50_change_pct:+.1f} / {r.p95_change_pct:+.1f} %",
            f"{r.p50_ratio:.3f} / {r.p95_ratio:.3f}",
            f"{r.p95_worse} / {r.p95_better}",
        ]
        for scenario, r in table
    ]
    if markdown:
        return "\n".join(
            ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
            + ["| " + " | ".join(c) + " |" for c in lines]
        )
    widths = [max(len(r[i]) for r in [head, *lines]) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in [head, *lines])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--summaries", required=True)
    parser.add_argument("--control", help="root of one EPP's runs at other scrape phases")
    parser.add_argument(
        "--scenario", action="append", help="repeatable (default: every scenario in the root)"
    )
    parser.add_argument("--mode", default="quick")
    parser.add_argument("--policy", default="epp-default")
    parser.add_argument(
        "--variant", action="append", default=[], help="repeatable: a policy whose replica runs to add"
    )
    parser.add_argument("--replicas", default="2,4,8")
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args(argv)
    root = Path(args.summaries)
    scenarios = args.scenario or sorted(p.name for p in (root / args.mode).iterdir() if p.is_dir())
    counts = [int(n) for n in args.replicas.split(",")]
    control = Path(args.control) if args.control else None
    table = [
        (s, r)
        for s in scenarios
        for r in rows(root, args.mode, s, args.policy, counts, control, args.variant)
    ]
    print(render(table, args.markdown))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
