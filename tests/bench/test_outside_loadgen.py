"""An outside load generator beside ours: `bench serve` keeps a fleet and router up for it, and
its per-request records are read by the same statistics as ours."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.harness.loadgen import RequestResult
from bench.harness.scenario import parse_scenario
from bench.harness.serve import serve
from bench.probes.outside_loadgen import figures, inference_perf_results, main, render


def _record(start: float, ttft: float, tokens: int, gap: float = 0.01, error: str | None = None) -> dict:
    times = [start + ttft + i * gap for i in range(tokens)]
    return {
        "start_time": start,
        "end_time": times[-1] + 0.001,
        "info": {"response_metrics": {"output_tokens": tokens, "output_token_times": times}},
        "error": error,
    }


def test_inference_perf_records_read_like_our_results(tmp_path: Path) -> None:
    starts = [1000.0 + 0.5 * i for i in range(20)]
    records = [_record(s, 0.02 + 0.001 * i, 5) for i, s in enumerate(starts)]
    records.append({**_record(1010.0, 0.5, 1), "error": "timeout"})
    path = tmp_path / "per_request_lifecycle_metrics.json"
    path.write_text(json.dumps(list(reversed(records))))  # any order: sorted by start
    theirs = inference_perf_results(path)
    assert [r.sent_s for r in theirs[:2]] == [0.0, 0.5] and not theirs[-1].ok
    assert theirs[0].ttft_s == pytest.approx(0.02) and theirs[0].itl_s == pytest.approx([0.01] * 4)
    ours = [
        RequestResult(i, "chat", s - 1000, s - 1000, 0.0, 0.02 + 0.001 * i, 0.02 + 0.001 * i + 0.041,
                      [0.01] * 4, 5, 5, 200)
        for i, s in enumerate(starts)
    ]  # fmt: skip
    a, b = figures("ours", ours), figures("theirs", theirs[:-1])
    assert (a.ttft_p50_s, a.ttft_p95_s, a.steady_requests) == pytest.approx(
        (b.ttft_p50_s, b.ttft_p95_s, b.steady_requests)
    )
    assert a.output_tok_s == pytest.approx(b.output_tok_s) and a.mean_output_tokens == 5
    text = render([a, figures("theirs", theirs, cpu_s=2.1)], "toy")
    assert "| theirs | 21 (20) |" in text and "| 100.0 ms |" in text and "theirs vs ours: TTFT P50" in text


def test_a_missing_tool_is_a_one_line_error(tmp_path: Path, capsys) -> None:
    assert main(["--inference-perf", str(tmp_path / "absent"), "--out", str(tmp_path / "out")]) == 2
    assert "make inference-perf" in capsys.readouterr().err
    assert main(["--analyze", "--out", str(tmp_path / "empty")]) == 2


async def test_serve_brings_up_the_fleet_and_router_and_writes_their_urls(tmp_path: Path) -> None:
    scenario = parse_scenario(
        {
            "name": "tiny",
            "fleet": {"pods": [{"model": "llama3.1-8b", "profile": "h100-llama3.1-8b", "replicas": 2}]},
            "workload": {"kind": "chat", "model": "llama3.1-8b"},
            "arrivals": {"pattern": "poisson", "rate": 1},
            "duration_s": 1,
        },
        "quick",
    )
    ready = tmp_path / "serve.json"
    code = await serve(scenario, "url", {"url": "http://127.0.0.1:9"}, str(ready), seconds=0.01)
    assert code == 0
    info = json.loads(ready.read_text())
    assert info["base_url"] == "http://127.0.0.1:9" and info["ca_file"] is None
    assert len(info["worker_urls"]) == 2 and info["model"] == "llama3.1-8b" and info["policy"] == "url"
    assert await serve(scenario, "no-such-policy", {}, None, seconds=0.01) == 2
