"""How much of the exact-state oracle's lead is the engine's step phase (issue #40).

The virtual-time oracle (bench/vtime/routers.py `Oracle`) predicts each pod's TTFT from the
engine's exact state, including the time left of the engine step in progress
(`Engine.predict_ttft`'s `_busy_until`). No router that reads what an engine exports (its
/metrics page, its KV events) sees that phase: vLLM publishes no step clock. This probe runs the
oracle twice on the same traces, as is and with the phase hidden (the step in progress taken as
ending now), next to round-robin:

    python -m bench.probes.oracle_phase --scenario bench/scenarios/uniform.yaml \\
        [--seed 1 --seed 2 --seed 3] [--pods-scale 25 --duration-s 5] --out result.json

Where the phase-blind oracle lands on round-robin, the oracle's lead on that scenario is the
phase, and no observable state closes it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.harness.scenario import Scenario, load_scenario
from bench.harness.summary import build_summary
from bench.vtime import cli
from modelsim.engine import Engine


@contextlib.contextmanager
def phase_hidden() -> Iterator[None]:
    """`Engine.predict_ttft` as if every step in progress ended now."""
    original = Engine.predict_ttft

    def blind(
        self: Engine, prompt_ids: list[int], adapter: str | None, cached_tokens: int | None = None
    ) -> float:
        saved = self._busy_until
        self._busy_until = self.clock.now()
        try:
            return original(self, prompt_ids, adapter, cached_tokens)
        finally:
            self._busy_until = saved

    Engine.predict_ttft = blind  # type: ignore[method-assign]
    try:
        yield
    finally:
        Engine.predict_ttft = original  # type: ignore[method-assign]


def ttfts(scenario: Scenario, policy: str, *, ttft_only: bool) -> dict[str, float]:
    """TTFT P50 / P95 (ms) of one policy on one seeded scenario, routing alone, over the steady
    window the run summaries use (bench/harness/summary.py: the warm-up tenth left out)."""
    results, _, _ = cli.run_one(scenario, policy, gateway_ms=0.0, until_first_tokens=ttft_only)
    summary = build_summary(
        scenario=scenario, policy=policy, policy_config={}, results=results, run={}, env={}
    )
    steady = summary["stats"]["steady"]
    return {
        "ttft_p50_ms": round(steady["ttft_p50"] * 1000, 2),
        "ttft_p95_ms": round(steady["ttft_p95"] * 1000, 2),
        "requests": steady["requests"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(prog="bench.probes.oracle_phase", description=__doc__)
    parser.add_argument("--scenario", required=True)
    parser.add_argument("--seed", type=int, action="append", help="repeatable (default 1 2 3)")
    parser.add_argument("--pods-scale", type=int, default=1)
    parser.add_argument("--duration-s", type=float)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    base = load_scenario(args.scenario, "quick")
    scaled = args.pods_scale != 1
    if scaled:
        base = cli.scaled(base, args.pods_scale, args.duration_s)
    rows: dict[str, dict[str, Any]] = {}
    for seed in args.seed or [1, 2, 3]:
        scenario = base.with_seed(seed)
        runs = {
            "round-robin": ttfts(scenario, "round-robin", ttft_only=scaled),
            "oracle": ttfts(scenario, "oracle", ttft_only=scaled),
        }
        with phase_hidden():
            runs["oracle-phase-blind"] = ttfts(scenario, "oracle", ttft_only=scaled)
        rows[str(seed)] = runs
        print(args.scenario, seed, json.dumps(runs), flush=True)
    medians = {
        policy: {
            key: statistics.median(rows[s][policy][key] for s in rows)
            for key in ("ttft_p50_ms", "ttft_p95_ms")
        }
        for policy in ("round-robin", "oracle", "oracle-phase-blind")
    }
    command = ["python", "-m", "bench.probes.oracle_phase", "--scenario", args.scenario]
    if scaled:
        command += ["--pods-scale", str(args.pods_scale), "--duration-s", str(args.duration_s)]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps({"command": command, "scenario": base.name, "seeds": rows, "median": medians}, indent=2)
        + "\n"
    )


if __name__ == "__main__":
    main()
