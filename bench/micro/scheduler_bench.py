"""Microbenchmark: WeightedScheduler.pick latency per profile and pool size.

    python -m bench.micro.scheduler_bench [--repeat N] [--pods 16,100,1000]
        [--profiles default,chat,batch,predicted]

A 4 KB prompt (64 prefix blocks), pods with varied load and a warm prefix index (every pod
has seen some prompts sharing the request's prefix). "pick" includes hashing the prompt
once; "hash" is that hashing alone, so pick - hash is the scheduling cost proper. p50 and
p99 are per-decision CPU time of this thread (time.thread_time_ns), which a shared,
overloaded machine disturbs far less than wall time; "wall p50" is there for comparison.
"""

from __future__ import annotations

import argparse
import random
import time
from dataclasses import dataclass

from bench.micro.parse_metrics_bench import per_call_us
from epp.datalayer.endpoint_records import Endpoint, EndpointState, Metrics, PoolSnapshot
from epp.datalayer.prefix_index import prompt_hashes
from epp.scheduling.request import InferenceRequest
from epp.scheduling.weighted import WeightedScheduler
from gateway.profiles import BUILTIN_PROFILES


def make_snapshot(pods: int, rng: random.Random) -> PoolSnapshot:
    # Learned prefill figures (predicted-ttft) from their own generator, so the other fields,
    # hence the other profiles' figures, are the same as before they were added.
    pace = random.Random(pods)
    states = tuple(
        EndpointState(
            endpoint=Endpoint(f"10.0.0.{i}:8000", frozenset({"llama"})),
            metrics=Metrics(
                waiting=rng.randrange(0, 4),
                running=rng.randrange(0, 30),
                kv_usage=rng.uniform(0.0, 0.75),
                max_lora=4,
                block_size=16,
            ),
            metrics_age=0.02,
            inflight_requests=rng.randrange(0, 20),
            inflight_tokens=rng.randrange(0, 20_000),
            ttft_ewma=rng.uniform(0.05, 0.5),
            tpot_ewma=rng.uniform(0.005, 0.03),
            prefill_tps=pace.uniform(2_000.0, 30_000.0),
            uncached_fraction=pace.uniform(0.2, 1.0),
            mean_prompt_tokens=pace.uniform(200.0, 2_000.0),
        )
        for i in range(pods)
    )
    return PoolSnapshot(states, taken_at=0.0)


def request(prompt: str, profile: str, n: int) -> InferenceRequest:
    return InferenceRequest(
        request_id=f"r{n}",
        model="llama",
        target_model="llama",
        adapter=None,
        prompt=prompt,
        prompt_tokens=len(prompt) // 4,
        max_tokens=200,
        objective=profile,
    )


@dataclass(frozen=True)
class Latency:
    p50_us: float
    p99_us: float
    wall_p50_us: float


def _percentile(sorted_values: list[float], q: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


def warm_scheduler(snapshot: PoolSnapshot, profile: str, system: str) -> WeightedScheduler:
    """A scheduler whose prefix index has seen, on every pod, a prefix of the shared system prompt."""
    sched = WeightedScheduler(rng=random.Random(0))
    for i, state in enumerate(snapshot.endpoints):
        sched.on_routed(request(system[: 64 * (10 + i % 30)], profile, -i - 1), state.address)
    return sched


def pick_latency(pods: int, profile: str, repeat: int, seed: int = 1) -> Latency:
    """Per-decision latency at `pods` pods with a warm prefix index."""
    rng = random.Random(seed)
    system = "".join(rng.choice("abcdefghij ") for _ in range(3000))
    prompt = system + "".join(rng.choice("klmnop ") for _ in range(1096))  # 4 KB
    snapshot = make_snapshot(pods, rng)
    sched = warm_scheduler(snapshot, profile, system)
    cpu: list[float] = []
    wall: list[float] = []
    for n in range(repeat + max(5, repeat // 10)):  # the first tenth is warm-up
        req = request(prompt, profile, n)
        t0, w0 = time.thread_time_ns(), time.perf_counter_ns()
        sched.pick(req, snapshot)
        t1, w1 = time.thread_time_ns(), time.perf_counter_ns()
        cpu.append((t1 - t0) / 1e3)
        wall.append((w1 - w0) / 1e3)
    cpu, wall = sorted(cpu[-repeat:]), sorted(wall[-repeat:])
    return Latency(_percentile(cpu, 0.5), _percentile(cpu, 0.99), _percentile(wall, 0.5))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=2000)
    parser.add_argument("--pods", default="16,100,1000")
    parser.add_argument("--profiles", default=",".join(BUILTIN_PROFILES))
    args = parser.parse_args()
    rng = random.Random(1)
    system = "".join(rng.choice("abcdefghij ") for _ in range(3000))
    prompt = system + "".join(rng.choice("klmnop ") for _ in range(1096))  # 4 KB
    hash_us = per_call_us(lambda: prompt_hashes("llama", prompt), args.repeat)
    print(f"hash 4 KB prompt (64 blocks): {hash_us:.1f} us")
    huge = "".join(rng.choice("abcdefghij ") for _ in range(200_000))
    huge_us = per_call_us(lambda: prompt_hashes("llama", huge), max(10, args.repeat // 10))
    print(f"hash 200 KB prompt (capped at 256 blocks): {huge_us:.1f} us")
    print(f"{'profile':>9} {'pods':>5} {'p50 us':>8} {'p99 us':>8} {'wall p50 us':>12}")
    for pods in (int(p) for p in args.pods.split(",")):
        for profile in args.profiles.split(","):
            repeat = max(50, args.repeat * 16 // max(16, pods))  # bounded time at 1,000 pods
            lat = pick_latency(pods, profile, repeat)
            print(f"{profile:>9} {pods:>5} {lat.p50_us:>8.1f} {lat.p99_us:>8.1f} {lat.wall_p50_us:>12.1f}")


if __name__ == "__main__":
    main()
