"""Performance regression guard (`make bench-smoke`, seconds, not part of `make test`).

    python -m bench.micro.smoke [--baseline bench/baseline-smoke.json] [--update]

Measures two figures and fails (exit 1, one line per regression) when either is more than
`FACTOR` times its committed baseline:
- scrape_us: CPU per `scrape_once` (GET + parse + record) of a 38 KB vLLM page from a stub
  pod in a child process (bench/micro/scrape_bench.py), on the EPP's uvloop loop, median of 3 rounds;
- pick_p99_us_100: decision p99 (thread CPU time) at 100 pods, default profile, warm prefix
  index (bench/micro/scheduler_bench.py), best of 3 rounds.
Both are CPU time, which survives a loaded machine better than wall time; the factor of 2
absorbs the rest. `--update` rewrites the baseline from this machine's run (commit it).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Mapping
from pathlib import Path

FACTOR = 2.0
DEFAULT_BASELINE = Path(__file__).resolve().parents[1] / "baseline-smoke.json"


def regressions(
    baseline: Mapping[str, float], measured: Mapping[str, float], factor: float = FACTOR
) -> list[str]:
    """One message per figure more than `factor` x its baseline (or missing from either side)."""
    problems = []
    for name, base in sorted(baseline.items()):
        if name not in measured:
            problems.append(f"{name}: not measured (baseline {base:.1f})")
        elif not base > 0:
            problems.append(f"{name}: baseline {base!r} is not a positive number; refresh it with --update")
        elif measured[name] > factor * base:
            problems.append(
                f"{name}: {measured[name]:.1f} is {measured[name] / base:.1f}x the baseline {base:.1f} "
                f"(limit {factor:g}x)"
            )
    problems += [
        f"{name}: measured but has no baseline; refresh it with --update"
        for name in measured
        if name not in baseline
    ]
    return problems


def measure() -> dict[str, float]:
    from bench.micro.metrics_stub import stub_fleet
    from bench.micro.scheduler_bench import pick_latency
    from bench.micro.scrape_bench import _clients_round, run_on

    async def scrape_only(port: int) -> float:
        return (await _clients_round(port, 300, only=("scrape_once",)))["scrape_once"]

    with stub_fleet(1) as (ports, _):
        scrape = statistics.median(run_on("uvloop", scrape_only(ports[0])) for _ in range(3))
    pick = min(pick_latency(100, "default", 300).p99_us for _ in range(3))
    return {"scrape_us": round(scrape, 1), "pick_p99_us_100": round(pick, 1)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", type=Path, default=DEFAULT_BASELINE)
    parser.add_argument("--update", action="store_true", help="rewrite the baseline from this run")
    args = parser.parse_args(argv)
    measured = measure()
    print("measured:", json.dumps(measured))
    if args.update:
        args.baseline.write_text(json.dumps(measured, indent=2) + "\n")
        print(f"baseline written to {args.baseline}")
        return 0
    try:
        baseline = json.loads(args.baseline.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        print(f"bench-smoke: cannot read baseline {args.baseline}: {exc}", file=sys.stderr)
        return 2
    problems = regressions(baseline, measured)
    if problems:
        print("bench-smoke: PERFORMANCE REGRESSION (over 2x the committed baseline):", file=sys.stderr)
        for p in problems:
            print(f"  {p}", file=sys.stderr)
        print(
            "If the slowdown is intended, refresh with `python -m bench.micro.smoke --update`.",
            file=sys.stderr,
        )
        return 1
    print(f"bench-smoke: OK (baseline {json.dumps(baseline)}, limit {FACTOR:g}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
