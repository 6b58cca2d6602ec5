"""The fleet's own step lag recorded with every run, and SSE events split across reads."""

from __future__ import annotations

import httpx

from bench.harness.fleet import fleet_lag
from bench.harness.loadgen import RequestResult, SseReader
from devstack.launch import free_port
from modelsim.fleet import FleetSpec, run_fleet


async def test_fleet_lag_reads_every_pods_step_lag_and_is_none_for_other_servers() -> None:
    spec = FleetSpec.from_dict({"time_scale": 1.0, "pods": [{"name": "p", "model": "m", "replicas": 2}]})
    async with run_fleet(spec) as fleet:
        body = {"model": "m", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}
        async with httpx.AsyncClient(timeout=30) as client:
            reply = await client.post(f"{fleet.pods[0].url}/v1/chat/completions", json=body)
        assert reply.status_code == 200
        lag = await fleet_lag([p.url for p in fleet.pods])
    assert lag is not None
    assert set(lag["pods"]) == {p.name for p in fleet.pods}
    busy = lag["pods"][fleet.pods[0].name]
    assert busy["steps"] >= 4  # one prefill step, then a step per further token
    assert 0 <= busy["mean_lag_ms"] <= lag["max_lag_ms"] <= 20.0  # the engine's catch-up bound
    assert await fleet_lag([f"http://127.0.0.1:{free_port()}"]) is None


def test_sse_events_split_across_reads_are_reassembled() -> None:
    result = RequestResult(index=0, tag="t", scheduled_s=0.0)
    reader = SseReader(result, start=0.0)
    stream = (
        b'data: {"choices":[{"delta":{"content":"a"}}]}\n\ndata: {"choices":[{"del'
        b'ta":{"content":"b"}}]}\n\ndata: {"choices":[],"usage":{"completion_tokens":2}}\n\ndata: [DONE]\n\n'
    )
    for i in range(0, len(stream), 7):  # reads that cut lines and events anywhere
        reader.feed(stream[i : i + 7])
    reader.finish()
    assert result.error is None and reader.done
    assert result.content_chunks == 2 and result.output_tokens == 2 and len(result.itl_s) == 1


def test_bad_sse_data_is_an_error_not_a_crash() -> None:
    for data in (b"data: {nope\n\n", b"data: 5\n\n"):
        result = RequestResult(index=0, tag="t", scheduled_s=0.0)
        reader = SseReader(result, start=0.0)
        reader.feed(data)
        reader.finish()
        assert result.error is not None and result.error.startswith("bad SSE data")
