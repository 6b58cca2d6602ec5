"""Routing quality per EPP replica count in virtual time: TTFT P50 and P95 per scenario.

    python -m bench.vtime.replicas_table [--summaries bench/summaries-virtual-replicas] [--mode quick] \\
        [--policy epp-default] [--replicas 1,2,4,8] [--limit-pct 3] [--markdown]

Reads `<summaries>/<mode>/<scenario>/<policy>[-<N>replicas]/seed-*.json` (`bench sim
--replicas N`) and prints, per scenario and replica count, the steady-state TTFT P50 and P95
over the seeds as median [min-max] and the change of each median vs one EPP; a change beyond
`--limit-pct` (worse) is flagged `!`. Only scenarios with a one-replica row and a replica run
are shown.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.vtime.cli import REPLICA_SUMMARIES, replica_label


@dataclass(frozen=True)
class Spread:
    median: float
    low: float
    high: float
    seeds: int

    def text(self) -> str:
        return f"{self.median * 1000:.1f} [{self.low * 1000:.1f}-{self.high * 1000:.1f}]"


def spread(values: Sequence[float]) -> Spread | None:
    if not values:
        return None
    return Spread(statistics.median(values), min(values), max(values), len(values))


def load_row(root: Path, mode: str, scenario: str, label: str) -> dict[str, Spread | None]:
    """TTFT P50 and P95 over the seeds of one scenario's `label` summaries."""
    p50: list[float] = []
    p95: list[float] = []
    for path in sorted((root / mode / scenario / label).glob("seed-*.json")):
        steady = json.loads(path.read_text())["stats"]["steady"]
        if steady.get("ttft_p50") is not None:
            p50.append(steady["ttft_p50"])
        if steady.get("ttft_p95") is not None:
            p95.append(steady["ttft_p95"])
    return {"p50": spread(p50), "p95": spread(p95)}


def change_pct(value: Spread | None, base: Spread | None) -> float | None:
    if value is None or base is None or base.median <= 0:
        return None
    return (value.median / base.median - 1.0) * 100.0


def table(
    root: Path, mode: str, policy: str, counts: Sequence[int], limit_pct: float
) -> list[tuple[str, int, dict[str, Spread | None], dict[str, float | None], bool]]:
    """(scenario, replicas, P50/P95 spreads, their changes vs one EPP in %, beyond the limit)."""
    rows = []
    for scenario_dir in sorted(p for p in (root / mode).iterdir() if p.is_dir()):
        scenario = scenario_dir.name
        if not (scenario_dir / policy).is_dir():
            continue
        if not any((scenario_dir / replica_label(policy, n)).is_dir() for n in counts if n > 1):
            continue  # no replica run of this scenario
        base = load_row(root, mode, scenario, policy)
        for n in counts:
            row = load_row(root, mode, scenario, replica_label(policy, n))
            if row["p50"] is None:
                continue
            changes = {k: change_pct(row[k], base[k]) for k in ("p50", "p95")}
            miss = any(c is not None and c > limit_pct for c in changes.values())
            rows.append((scenario, n, row, changes, miss))
    return rows


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value:+.1f} %"


def render(
    rows: Sequence[tuple[str, int, dict[str, Spread | None], dict[str, float | None], bool]], markdown: bool
) -> str:
    head = ["scenario", "replicas", "TTFT P50 ms", "P50 vs 1", "TTFT P95 ms", "P95 vs 1", ""]
    lines = []
    for scenario, n, row, changes, miss in rows:
        cells = [
            scenario,
            str(n),
            row["p50"].text() if row["p50"] else "n/a",
            _pct(changes["p50"]) if n > 1 else "",
            row["p95"].text() if row["p95"] else "n/a",
            _pct(changes["p95"]) if n > 1 else "",
            "!" if miss else "",
        ]
        lines.append(cells)
    if markdown:
        out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        out += ["| " + " | ".join(c) + " |" for c in lines]
        return "\n".join(out)
    widths = [max(len(r[i]) for r in [head, *lines]) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in [head, *lines])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--summaries", default=str(REPLICA_SUMMARIES))
    parser.add_argument("--mode", default="quick")
    parser.add_argument("--policy", default="epp-default")
    parser.add_argument("--replicas", default="1,2,4,8")
    parser.add_argument("--limit-pct", type=float, default=3.0)
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args(argv)
    counts = [int(n) for n in args.replicas.split(",")]
    rows = table(Path(args.summaries), args.mode, args.policy, counts, args.limit_pct)
    print(render(rows, args.markdown))
    misses = sorted({(s, n) for s, n, _, _, miss in rows if miss})
    print(f"\n{len(misses)} rows beyond +{args.limit_pct:g} % (P50 or P95 median vs one EPP)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
