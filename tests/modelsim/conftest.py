"""Shared fixtures: a small fleet running much faster than real time."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from modelsim.fleet import Fleet, FleetSpec, run_fleet

FAST = 50.0


@pytest.fixture
async def fleet() -> AsyncIterator[Fleet]:
    spec = FleetSpec.from_dict(
        {
            "time_scale": FAST,
            "pods": [
                {
                    "name": "llama-0",
                    "model": "llama",
                    "adapters": ["llama-sql"],
                    "profile": "h100-llama3.1-8b",
                },
                {"name": "qwen", "model": "qwen", "profile": "h100x2-qwen3-32b", "dialect": "sglang"},
                {"name": "tgi", "model": "tgi-model", "dialect": "tgi"},
                {"name": "trt", "model": "trt-model", "dialect": "trtllm"},
            ],
        }
    )
    async with run_fleet(spec) as f:
        yield f


@pytest.fixture
async def client(fleet: Fleet) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=fleet.pod("llama-0").url, timeout=10) as c:
        yield c
