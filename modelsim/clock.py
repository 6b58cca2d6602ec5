"""Simulated time: wall-clock seconds on the event loop multiplied by ``time_scale``."""

from __future__ import annotations

import asyncio


class SimClock:
    def __init__(self, time_scale: float = 1.0) -> None:
        if not time_scale > 0:
            raise ValueError("time_scale must be > 0")
        self.time_scale = time_scale
        self._loop = asyncio.get_running_loop()
        self._t0 = self._loop.time()

    def now(self) -> float:
        """Simulated seconds since the clock started."""
        return (self._loop.time() - self._t0) * self.time_scale

    async def sleep_until(self, sim_t: float) -> None:
        delay = (sim_t - self.now()) / self.time_scale
        await asyncio.sleep(max(0.0, delay))

    async def sleep(self, sim_s: float) -> None:
        await asyncio.sleep(max(0.0, sim_s) / self.time_scale)
