"""Waiting for a condition in async tests: poll with a generous deadline, never sleep blindly."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable


async def until(cond: Callable[[], bool], what: str, within: float = 30.0) -> None:
    """Return once `cond()` holds; AssertionError naming `what` after `within` seconds."""
    deadline = time.monotonic() + within
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


async def until_awaited(check: Callable[[], Awaitable[bool]], what: str, within: float = 30.0) -> None:
    """`until` for a check that must itself await (an HTTP read of a service's state)."""
    deadline = time.monotonic() + within
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)
