"""Trace generators: deterministic per seed, statistically right, prefixes really shared."""

from __future__ import annotations

import itertools
import random
import statistics
from collections import Counter

import pytest

from bench.harness.workloads import (
    CHARS_PER_TOKEN,
    TextSource,
    bursty_arrivals,
    gamma_arrivals,
    generate_trace,
    in_spike,
    poisson_arrivals,
)

MODEL = "llama3.1-8b"


def _gaps(times: list[float]) -> list[float]:
    return [b - a for a, b in zip([0.0, *times], times, strict=False)]


def test_same_seed_same_trace_other_seed_differs() -> None:
    workload = {"kind": "sessions", "model": MODEL, "sessions": 4, "turns": 3}
    arrivals = {"pattern": "gamma", "rate": 5, "burstiness": 0.5}
    a = generate_trace(workload, arrivals, 20, seed=7)
    b = generate_trace(workload, arrivals, 20, seed=7)
    c = generate_trace(workload, arrivals, 20, seed=8)
    assert a == b
    assert [r.at_s for r in a] != [r.at_s for r in c]
    assert a[0].body != c[0].body


def test_poisson_rate_and_exponential_gaps() -> None:
    times = poisson_arrivals(50.0, 200.0, random.Random(1))
    assert times == sorted(times) and times[-1] < 200.0
    assert len(times) / 200.0 == pytest.approx(50.0, rel=0.03)
    gaps = _gaps(times)
    assert statistics.pstdev(gaps) / statistics.mean(gaps) == pytest.approx(1.0, rel=0.05)


@pytest.mark.parametrize("burstiness", [0.25, 4.0])
def test_gamma_burstiness_sets_coefficient_of_variation(burstiness: float) -> None:
    times = gamma_arrivals(40.0, 300.0, random.Random(2), burstiness)
    gaps = _gaps(times)
    assert len(times) / 300.0 == pytest.approx(40.0, rel=0.06)
    cv = statistics.pstdev(gaps) / statistics.mean(gaps)
    assert cv == pytest.approx(burstiness**-0.5, rel=0.1)


def test_bursty_spikes_multiply_the_rate() -> None:
    times = bursty_arrivals(5.0, 600.0, random.Random(3), spike_factor=8, spike_len_s=5, spike_every_s=30)
    inside = [t for t in times if in_spike(t, 25, 5, 30)]
    spike_time = 20 * 5  # 20 spikes of 5 s in 600 s, the first at 25 s
    base_rate = (len(times) - len(inside)) / (600 - spike_time)
    spike_rate = len(inside) / spike_time
    assert base_rate == pytest.approx(5.0, rel=0.1)
    assert spike_rate == pytest.approx(40.0, rel=0.1)


@pytest.mark.parametrize(
    "bad",
    [
        lambda: gamma_arrivals(0, 10, random.Random()),
        lambda: gamma_arrivals(1, 10, random.Random(), burstiness=0),
        lambda: bursty_arrivals(1, 10, random.Random(), spike_len_s=10, spike_every_s=5),
        lambda: generate_trace({"kind": "nope", "model": MODEL}, {"rate": 1}, 5, 0),
        lambda: generate_trace({"kind": "chat", "model": MODEL}, {"pattern": "weird", "rate": 1}, 5, 0),
    ],
)
def test_bad_parameters_raise_value_error(bad) -> None:
    with pytest.raises(ValueError):
        bad()


def test_text_is_sized_at_four_chars_per_token_and_deterministic() -> None:
    source = TextSource(seed=1)
    for tokens in (1, 10, 333, 4000):
        text = source.text(tokens, random.Random(tokens))
        assert tokens * CHARS_PER_TOKEN - 12 <= len(text) <= tokens * CHARS_PER_TOKEN
    assert source.text(50, random.Random(5)) == TextSource(seed=1).text(50, random.Random(5))


def test_chat_lengths_are_sharegpt_like() -> None:
    trace = generate_trace({"kind": "chat", "model": MODEL}, {"rate": 40}, 100, seed=3)
    prompt_tokens = [len(r.body["messages"][0]["content"]) / CHARS_PER_TOKEN for r in trace]
    outputs = [r.body["max_tokens"] for r in trace]
    assert 170 < statistics.mean(prompt_tokens) < 280
    assert 150 < statistics.mean(outputs) < 250
    body = trace[0].body
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["model"] == MODEL


def _prompt(messages: list[dict[str, str]]) -> str:
    return "".join(f"{m['role']}:{m['content']}\n" for m in messages)


