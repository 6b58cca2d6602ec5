"""Per-request decisions in virtual time, for checking that a refactor changes none of them.

    python -m bench.vtime.decisions dump BEFORE.json     # at the branch point
    python -m bench.vtime.decisions dump AFTER.json      # after the change
    python -m bench.vtime.decisions diff BEFORE.json AFTER.json   # exit 1 on any difference
    python -m bench.vtime.decisions dump OUT.json --scenarios uniform,shared-prefix --policies epp-chat,epp-batch

`dump` runs each scenario x policy of `SCENARIOS` x `POLICIES` at seed 1 (quick mode, the
scenario's full duration) and records, per request, the pod it went to, its status, its TTFT,
E2E and inter-token times (as `repr`, every bit), its output tokens and error, plus the run's
decision count, engine steps, simulated time and flow-control outcomes. The virtual clock makes
a run a function of the code and the seed, so two dumps of the same code are identical
(about a minute on one core for the 15 runs).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from typing import Any

from bench.harness.scenario import load_scenario
from bench.vtime.cli import run_one

SCENARIOS = ("uniform", "mixed-gpu", "shared-prefix", "lora", "bursty")
POLICIES = ("epp-default", "epp-predicted", "epp-best")


def dump(
    seed: int = 1, scenarios: Sequence[str] = SCENARIOS, policies: Sequence[str] = POLICIES
) -> dict[str, Any]:
    """`policies`: `epp-<name>` for any built-in profile (bench/vtime/cli.py `epp_extra`)."""
    out: dict[str, Any] = {}
    for scenario in scenarios:
        seeded = load_scenario(f"bench/scenarios/{scenario}.yaml", "quick").with_seed(seed)
        for policy in policies:
            started = time.monotonic()
            results, stats, router = run_one(seeded, policy)
            rows = [
                [
                    r.index,
                    r.pod,
                    r.status,
                    repr(r.ttft_s),
                    repr(r.e2e_s),
                    r.output_tokens,
                    r.error,
                    _bits(r.itl_s),
                ]
                for r in results
            ]
            flow = router.flow_outcomes() if hasattr(router, "flow_outcomes") else None
            out[f"{scenario}/{policy}"] = {
                "rows": rows,
                "decisions": stats.decisions,
                "steps": stats.steps,
                "simulated_s": repr(stats.simulated_s),
                "flow": flow,
            }
            print(
                f"{scenario}/{policy}: {len(rows)} requests, {time.monotonic() - started:.1f} s", flush=True
            )
    return out


def _bits(values: list[float]) -> list[str]:
    return [repr(x) for x in values]


def diff(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """One line per run: identical, or what differs."""
    lines = []
    for key in sorted(set(before) | set(after)):
        if key not in before or key not in after:
            lines.append(f"{key}: only in one dump")
            continue
        a, b = before[key], after[key]
        if a == b:
            lines.append(f"{key}: identical ({len(a['rows'])} requests, {a['decisions']} decisions)")
            continue
        for field in sorted(set(a) | set(b)):
            if a.get(field) == b.get(field):
                continue
            if field == "rows":
                n = sum(1 for x, y in zip(a["rows"], b["rows"], strict=False) if x != y)
                lines.append(f"{key}: {n} of {len(a['rows'])} requests differ")
            else:
                lines.append(f"{key}: {field} differs")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.vtime.decisions", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    dumper = sub.add_parser("dump")
    dumper.add_argument("out")
    dumper.add_argument("--scenarios", default=",".join(SCENARIOS), help="comma-separated scenario names")
    dumper.add_argument("--policies", default=",".join(POLICIES), help="comma-separated EPP policies")
    cmp = sub.add_parser("diff")
    cmp.add_argument("before")
    cmp.add_argument("after")
    args = ap.parse_args(argv)
    if args.cmd == "dump":
        with open(args.out, "w") as f:
            json.dump(dump(1, args.scenarios.split(","), args.policies.split(",")), f)
        return 0
    with open(args.before) as f:
        before = json.load(f)
    with open(args.after) as f:
        after = json.load(f)
    lines = diff(before, after)
    print("\n".join(lines))
    return 0 if all(": identical (" in line for line in lines) else 1


if __name__ == "__main__":
    sys.exit(main())
