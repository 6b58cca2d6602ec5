"""The Redis-backed limiter: exact across concurrent replicas, tokens, Redis outages."""

from __future__ import annotations

import asyncio

import pytest

from devstack.launch import free_port
from globalrouter.config import RateLimits
from globalrouter.ratelimit import RateLimiter


def limits(redis_url: str, prefix: str, **extra: object) -> RateLimits:
    return RateLimits.model_validate(
        {
            "redis_url": redis_url,
            "window_s": 60,
            "key_prefix": prefix,
            "tenants": {"t": {"requests": 50, "tokens": 100}},
            "timeout_s": 5.0,  # a loaded machine must not turn Redis round trips into fail-open
            **extra,
        }
    )


async def test_two_replicas_racing_admit_exactly_the_limit(redis_url: str) -> None:
    replicas = [RateLimiter(limits(redis_url, "race")) for _ in range(2)]
    try:
        verdicts = await asyncio.gather(*(replicas[i % 2].admit("t") for i in range(120)))
    finally:
        for r in replicas:
            await r.close()
    admitted = [v for v in verdicts if v.admitted]
    assert len(admitted) == 50
    refused = [v for v in verdicts if not v.admitted]
    assert {v.refused_by for v in refused} == {"requests"}
    assert all(1 <= v.retry_after_s <= 60 for v in refused)


async def test_token_budget_refuses_once_spent(redis_url: str) -> None:
    limiter = RateLimiter(limits(redis_url, "tok"))
    try:
        assert (await limiter.admit("t")).admitted
        await limiter.charge_tokens("t", 60)
        assert (await limiter.admit("t")).admitted  # 60 < 100
        await limiter.charge_tokens("t", 60)
        verdict = await limiter.admit("t")
        assert not verdict.admitted and verdict.refused_by == "tokens"
        assert await limiter.used("t") == (2, 120)
    finally:
        await limiter.close()


async def test_unlimited_tenants_never_touch_redis(redis_url: str) -> None:
    limiter = RateLimiter(limits(redis_url, "free"))
    try:
        assert all([(await limiter.admit("someone-else")).admitted for _ in range(100)])
        assert await limiter.used("someone-else") == (0, 0)
    finally:
        await limiter.close()


async def test_window_slides(redis_url: str) -> None:
    cfg = limits(redis_url, "slide", window_s=1.0, buckets=4, tenants={"t": {"requests": 3}})
    limiter = RateLimiter(cfg)
    try:
        assert [(await limiter.admit("t")).admitted for _ in range(4)] == [True, True, True, False]
        await asyncio.sleep(1.3)
        assert (await limiter.admit("t")).admitted
    finally:
        await limiter.close()


@pytest.mark.parametrize("fail_open", [True, False])
async def test_redis_down_follows_fail_open(fail_open: bool) -> None:
    cfg = limits(f"redis://127.0.0.1:{free_port()}/0", "down", fail_open=fail_open, timeout_s=0.2)
    limiter = RateLimiter(cfg)
    try:
        verdict = await asyncio.wait_for(limiter.admit("t"), 5)
        assert verdict.admitted is fail_open and verdict.degraded
        await limiter.charge_tokens("t", 10)  # must not raise
    finally:
        await limiter.close()
