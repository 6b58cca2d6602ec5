"""A shared system prompt over identical pods: prefix affinity must not herd every session onto
the pods that first held the prompt (issue #51, "idle pods"). Once the pods holding it have more
queued than a cold pod's prefill of the whole prompt, the cold pod gets work: over a burst of
requests that would give every pod 2.5x that prefill if spread evenly, every pod gets some,
for the built-in profiles that predict (the default's family).
"""

from __future__ import annotations

import random
from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from epp.datalayer.endpoint_records import Endpoint, Metrics
from epp.datalayer.pool import Pool
from epp.scheduling.request import parse_request
from epp.scheduling.weighted import WeightedScheduler
from gateway.profiles import BUILTIN_PROFILES


def _request(i: int, system: str, tail_words: int) -> object:
    tail = " ".join(f"s{i}w{j}" for j in range(tail_words))
    body = {
        "model": "m",
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": tail}],
        "max_tokens": 200,
    }
    return parse_request(body, request_id=str(i), target_model="m", adapter=None, headers={})


@settings(max_examples=40, deadline=None)
@given(
    k=st.integers(min_value=2, max_value=6),
    system_words=st.sampled_from([1_000, 3_000, 6_000]),
    tail_words=st.integers(min_value=200, max_value=1_500),
    profile=st.sampled_from(["default", "predicted"]),
    seed=st.integers(min_value=0, max_value=2**16),
)
def test_a_shared_system_prompt_leaves_no_pod_idle_under_load(
    k: int, system_words: int, tail_words: int, profile: str, seed: int
) -> None:
    pods = [Endpoint(f"10.0.0.{i}:8000", frozenset({"m"})) for i in range(k)]
    pool = Pool(pods)
    pool.clock = lambda: 99.9
    for ep in pods:
        pool.record_metrics(
            ep.address,
            Metrics(waiting=0, running=0, kv_usage=0.0, block_size=16, num_gpu_blocks=20_000),
            first_tokens=40.0,
        )
    system = " ".join(f"sys{j}" for j in range(system_words))
    scheduler = WeightedScheduler(BUILTIN_PROFILES, default_profile=profile, rng=random.Random(seed))
    now, counts = 100.0, Counter[str]()
    # "Loaded": a burst whose tails, spread evenly, queue 2.5 cold prefills of the prompt per pod.
    n = k + -(-5 * k * system_words // (2 * tail_words))
    for i in range(n):
        request = _request(i, system, tail_words)
        decision = scheduler.pick(request, pool.snapshot(now=now))  # type: ignore[arg-type]
        address = decision.ranked[0]
        pool.on_routed(address, 300, decision.prefill_s, now=now)
        scheduler.on_routed(request, address)  # type: ignore[arg-type]
        counts[address] += 1
        now += 0.001
    idle = [ep.address for ep in pods if counts[ep.address] == 0]
    assert not idle, (profile, dict(counts))
