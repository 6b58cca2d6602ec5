"""Instructions per scheduling decision, counted by valgrind: an A/B that a busy machine cannot blur.

Wall-clock figures on a shared 2-core machine move by +-30 % between runs; valgrind's
instruction count for the same code and inputs does not. This runs a fixed decision loop
(`Pool.snapshot()` + `WeightedScheduler.pick` at N pods, warm prefix index, as
bench/micro/scheduler_bench.py builds it) under `valgrind --tool=callgrind` twice, with 0 and with
`--decisions` picks, and prints the difference per decision (start-up and imports cancel out).

    python -m bench.micro.decision_instructions [--pods 100] [--decisions 300] [--profile default]
    python -m bench.micro.decision_instructions --loop N PODS PROFILE   # the loop itself (what valgrind runs)

Run it in two checkouts to compare commits (valgrind from Debian's package).
"""

from __future__ import annotations

import argparse
import random
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.micro.scheduler_bench import make_snapshot, request, warm_scheduler
from epp.datalayer.pool import Pool


def loop(decisions: int, pods: int, profile: str) -> None:
    rng = random.Random(1)
    system = "".join(rng.choice("abcdefghij ") for _ in range(3000))
    prompt = system + "".join(rng.choice("klmnop ") for _ in range(1096))
    base = make_snapshot(pods, rng)
    pool = Pool([s.endpoint for s in base.endpoints])
    for s in base.endpoints:
        assert s.metrics is not None
        pool.record_metrics(s.address, s.metrics)
        for _ in range(s.inflight_requests):
            pool.on_routed(s.address, 100)
    sched = warm_scheduler(base, profile, system)
    for i in range(decisions):
        sched.pick(request(prompt, profile, i), pool.snapshot())


def instructions(decisions: int, pods: int, profile: str) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "callgrind.out"
        cmd = [
            "valgrind",
            "--tool=callgrind",
            f"--callgrind-out-file={out}",
            sys.executable,
            "-m",
            __spec__.name,
        ]
        done = subprocess.run(
            [*cmd, "--loop", str(decisions), str(pods), profile], capture_output=True, text=True, check=True
        )
    found = re.search(r"Collected : (\d+)", done.stderr)
    if found is None:
        raise SystemExit(f"no instruction count in valgrind's output:\n{done.stderr[-2000:]}")
    return int(found.group(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--pods", type=int, default=100)
    parser.add_argument("--decisions", type=int, default=300)
    parser.add_argument("--profile", default="default")
    parser.add_argument("--loop", nargs=3, metavar=("N", "PODS", "PROFILE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.loop:
        loop(int(args.loop[0]), int(args.loop[1]), args.loop[2])
        return
    idle = instructions(0, args.pods, args.profile)
    busy = instructions(args.decisions, args.pods, args.profile)
    per = (busy - idle) / args.decisions
    print(f"{args.profile} at {args.pods} pods: {per / 1e6:.3f} M instructions per decision "
          f"({args.decisions} decisions; {idle:,} without, {busy:,} with)")  # fmt: skip


if __name__ == "__main__":
    main()
