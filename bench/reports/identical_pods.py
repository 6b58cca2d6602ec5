"""Issue #40's virtual-time table: routing alone on identical pods, from committed runs.

    python -m bench.reports.identical_pods [--write]

Reads the run summaries and the oracle-phase probe results (bench/probes/oracle_phase.py) in
`RESULTS` and the earlier default's rows in bench/summaries-virtual, and renders TTFT P50 / P95
(median [min-max] over the reporting seeds) with, per scenario, the share of the round-robin to
oracle distance at P95 the default closes, against the full oracle and against the oracle
without the engine's step phase (what a router can observe). `--write` puts it into
docs/benchmarks/identical-fleets.md between its `identical-pods` markers.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from bench.harness.stats import Spread
from bench.harness.summary import REPORTING_SEEDS, load_summaries
from bench.reports.report import spread

RESULTS = Path("bench/results-committed/2026-12-06-identical-pods")
EARLIER = Path("bench/summaries-virtual")
PAGE = Path("docs/benchmarks/identical-fleets.md")
SCENARIOS = ("uniform", "docqa", "uniform@100pods")
START, END = "<!-- identical-pods:start -->", "<!-- identical-pods:end -->"


def _cell(p50: Spread | None, p95: Spread | None) -> str:
    if p50 is None or p95 is None:
        return "not run"
    return f"{p50.median * 1000:.1f} / {p95.median * 1000:.1f} [{p95.lo * 1000:.1f}-{p95.hi * 1000:.1f}]"


def _phase_blind(scenario: str, root: Path) -> tuple[Spread | None, Spread | None]:
    path = root / f"oracle-phase-{scenario}.json"
    if not path.exists():
        return None, None
    seeds = json.loads(path.read_text())["seeds"].values()
    blind = [s["oracle-phase-blind"] for s in seeds]
    return (
        Spread.of(b["ttft_p50_ms"] / 1000 for b in blind),
        Spread.of(b["ttft_p95_ms"] / 1000 for b in blind),
    )


def _closed(rr: Spread | None, ours: Spread | None, target: Spread | None) -> str:
    if rr is None or ours is None or target is None or rr.median <= target.median:
        return "-"
    return f"{100 * (rr.median - ours.median) / (rr.median - target.median):.0f} %"


def table(root: Path = Path(".")) -> str:
    new = load_summaries(root / RESULTS, "quick", REPORTING_SEEDS)
    old = load_summaries(root / EARLIER, "quick", REPORTING_SEEDS)
    lines = [
        "| scenario | round-robin, ms | oracle, ms | oracle, phase hidden, ms | ours, earlier default, ms "
        "| ours (`epp-default`), ms | P95 distance closed: to the oracle / to the phase-hidden oracle, % |",
        "|---|---|---|---|---|---|---|",
    ]
    for name in SCENARIOS:
        runs = new.get(name, {})

        def both(
            policy: str, source: dict[str, list[dict[str, object]]]
        ) -> tuple[Spread | None, Spread | None]:
            return spread(source.get(policy, []), "steady.ttft_p50"), spread(
                source.get(policy, []), "steady.ttft_p95"
            )

        rr, oracle, ours = both("round-robin", runs), both("oracle", runs), both("epp-default", runs)
        earlier = both("epp-default", old.get(name, {}))
        blind = _phase_blind(name, root / RESULTS)
        closed = f"{_closed(rr[1], ours[1], oracle[1])} / {_closed(rr[1], ours[1], blind[1])}"
        cells = [_cell(*rr), _cell(*oracle), _cell(*blind), _cell(*earlier), _cell(*ours), closed]
        lines.append(f"| `{name}` | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(prog="bench.reports.identical_pods", description=__doc__)
    parser.add_argument("--write", action="store_true", help=f"write the table into {PAGE}")
    args = parser.parse_args()
    text = table()
    if not args.write:
        print(text)
        return
    page = PAGE.read_text()
    head, _, rest = page.partition(START)
    _, _, tail = rest.partition(END)
    PAGE.write_text(f"{head}{START}\n{text}\n{END}{tail}")


if __name__ == "__main__":
    main()
