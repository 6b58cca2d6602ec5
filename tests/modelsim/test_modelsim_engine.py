"""Engine behaviour against the profile's step-time model, on a fast simulated clock."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator

import pytest

from modelsim.clock import SimClock
from modelsim.engine import Engine
from modelsim.profiles import get_profile
from modelsim.sequence import Seq, StepPlan

SCALE = 100.0
H100 = get_profile("h100-llama3.1-8b")


@pytest.fixture
async def make_engine() -> AsyncIterator:
    engines: list[Engine] = []

    def factory(**overrides: object) -> Engine:
        # A generous lag bound keeps the simulated timeline exact on a busy test machine.
        e = Engine(H100.with_overrides(**overrides), SimClock(SCALE), model="m", max_lag_wall_s=5.0)
        e.start()
        engines.append(e)
        return e

    yield factory
    for e in engines:
        await e.stop()


async def drain(seq: Seq) -> list[str]:
    out = []
    while True:
        ev = await asyncio.wait_for(seq.events.get(), 30)
        if ev.finish_reason is not None:
            assert ev.error is None
            return out
        out.append(ev.text)


def record_steps(engine: Engine) -> list[StepPlan]:
    steps: list[StepPlan] = []
    engine.on_step = lambda plan, start, end: steps.append(plan)
    return steps


async def test_lone_request_matches_profile(make_engine) -> None:
    e = make_engine()
    prompt = list(range(100))
    seq = e.submit(prompt, max_tokens=20)
    tokens = await drain(seq)
    assert len(tokens) == 20
    assert seq.first_token - seq.arrival == pytest.approx(H100.step_ms(100, 0, 0, False) / 1000, rel=1e-6)
    # Each decode step reads weights plus the KV context: T0 + W + k_kv * ctx / 1000 (6.5 ms here).
    expected_decode = sum(H100.step_ms(0, 1, 100 + i, False) for i in range(19)) / 1000
    assert seq.last_token - seq.first_token == pytest.approx(expected_decode, rel=1e-6)
    assert 6.4 < (seq.last_token - seq.first_token) / 19 * 1000 < 6.6  # published TPOT 6.48 ms


async def test_batching_respects_seq_and_token_limits(make_engine) -> None:
    e = make_engine(max_num_seqs=4, max_num_batched_tokens=64)
    steps = record_steps(e)
    seqs = [e.submit(list(range(i, i + 50)), max_tokens=5) for i in range(10)]
    results = await asyncio.gather(*(drain(s) for s in seqs))
    assert all(len(r) == 5 for r in results)
    assert max(len(p.scheduled) for p in steps) == 4
    assert max(sum(n for _, n in p.scheduled) for p in steps) <= 64
    assert max(p.decode_tokens for p in steps) >= 2  # really batched decodes


async def test_chunked_prefill_runs_decodes_first(make_engine) -> None:
    e = make_engine(max_num_batched_tokens=64)
    steps = record_steps(e)
    first = e.submit(list(range(10)), max_tokens=40)
    for _ in range(2):
        await first.events.get()  # it is decoding now
    long = e.submit(list(range(1000, 1200)), max_tokens=1)
    await drain(long)
    with_long = [p for p in steps if any(s is long for s, _ in p.scheduled)]
    chunks = [n for p in with_long for s, n in p.scheduled if s is long]
    assert len(chunks) == 4 and sum(chunks) == 200  # 200-token prompt in a 64-token budget
    assert all(any(s is first for s, _ in p.scheduled) for p in with_long)  # decode kept going
    assert all(p.decode_tokens == 1 and p.prefill_tokens == 63 for p in with_long[:3])
    await drain(first)


async def test_ttft_grows_with_queue(make_engine) -> None:
    e = make_engine(max_num_batched_tokens=512)
    seqs = [e.submit(list(range(i * 1000, i * 1000 + 500)), max_tokens=2) for i in range(6)]
    await asyncio.gather(*(drain(s) for s in seqs))
    # All six are queued before the engine's first step (no await between the submits), so
    # time them from the first arrival: a loaded machine may pause between two submits, which
    # moves a later `arrival` on the wall-based clock without changing the schedule.
    ttfts = [s.first_token - seqs[0].arrival for s in seqs]
    assert all(b > a for a, b in itertools.pairwise(ttfts))
    assert ttfts[-1] > 4 * ttfts[0]


async def test_preemption_when_blocks_run_out(make_engine) -> None:
    e = make_engine(num_gpu_blocks=20)  # 320 tokens of KV; 4 x (40 + 100) tokens do not fit
    seqs = [e.submit(list(range(i * 100, i * 100 + 40)), max_tokens=100) for i in range(4)]
    results = await asyncio.gather(*(drain(s) for s in seqs))
    assert [len(r) for r in results] == [100] * 4
    assert e.stats.num_preemptions > 0 and sum(s.preemptions for s in seqs) == e.stats.num_preemptions
    assert e.kv.num_free == 20 and not e.running and not e.waiting


async def test_prefix_cache_hit_cuts_ttft_and_counts_tokens(make_engine) -> None:
    e = make_engine()
    prompt = list(range(5000, 7000))
    cold = e.submit(prompt, max_tokens=2)
    await drain(cold)
    assert e.stats.prefix_cache_hits == 0
    warm = e.submit([*prompt, 1, 2, 3], max_tokens=2)
    await drain(warm)
    assert e.stats.prefix_cache_hits == 2000 // 16 * 16  # only whole blocks count
    assert warm.cached_tokens == 2000
    cold_ttft, warm_ttft = cold.first_token - cold.arrival, warm.first_token - warm.arrival
    assert warm_ttft < 0.2 * cold_ttft
    assert e.stats.prefix_cache_queries == 2000 + 2003


async def test_a_hit_request_caches_its_own_new_blocks(make_engine) -> None:
    """Turn 3 of a session finds turn 2's whole prompt cached, not only turn 1's: a request
    that hit the cache registers the blocks it computed beyond the hit (issue #51: the hit
    was counted in tokens where the registration counts blocks, so nothing past the first
    hit was ever cached)."""
    e = make_engine()
    turn1 = list(range(5000, 6600))  # 100 blocks
    turn2 = [*turn1, *range(9000, 9800)]  # + 50 blocks, hits turn 1's 100
    turn3 = [*turn2, *range(12000, 12100)]
    for prompt in (turn1, turn2):
        await drain(e.submit(prompt, max_tokens=2))
    third = e.submit(turn3, max_tokens=2)
    await drain(third)
    assert third.cached_tokens == len(turn2)


async def test_lora_slot_limit_and_load_latency(make_engine) -> None:
    e = make_engine(max_loras=1, max_cpu_loras=2)
    a = e.submit(list(range(20)), max_tokens=5, adapter="a")
    b = e.submit(list(range(20)), max_tokens=5, adapter="b")
    base = e.submit(list(range(20)), max_tokens=5)
    await asyncio.gather(drain(a), drain(b), drain(base))
    assert b.first_scheduled >= a.last_token  # one slot: b waited for a to finish
    assert base.first_token < b.first_scheduled  # base-model requests are not blocked
    # First use of an adapter pays the disk load (0.5 s) on top of a 1.2x LoRA step.
    assert a.first_token - a.first_scheduled == pytest.approx(
        0.5 + H100.step_ms(40, 0, 0, True) / 1000, rel=1e-6
    )
    assert e.lora.loads_from_disk == 2 and e.lora.resident("b") and not e.lora.resident("a")
    again = e.submit(list(range(20)), max_tokens=1, adapter="a")  # in the CPU cache now: ~10 ms
    await drain(again)
    assert e.lora.loads_from_cpu == 1
    load = (again.first_token - again.first_scheduled) - H100.step_ms(20, 0, 0, True) / 1000
    assert load == pytest.approx(0.010, rel=1e-6)


async def test_prediction_matches_idle_ttft(make_engine) -> None:
    e = make_engine()
    prompt = list(range(3000))
    predicted = e.predict_ttft(prompt, None)
    seq = e.submit(prompt, max_tokens=1)
    await drain(seq)
    assert seq.first_token - seq.arrival == pytest.approx(predicted, rel=1e-6)


async def test_abort_frees_blocks(make_engine) -> None:
    e = make_engine()
    seq = e.submit(list(range(500)), max_tokens=10_000)
    for _ in range(3):
        await seq.events.get()
    assert e.kv.num_free < e.kv.num_blocks
    e.abort(seq)
    assert e.kv.num_free == e.kv.num_blocks and not e.running
