"""Microbenchmark: the default profile's pick CPU with many live agent sessions (issue #51).

    python -m bench.micro.sessions_bench [--pods 4,100] [--sessions 1000] [--repeat 400]

`sessions` conversations with histories of 20-200 KB (5k-50k tokens) are routed over `pods`
pods (the prefix index and the KV-memory model learn them), then each timed decision is a
session's next turn (its history plus a 2 KB tool output). CPU time of this thread per
decision (time.thread_time_ns): p50 / p99 / mean. Runs against any checkout (it only uses
WeightedScheduler's pick / on_routed), so a before / after pair is two runs of this file.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from bench.micro.scheduler_bench import make_snapshot, request
from epp.scheduling.weighted import WeightedScheduler
from gateway.profiles import BUILTIN_PROFILES


def run(pods: int, sessions: int, repeat: int, seed: int = 1) -> tuple[float, float, float]:
    rng = random.Random(seed)
    body = "".join(rng.choice("abcdefghij ") for _ in range(200_000))
    snapshot = make_snapshot(pods, rng)
    sched = WeightedScheduler(BUILTIN_PROFILES, rng=random.Random(0))
    histories = []
    for i in range(sessions):
        history = f"session {i}: " + body[: rng.randrange(20_000, 190_000)]
        histories.append(history)
        state = snapshot.endpoints[rng.randrange(pods)]
        sched.on_routed(request(history, "default", -i - 1), state.address)
    cpu: list[float] = []
    tool = "".join(rng.choice("klmnop ") for _ in range(2_048))
    for n in range(repeat + repeat // 10):  # the first tenth is warm-up
        req = request(histories[rng.randrange(sessions)] + tool, "default", n)
        t0 = time.thread_time_ns()
        sched.pick(req, snapshot)
        cpu.append((time.thread_time_ns() - t0) / 1e3)
    cpu = cpu[-repeat:]
    ordered = sorted(cpu)
    return (
        ordered[len(ordered) // 2],
        ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))],
        statistics.fmean(cpu),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", default="4,100")
    parser.add_argument("--sessions", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=400)
    args = parser.parse_args()
    print(f"{'pods':>5} {'sessions':>8} {'p50 us':>8} {'p99 us':>8} {'mean us':>8}")
    for pods in (int(p) for p in args.pods.split(",")):
        p50, p99, mean = run(pods, args.sessions, args.repeat)
        print(f"{pods:>5} {args.sessions:>8} {p50:>8.1f} {p99:>8.1f} {mean:>8.1f}")


if __name__ == "__main__":
    main()
