"""Issue #40's tables: routing alone on identical pods in virtual time, and real time on shared
cores, from committed runs.

    python -m bench.reports.identical_pods [--write]

Reads the run summaries and the oracle-phase probe results (bench/probes/oracle_phase.py) in
`RESULTS` and the earlier default's rows (`EARLIER`, copied from bench/summaries-virtual as they
were before it is refreshed), and renders TTFT P50 / P95
(median [min-max] over the reporting seeds) with, per scenario, the share of the round-robin to
oracle distance at P95 the default closes, against the full oracle and against the oracle
without the engine's step phase (what a router can observe); and the real-time campaign in
`REAL_TIME` (and the earlier default's runs of the same campaign, `REAL_TIME_EARLIER`) with each
pod's share of the requests. `--write` puts them into docs/benchmarks/identical-fleets.md between
their markers.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from bench.harness.stats import Spread
from bench.harness.summary import REPORTING_SEEDS, load_summaries
from bench.reports.report import spread

RESULTS = Path("bench/results-committed/2026-12-06-identical-pods")
REAL_TIME = Path("bench/results-committed/2026-12-06-identical-pods-rt")
REAL_TIME_EARLIER = Path("bench/results-committed/2026-12-06-identical-pods-rt-earlier")
EARLIER = Path("bench/results-committed/2026-12-06-identical-pods-earlier-virtual")
PAGE = Path("docs/benchmarks/identical-fleets.md")
SCENARIOS = ("uniform", "docqa", "uniform@100pods")
BLOCKS = ("identical-pods", "identical-pods-rt")


def _cell(p50: Spread | None, p95: Spread | None) -> str:
    if p50 is None or p95 is None:
        return "not run"
    return f"{p50.median * 1000:.1f} / {p95.median * 1000:.1f} [{p95.lo * 1000:.1f}-{p95.hi * 1000:.1f}]"


def _ttfts(runs: list[dict[str, Any]]) -> tuple[Spread | None, Spread | None]:
    """TTFT P50 and P95 over the seeds' steady windows."""
    return spread(runs, "steady.ttft_p50"), spread(runs, "steady.ttft_p95")


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
        "| ours (`epp-default`), ms | P95 distance closed: to the oracle / to the phase-hidden oracle, % "
        "| largest pod share off equal, per seed, %: round-robin / oracle / ours |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name in SCENARIOS:
        runs = new.get(name, {})
        rr, oracle, ours = (_ttfts(runs.get(p, [])) for p in ("round-robin", "oracle", "epp-default"))
        earlier = _ttfts(old.get(name, {}).get("epp-default", []))
        blind = _phase_blind(name, root / RESULTS)
        closed = f"{_closed(rr[1], ours[1], oracle[1])} / {_closed(rr[1], ours[1], blind[1])}"
        skew = " / ".join(_share_skew(runs.get(p, [])) for p in ("round-robin", "oracle", "epp-default"))
        cells = [_cell(*rr), _cell(*oracle), _cell(*blind), _cell(*earlier), _cell(*ours), closed, skew]
        lines.append(f"| `{name}` | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _share_skew(runs: list[dict[str, object]]) -> str:
    """The largest pod's departure from an equal share, per seed, in % of the equal share."""
    out = []
    for run in runs:
        shares = run["stats"]["steady"].get("pod_share") or {}  # type: ignore[index]
        if shares:
            equal = 1.0 / len(shares)
            out.append(max(abs(v - equal) for v in shares.values()) / equal * 100)
    return ", ".join(f"{v:.0f}" for v in out) if out else "-"


def _change(mine: Spread | None, other: Spread | None) -> str:
    if mine is None or other is None or not other.median:
        return "-"
    return f"{100 * (mine.median / other.median - 1):+.0f} %"


def real_time_table(root: Path = Path(".")) -> str:
    """Real time on shared cores: the new default beside round-robin, vLLM's router and the
    earlier default, one campaign."""
    new = load_summaries(root / REAL_TIME, "quick", REPORTING_SEEDS)
    old = load_summaries(root / REAL_TIME_EARLIER, "quick", REPORTING_SEEDS)
    lines = [
        "| scenario | round-robin, ms | vllm-round_robin, ms | ours, earlier default, ms | ours (`epp-default`), ms "
        "| ours vs round-robin P50 / P95, % | ours vs vllm-round_robin P95, % | ours vs earlier default P95, % "
        "| largest pod share off equal, per seed, %: round-robin / ours |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    order = ["uniform", "docqa", *sorted(set(new) - {"uniform", "docqa"})]
    for name in order:
        runs = new.get(name, {})
        rr, vllm, ours = (_ttfts(runs.get(p, [])) for p in ("round-robin", "vllm-round_robin", "epp-default"))
        earlier = _ttfts(old.get(name, {}).get("epp-default", []))
        cells = [
            _cell(*rr),
            _cell(*vllm),
            _cell(*earlier),
            _cell(*ours),
            f"{_change(ours[0], rr[0])} / {_change(ours[1], rr[1])}",
            _change(ours[1], vllm[1]),
            _change(ours[1], earlier[1]),
            f"{_share_skew(runs.get('round-robin', []))} / {_share_skew(runs.get('epp-default', []))}",
        ]
        lines.append(f"| `{name}` | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def render_page(page: str, root: Path = Path(".")) -> str:
    """The page with its two tables regenerated between their markers."""
    texts = dict(zip(BLOCKS, (table(root), real_time_table(root)), strict=True))
    for key, text in texts.items():
        start, end = f"<!-- {key}:start -->", f"<!-- {key}:end -->"
        head, _, rest = page.partition(start)
        _, _, tail = rest.partition(end)
        page = f"{head}{start}\n{text}\n{end}{tail}"
    return page


def main() -> None:
    parser = argparse.ArgumentParser(prog="bench.reports.identical_pods", description=__doc__)
    parser.add_argument("--write", action="store_true", help=f"write the tables into {PAGE}")
    args = parser.parse_args()
    if not args.write:
        print(f"{table()}\n\n{real_time_table()}")
        return
    PAGE.write_text(render_page(PAGE.read_text()))


if __name__ == "__main__":
    main()
