"""Identical pods, a burst inside one scrape interval: every built-in profile spreads it as
round-robin would (issue #40). Between two pages the scraped figures are the same for every pod,
so what tells the pods apart is this EPP's own record of its picks (the ledger, in-flight counts)
and, among near-equal totals, the pickers' exact-load order (epp/scheduling/picker.py)."""

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


def _request(i: int, words: int) -> object:
    # Distinct words per request: no two prompts share a prefix block.
    text = " ".join(f"w{i}x{j}" for j in range(words))
    body = {"model": "m", "messages": [{"role": "user", "content": text}], "max_tokens": 100}
    return parse_request(body, request_id=str(i), target_model="m", adapter=None, headers={})


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(min_value=1, max_value=60),
    k=st.integers(min_value=2, max_value=8),
    words=st.integers(min_value=5, max_value=400),
    profile=st.sampled_from(sorted(BUILTIN_PROFILES)),
    seed=st.integers(min_value=0, max_value=2**16),
)
def test_a_burst_over_identical_pods_lands_within_one_of_n_over_k(
    n: int, k: int, words: int, profile: str, seed: int
) -> None:
    pods = [Endpoint(f"10.0.0.{i}:8000", frozenset({"m"})) for i in range(k)]
    pool = Pool(pods)
    pool.clock = lambda: 99.9
    for ep in pods:  # one page each, the same figures
        pool.record_metrics(
            ep.address,
            Metrics(waiting=0, running=2, kv_usage=0.1, block_size=16, num_gpu_blocks=10_000),
            first_tokens=40.0,
        )
    scheduler = WeightedScheduler(BUILTIN_PROFILES, default_profile=profile, rng=random.Random(seed))
    now, counts = 100.0, Counter[str]()
    for i in range(n):  # n picks within 30 ms, before the next page
        request = _request(i, words)
        decision = scheduler.pick(request, pool.snapshot(now=now))  # type: ignore[arg-type]
        address = decision.ranked[0]
        pool.on_routed(address, 300, decision.prefill_s, now=now)
        scheduler.on_routed(request, address)  # type: ignore[arg-type]
        counts[address] += 1
        now += 0.03 / n
    shares = [counts[ep.address] for ep in pods]
    assert max(shares) - min(shares) <= 1, (profile, shares)