def test_session_turns_extend_the_previous_prompt() -> None:
    workload = {"kind": "sessions", "model": MODEL, "sessions": 3, "turns": 4, "system_tokens": 200}
    trace = generate_trace(workload, {"rate": 10}, 30, seed=5)
    by_session: dict[str, list] = {}
    for req in trace:
        session, turn = req.tag.split("/")
        by_session.setdefault(session, []).append((int(turn.removeprefix("turn-")), req.body["messages"]))
    assert len(by_session) > 3  # finished sessions are replaced by new ones
    for turns in by_session.values():
        assert [t for t, _ in turns] == list(range(len(turns)))
        assert len(turns) <= 4
        for (_, earlier), (_, later) in itertools.pairwise(turns):
            assert later[: len(earlier)] == earlier
            assert len(later) == len(earlier) + 2  # previous answer + new question
            assert _prompt(later).startswith(_prompt(earlier))
    systems = {turns[0][1][0]["content"] for turns in by_session.values()}
    assert len(systems) == len(by_session)  # each session has its own system prompt


def test_staggered_sessions_start_at_spread_turns_and_still_extend_their_prompts() -> None:
    workload = {"kind": "sessions", "model": MODEL, "sessions": 8, "turns": 8, "system_tokens": 100,
                "staggered": True}  # fmt: skip
    trace = generate_trace(workload, {"rate": 20}, 30, seed=5)
    first_turn: dict[str, int] = {}
    by_session: dict[str, list] = {}
    for req in trace:
        session, turn = req.tag.split("/")
        first_turn.setdefault(session, int(turn.removeprefix("turn-")))
        by_session.setdefault(session, []).append(req.body["messages"])
    initial = [first_turn[f"session-{i}"] for i in range(8)]
    assert sorted(initial) == list(range(8))  # one session at each age
    assert all(
        first_turn[s] == 0 for s in first_turn if int(s.split("-")[1]) >= 8
    )  # replacements start fresh
    for turns in by_session.values():
        for earlier, later in itertools.pairwise(turns):
            assert later[: len(earlier)] == earlier and len(later) == len(earlier) + 2
        roles = [m["role"] for m in turns[0]]
        assert (
            roles[0] == "system"
            and roles[-1] == "user"
            and roles[1:-1] == ["user", "assistant"] * ((len(roles) - 2) // 2)
        )


def test_agentic_sessions_share_one_system_prompt_and_carry_tool_outputs() -> None:
    workload = {"kind": "sessions", "model": MODEL, "sessions": 6, "turns": 12, "system_tokens": 300,
                "question_tokens": 20, "shared_system": True, "tool_output_fraction": 0.5,
                "tool_output_tokens": 400}  # fmt: skip
    trace = generate_trace(workload, {"rate": 20}, 20, seed=3)
    assert len({req.body["messages"][0]["content"] for req in trace}) == 1  # one shared system prompt
    assert len({req.tag.split("/")[0] for req in trace}) > 6  # sessions still retire and renew
    last_turns = [len(req.body["messages"][-1]["content"]) // CHARS_PER_TOKEN for req in trace]
    tool_outputs = [n for n in last_turns if n > 20]
    assert 0.35 < len(tool_outputs) / len(last_turns) < 0.65
    assert all(100 <= n <= 1600 for n in tool_outputs)  # lognormal around 400, clipped to 1/4..4x
    assert 300 < statistics.median(tool_outputs) < 550
    by_session: dict[str, list] = {}
    for req in trace:
        by_session.setdefault(req.tag.split("/")[0], []).append(req.body["messages"])
    for turns in by_session.values():
        for earlier, later in itertools.pairwise(turns):
            assert later[: len(earlier)] == earlier and len(later) == len(earlier) + 2


def test_agentic_options_left_out_keep_the_sessions_trace() -> None:
    base = {"kind": "sessions", "model": MODEL, "sessions": 4, "turns": 5, "staggered": True}
    explicit = {**base, "shared_system": False, "tool_output_fraction": 0.0}
    assert generate_trace(base, {"rate": 8}, 10, seed=2) == generate_trace(explicit, {"rate": 8}, 10, seed=2)
    with pytest.raises(ValueError):
        generate_trace({**base, "tool_output_fraction": 1.5}, {"rate": 8}, 10, seed=2)


def test_shared_prefix_groups_share_system_prompts() -> None:
    workload = {"kind": "shared_prefix", "model": MODEL, "groups": 3, "prompts_per_group": 4}
    trace = generate_trace(workload, {"rate": 20}, 20, seed=9)
    systems: dict[str, set[str]] = {}
    questions: dict[str, set[str]] = {}
    for req in trace:
        systems.setdefault(req.tag, set()).add(req.body["messages"][0]["content"])
        questions.setdefault(req.tag, set()).add(req.body["messages"][1]["content"])
    assert set(systems) == {"group-0", "group-1", "group-2"}
    assert all(len(s) == 1 for s in systems.values())
    assert len({next(iter(s)) for s in systems.values()}) == 3
    assert all(1 < len(q) <= 4 for q in questions.values())
    assert len(systems["group-0"].pop()) == pytest.approx(100 * CHARS_PER_TOKEN, abs=12)


def test_shared_prefix_tenants_can_be_zipf_popular() -> None:
    workload = {"kind": "shared_prefix", "model": MODEL, "groups": 20, "prompts_per_group": 2, "zipf_s": 1.0}
    trace = generate_trace(workload, {"rate": 100}, 40, seed=5)
    counts = Counter(r.tag for r in trace)
    assert len(counts) == 20
    harmonic = sum(1 / k for k in range(1, 21))
    assert counts["group-0"] / len(trace) == pytest.approx(1 / harmonic, rel=0.1)
    assert counts["group-0"] / counts["group-3"] == pytest.approx(4, rel=0.25)
    uniform = Counter(r.tag for r in generate_trace({**workload, "zipf_s": 0.0}, {"rate": 100}, 40, seed=5))
    assert max(uniform.values()) < 2 * min(uniform.values())


def test_docqa_shares_a_few_long_documents() -> None:
    workload = {"kind": "docqa", "model": MODEL, "documents": 2, "document_tokens": 1000}
    trace = generate_trace(workload, {"rate": 10}, 10, seed=1)
    docs = {r.body["messages"][0]["content"] for r in trace}
    assert len(docs) == 2
    assert all(len(d) > 3900 for d in docs)


def test_lora_popularity_is_zipf_like() -> None:
    workload = {"kind": "lora", "model": MODEL, "adapters": 10, "zipf_s": 1.2}
    trace = generate_trace(workload, {"rate": 50}, 100, seed=2)
    counts = Counter(r.body["model"] for r in trace)
    assert len(counts) == 10
    top, second = counts[f"{MODEL}-lora-00"], counts[f"{MODEL}-lora-01"]
    assert top / len(trace) == pytest.approx(1 / sum(k**-1.2 for k in range(1, 11)), rel=0.1)
    assert top / second == pytest.approx(2**1.2, rel=0.2)
    assert all(r.tag == r.body["model"] for r in trace)


def test_slo_mix_tags_and_objectives() -> None:
    workload = {"kind": "slo_mix", "model": MODEL, "tight_fraction": 0.3, "tight_ms": 80, "loose_ms": 1000}
    trace = generate_trace(workload, {"rate": 40}, 50, seed=5)
    tight = [r for r in trace if r.tag == "tight"]
    assert len(tight) / len(trace) == pytest.approx(0.3, abs=0.04)
    assert {r.headers["x-gateway-slo-ttft-ms"] for r in tight} == {"80"}
    assert {r.slo_ttft_s for r in trace if r.tag == "loose"} == {1.0}
    assert {r.tag for r in trace} == {"tight", "loose"}
    assert generate_trace({"kind": "chat", "model": MODEL}, {"rate": 5}, 2, seed=5)[0].slo_ttft_s is None


def test_interactive_batch_classes_objectives_and_band() -> None:
    workload = {
        "kind": "interactive_batch",
        "model": MODEL,
        "interactive_fraction": 0.8,
        "interactive_ms": 80,
    }
    workload |= {"batch_ms": 4000, "batch_input_tokens": 2000, "batch_output_tokens": 200}
    trace = generate_trace(workload, {"rate": 40}, 50, seed=6)
    inter, batch = [r for r in trace if r.tag == "interactive"], [r for r in trace if r.tag == "batch"]
    assert len(inter) / len(trace) == pytest.approx(0.8, abs=0.04) and len(inter) + len(batch) == len(trace)
    assert {r.slo_ttft_s for r in inter} == {0.08} and {r.slo_ttft_s for r in batch} == {4.0}
    assert {r.headers.get("x-gateway-inference-objective") for r in batch} == {"sheddable"}
    assert all("x-gateway-inference-objective" not in r.headers for r in inter)
    assert {r.body["max_tokens"] for r in batch} == {200}
    chars = statistics.mean(len(r.body["messages"][0]["content"]) for r in batch)
    assert chars / 4 == pytest.approx(2000, rel=0.15)


def test_long_short_mix_fraction_and_sizes() -> None:
    workload = {"kind": "long_short", "model": MODEL, "long_fraction": 0.2, "long_input_tokens": 5000}
    trace = generate_trace(workload, {"rate": 40}, 50, seed=4)
    longs = [r for r in trace if r.tag == "long"]
    assert len(longs) / len(trace) == pytest.approx(0.2, abs=0.04)
    long_tokens = statistics.mean(len(r.body["messages"][0]["content"]) / 4 for r in longs)
    short_tokens = statistics.mean(
        len(r.body["messages"][0]["content"]) / 4 for r in trace if r.tag == "short"
    )
    assert long_tokens > 10 * short_tokens
