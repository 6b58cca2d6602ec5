"""How often a policy moves a conversation off the pod that served its previous turn, and what
those turns cost (issue #51): per policy and seed, in virtual time (routing alone, no gateway
latency), the steady window's turns that landed on another pod than the turn before, and how
many of those and of all turns missed a TTFT threshold.

    python -m bench.probes.session_moves --scenario bench/scenarios/agentic-shared-system.yaml \\
        --policy epp-default --policy oracle [--seed 1 ...] [--mode quick] [--slow-ms 40] --out result.json
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

from bench.harness.scenario import load_scenario
from bench.vtime import cli


def moves(results: list[Any], slow_s: float, steady_after_s: float) -> dict[str, int]:
    """Turns of the steady window (sent after `steady_after_s`) on another pod than their
    session's previous turn, and those and all turns slower than `slow_s` to first token."""
    previous: dict[str, str | None] = {}
    out = {"turns": 0, "moved": 0, "slow": 0, "slow_moved": 0}
    for r in sorted(results, key=lambda r: r.sent_s):
        session = r.tag.split("/")[0]
        moved = session in previous and r.pod != previous[session]
        previous[session] = r.pod
        if r.sent_s < steady_after_s or r.ttft_s is None:
            continue
        slow = r.ttft_s > slow_s
        out["turns"] += 1
        out["moved"] += moved
        out["slow"] += slow
        out["slow_moved"] += moved and slow
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", required=True)
    parser.add_argument("--policy", action="append", required=True)
    parser.add_argument("--seed", type=int, action="append", help="repeatable (default 1 2 3)")
    parser.add_argument("--mode", default="quick", choices=("quick", "full"))
    parser.add_argument("--slow-ms", type=float, default=40.0)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    base = load_scenario(args.scenario, args.mode)
    seeds = args.seed or [1, 2, 3]
    table: dict[str, dict[str, Any]] = defaultdict(dict)
    for seed in seeds:
        scenario = base.with_seed(seed)
        for policy in args.policy:
            try:
                extra = cli.epp_extra(policy)
            except KeyError:  # a router of the harness (oracle, round-robin), not an EPP profile
                extra = None
            results, _, _ = cli.run_one(scenario, policy, gateway_ms=0.0, extra=extra)
            steady_after = 0.1 * scenario.duration_s
            table[str(seed)][policy] = moves(results, args.slow_ms / 1000.0, steady_after)
            print(args.scenario, seed, policy, table[str(seed)][policy], flush=True)
    command = ["python", "-m", "bench.probes.session_moves", "--scenario", args.scenario]
    for p in args.policy:
        command += ["--policy", p]
    out = {"command": command, "mode": args.mode, "slow_ms": args.slow_ms, "seeds": table}
    args.out.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
