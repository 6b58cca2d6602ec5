"""Microbenchmark: WeightedScheduler.pick latency per profile and pool size.

    python -m bench.scheduler_bench [--repeat N]

A 4 KB prompt (64 prefix blocks), pods with varied load and a warm prefix index (every pod
has seen some prompts sharing the request's prefix). "pick" includes hashing the prompt
once; "hash" is that hashing alone, so pick - hash is the scheduling cost proper.
"""

from __future__ import annotations

import argparse
import random

from bench.parse_metrics_bench import per_call_us
from epp.pool import Endpoint, EndpointState, Metrics, PoolSnapshot
from epp.request import InferenceRequest
from epp.scheduling import BUILTIN_PROFILES, WeightedScheduler, prompt_hashes


def make_snapshot(pods: int, rng: random.Random) -> PoolSnapshot:
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
        stream=True,
        include_usage=False,
        objective=profile,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=2000)
    args = parser.parse_args()
    rng = random.Random(1)
    system = "".join(rng.choice("abcdefghij ") for _ in range(3000))
    prompt = system + "".join(rng.choice("klmnop ") for _ in range(1096))  # 4 KB
    hash_us = per_call_us(lambda: prompt_hashes("llama", prompt), args.repeat)
    print(f"hash 4 KB prompt (64 blocks): {hash_us:.1f} us")
    huge = "".join(rng.choice("abcdefghij ") for _ in range(200_000))
    huge_us = per_call_us(lambda: prompt_hashes("llama", huge), max(10, args.repeat // 10))
    print(f"hash 200 KB prompt (capped at 256 blocks): {huge_us:.1f} us")
    print(f"{'profile':>8} {'pods':>5} {'pick us':>8} {'pick - hash us':>15}")
    for pods in (8, 64):
        snapshot = make_snapshot(pods, rng)
        for profile in BUILTIN_PROFILES:
            sched = WeightedScheduler(rng=random.Random(0))
            for i, state in enumerate(snapshot.endpoints):  # warm index: shared system prompt
                warm = request(system[: 64 * (10 + i % 30)], profile, -i - 1)
                sched.on_routed(warm, state.address)
            counter = iter(range(10**9))
            us = per_call_us(
                lambda s=sched, p=profile, c=counter, snap=snapshot: s.pick(
                    request(prompt, p, next(c)), snap
                ),
                args.repeat,
            )
            print(f"{profile:>8} {pods:>5} {us:>8.1f} {us - hash_us:>15.1f}")


if __name__ == "__main__":
    main()
