"""Offline load check: modelsim's engines driven in virtual time give the engine's own timings."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.harness.workloads import TraceRequest, chat_body, generate_trace
from bench.probes.engine_check import build_pods, check, distinct_prompt_tokens, main, make_router, simulate
from modelsim.tokenizer import ApproxTokenizer

FLEET = {"pods": [{"name": "h100", "model": "m", "profile": "h100-llama3.1-8b", "replicas": 2}]}


def test_a_lone_request_takes_exactly_one_prefill_step() -> None:
    pods = build_pods(FLEET)
    body = chat_body("m", [{"role": "user", "content": "hello there " * 200}], 5)
    (done,) = simulate([TraceRequest(3.0, body)], pods, make_router("round-robin"), 100)
    prompt = len(ApproxTokenizer(pods[0].config.profile.vocab_size).encode_chat(body["messages"]))
    assert done.prompt_tokens == prompt
    assert done.ttft_s == pytest.approx(pods[0].config.profile.step_ms(prompt, 0, 0, False) / 1000)
    assert done.output_tokens == 5 and done.finished_s is not None
    assert done.finished_s > 3.0 + pods[0].config.profile.step_ms(prompt, 0, 0, False) / 1000


def test_round_robin_alternates_and_every_request_finishes() -> None:
    trace = generate_trace({"kind": "chat", "model": "m"}, {"rate": 10}, 10, seed=3)
    result = check(trace, build_pods(FLEET), "round-robin", 10)
    assert result.requests == len(trace) and result.unfinished == 0
    assert [p["share"] for p in result.pods] == pytest.approx([0.5, 0.5], abs=0.01)
    assert result.ttft_p95_s is not None and 0 < result.ttft_p95_s < 0.5  # two idle-ish H100s


def test_affinity_keeps_group_prefixes_cached_where_round_robin_evicts() -> None:
    fleet = {"pods": [{"name": "p", "model": "m", "profile": "h100-llama3.1-8b", "replicas": 2,
                       "num_gpu_blocks": 300}]}  # fmt: skip
    workload = {"kind": "shared_prefix", "model": "m", "groups": 12, "prompts_per_group": 4,
                "system_tokens": 700, "question_tokens": 20, "output_tokens": 8}  # fmt: skip
    trace = generate_trace(workload, {"rate": 20}, 20, seed=1)
    rr = check(trace, build_pods(fleet), "round-robin", 20)
    affine = check(trace, build_pods(fleet), "affinity", 20)
    assert affine.cached_share > rr.cached_share + 0.1, (affine.cached_share, rr.cached_share)


def test_an_overloaded_pod_builds_a_backlog() -> None:
    fleet = {"pods": [{"name": "a10g", "model": "m", "profile": "a10g-llama3.1-8b"}]}
    light, heavy = (
        check(generate_trace({"kind": "chat", "model": "m"}, {"rate": rate}, 40, seed=2),
              build_pods(fleet), "round-robin", 40)
        for rate in (1, 10)
    )  # fmt: skip
    assert light.ttft_p95_s is not None and light.ttft_p95_s < 1
    assert heavy.ttft_p95_s is None or heavy.ttft_p95_s > 10 * light.ttft_p95_s
    assert heavy.completed_per_s < 0.7 * heavy.offered_per_s


def test_distinct_prompt_tokens_counts_a_shared_prefix_once() -> None:
    system = {"role": "system", "content": "shared words here " * 100}
    trace = [
        TraceRequest(0.0, chat_body("m", [system, {"role": "user", "content": f"question {i} " * 40}], 4))
        for i in range(3)
    ]
    one = distinct_prompt_tokens(trace[:1], 128256, 16)
    three = distinct_prompt_tokens(trace, 128256, 16)
    assert one < three < 3 * one


def test_unknown_route_and_pod_are_errors() -> None:
    with pytest.raises(ValueError, match="unknown route"):
        make_router("random")
    with pytest.raises(ValueError, match="no fleet pod named"):
        build_pods(FLEET, only="tpu")


def test_cli_reports_each_route(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(
        "description: d\nfleet: {pods: [{name: h100, model: m, profile: h100-llama3.1-8b, replicas: 2}]}\n"
        "workload: {kind: chat, model: m}\narrivals: {rate: 5}\nduration_s: 10\n"
    )
    assert (
        main(["--scenario", str(path), "--mode", "full", "--route", "round-robin", "--route", "oracle"]) == 0
    )
    out = capsys.readouterr().out
    assert "round-robin: " in out and "oracle: " in out and "h100-1: share" in out
    assert main(["--scenario", str(path), "--mode", "full", "--pod", "h100", "--rate", "2"]) == 0
    out = capsys.readouterr().out
    assert "h100 alone at 2 req/s" in out and "h100-0: share 100 %" in out and "h100-1" not in out
    assert main(["--scenario", str(tmp_path / "missing.yaml")]) == 2
