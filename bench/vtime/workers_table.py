"""Do N ext_proc workers decide as one EPP process? Per scenario and seed, in virtual time.

    python -m bench.vtime.workers_table [--summaries bench/summaries-virtual] [--mode quick] \\
        [--policy epp-default] [--workers 2] [--markdown]

Reads `<summaries>/<mode>/<scenario>/<policy>[-<N>workers]/seed-*.json` (`bench sim
--workers N`: every request parsed by a worker and handed over as the IPC frame carries it)
and, for every seed both ran, says whether the runs are the same run: the same statistics
(every window's TTFT, throughput, errors), the same engine totals (steps, prefix hits, adapter
loads, preemptions) and the same number of decisions. Rows of two commits are not compared.
Exit status 1 when a compared pair differs.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.vtime.cli import VIRTUAL_SUMMARIES, replica_label


@dataclass(frozen=True)
class Pair:
    scenario: str
    seed: str
    commit: str
    same: bool | None  # None: not comparable (commits differ)
    ttft_p50: float | None
    ttft_p95: float | None


def _key(summary: dict[str, Any]) -> tuple[Any, ...]:
    run = summary["run"]
    return (summary["stats"], run["engines"], run["decisions"])


def pairs(root: Path, mode: str, policy: str, workers: int) -> list[Pair]:
    """Every (scenario, seed) with both a one-process and a `workers` summary."""
    out: list[Pair] = []
    label = replica_label(policy, 1, workers)
    for scenario_dir in sorted(p for p in (root / mode).iterdir() if p.is_dir()):
        for path in sorted((scenario_dir / label).glob("seed-*.json")):
            base_path = scenario_dir / policy / path.name
            if not base_path.exists():
                continue
            run, base = json.loads(path.read_text()), json.loads(base_path.read_text())
            commit = run["env"]["git"]["commit"][:7]
            comparable = commit == base["env"]["git"]["commit"][:7]
            steady = run["stats"]["steady"]
            out.append(
                Pair(
                    scenario_dir.name,
                    path.stem.removeprefix("seed-"),
                    commit,
                    _key(run) == _key(base) if comparable else None,
                    steady.get("ttft_p50"),
                    steady.get("ttft_p95"),
                )
            )
    return out


def _ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value * 1000:.1f}"


def render(rows: Sequence[Pair], workers: int, markdown: bool) -> str:
    head = ["scenario", "seed", "commit", "TTFT P50 ms", "TTFT P95 ms", f"{workers} workers = one process"]
    cells = [
        [
            r.scenario,
            r.seed,
            r.commit,
            _ms(r.ttft_p50),
            _ms(r.ttft_p95),
            "not comparable (commits differ)"
            if r.same is None
            else ("same run" if r.same else "**differs**"),
        ]
        for r in rows
    ]
    if markdown:
        out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        return "\n".join(out + ["| " + " | ".join(c) + " |" for c in cells])
    widths = [max(len(r[i]) for r in [head, *cells]) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in [head, *cells])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--summaries", default=str(VIRTUAL_SUMMARIES))
    parser.add_argument("--mode", default="quick")
    parser.add_argument("--policy", default="epp-default")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args(argv)
    rows = pairs(Path(args.summaries), args.mode, args.policy, args.workers)
    print(render(rows, args.workers, args.markdown))
    differ = [r for r in rows if r.same is False]
    same = sum(1 for r in rows if r.same)
    print(f"\n{same} of {len(rows)} pairs the same run, {len(differ)} differ")
    return 1 if differ else 0


if __name__ == "__main__":
    raise SystemExit(main())
