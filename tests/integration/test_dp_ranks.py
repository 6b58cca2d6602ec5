"""Data-parallel pods through the real Envoy: the EPP pins `X-data-parallel-rank`, so each
prompt goes back to the rank of the pod whose cache holds it (vLLM's own balancing would
spread them by queue length alone)."""

from __future__ import annotations

import ssl
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from devstack.launch import LocalGateway, start_local_gateway

MODEL = "llama-3.1-8b-instruct"
FLEET = {
    "time_scale": 10.0,
    "pods": [{"name": "dp", "model": MODEL, "profile": "h100-llama3.1-8b", "data_parallel_size": 2}],
}


def two_ranks(config: dict[str, Any]) -> None:
    for endpoint in config["pools"][0]["endpoints"]:
        endpoint["dataParallelSize"] = 2


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalGateway]:
    gw = start_local_gateway(
        tmp_path_factory.mktemp("dp"), fleet=FLEET, config_patch=two_ranks, single_hop=True
    )
    try:
        yield gw
    finally:
        gw.stop()


def test_each_prompt_returns_to_the_rank_that_cached_it(gw: LocalGateway) -> None:
    pod = gw.pods[0]["address"]
    prompts = [
        f"document {name}: " + f"the {name} report says many things " * 150 for name in ("alpha", "beta")
    ]
    with httpx.Client(
        base_url=gw.url, verify=ssl.create_default_context(cafile=gw.certs.ca), timeout=30
    ) as c:
        for _ in range(3):
            for prompt in prompts:
                body = {"model": MODEL, "messages": [{"role": "user", "content": prompt}], "max_tokens": 2}
                r = c.post("/v1/chat/completions", json=body)
                assert r.status_code == 200, r.text
                assert r.json()["usage"]["prompt_tokens_details"]["cached_tokens"] >= 0
    ranks = httpx.get(f"http://{pod}/sim/state", timeout=5).json()["ranks"]
    assert [r["ttft_count"] for r in ranks] == [3, 3]  # one prompt per rank, every time
    page = httpx.get(f"http://{pod}/metrics", timeout=5).text
    hits = [line for line in page.splitlines() if line.startswith("vllm:prefix_cache_hits_total")]
    assert len(hits) == 2 and all(float(line.rsplit(" ", 1)[1]) > 0 for line in hits)
