"""Data-parallel pods: N engines behind one API server, as vLLM's --data-parallel-size runs them:
`X-data-parallel-rank` pins a rank, unpinned requests go to the least loaded rank, metrics are
labelled per engine, and each rank publishes its own KV events (port + rank, its rank in the
batch)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx
import msgpack
import pytest
import zmq
import zmq.asyncio

from modelsim.fleet import Fleet, FleetSpec, SpecError, run_fleet
from tests.waiting import until

KV = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": "tcp://127.0.0.1:0", "topic": "kv"}
PROMPT = {"model": "llama", "prompt": "count the sheep please " * 40, "max_tokens": 3}


@pytest.fixture
async def dp_fleet() -> AsyncIterator[Fleet]:
    spec = FleetSpec.from_dict(
        {
            "time_scale": 50.0,
            "pods": [{"name": "dp", "model": "llama", "data_parallel_size": 2, "kv_events": KV}],
        }
    )
    async with run_fleet(spec) as f:
        yield f


async def test_the_rank_header_pins_a_rank_and_bad_ranks_are_400(dp_fleet: Fleet) -> None:
    pod = dp_fleet.pod("dp")._pod
    async with httpx.AsyncClient(base_url=dp_fleet.pod("dp").url, timeout=10) as c:
        for _ in range(3):
            r = await c.post("/v1/completions", json=PROMPT, headers={"x-data-parallel-rank": "1"})
            assert r.status_code == 200
        assert [e.stats.ttft.count for e in pod.ranks] == [0, 3]
        for bad in ("2", "-1", "one"):
            r = await c.post("/v1/completions", json=PROMPT, headers={"X-data-parallel-rank": bad})
            assert r.status_code == 400 and "rank" in r.json()["error"]["message"]
        state = (await c.get("/sim/state")).json()
        assert [x["ttft_count"] for x in state["ranks"]] == [0, 3]

        page = (await c.get("/metrics")).text
        assert page.count("# TYPE vllm:num_requests_running gauge") == 1  # one family, a sample per rank
        assert 'vllm:num_requests_running{engine="0",model_name="llama"}' in page
        assert 'vllm:num_requests_running{engine="1",model_name="llama"}' in page
        assert 'vllm:generation_tokens_total{engine="1",model_name="llama"} 9.0' in page
        assert page.count("vllm:cache_config_info{") == 1


async def test_unpinned_requests_go_to_the_least_loaded_rank(dp_fleet: Fleet) -> None:
    pod = dp_fleet.pod("dp")._pod
    long = {**PROMPT, "max_tokens": 200}
    async with httpx.AsyncClient(base_url=dp_fleet.pod("dp").url, timeout=30) as c:
        first = asyncio.create_task(c.post("/v1/completions", json=long))
        await until(lambda: bool(pod.ranks[0].running or pod.ranks[0].waiting), "the first request running")
        second = await c.post("/v1/completions", json=PROMPT)
        assert second.status_code == 200 and (await first).status_code == 200
    assert [e.stats.ttft.count for e in pod.ranks] == [1, 1]


async def test_each_rank_publishes_its_own_kv_events(dp_fleet: Fleet) -> None:
    pod = dp_fleet.pod("dp")._pod
    assert [p.rank for p in pod.kv_publishers] == [0, 1]
    ctx = zmq.asyncio.Context()
    sub = ctx.socket(zmq.SUB)
    try:
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.connect(f"tcp://127.0.0.1:{pod.kv_publishers[1].port}")
        # ZMQ's slow joiner: a batch published before the SUB joined is lost; send until one arrives.
        frames = None
        async with httpx.AsyncClient(base_url=dp_fleet.pod("dp").url, timeout=10) as c:
            for i in range(50):
                body = {**PROMPT, "prompt": f"batch {i} " + PROMPT["prompt"]}
                r = await c.post("/v1/completions", json=body, headers={"x-data-parallel-rank": "1"})
                assert r.status_code == 200
                if await sub.poll(200):
                    frames = await sub.recv_multipart()
                    break
        assert frames is not None, "no KV event batch from rank 1"
        batch = msgpack.unpackb(frames[2])
        assert batch["data_parallel_rank"] == 1 and batch["events"]
    finally:
        sub.close(linger=0)
        ctx.destroy(linger=0)


def test_data_parallel_size_is_validated() -> None:
    with pytest.raises(SpecError, match="data_parallel_size"):
        FleetSpec.from_dict({"pods": [{"model": "m", "data_parallel_size": 0}]})
