"""The EPP's flow-control queue as pure data: which waiting request goes next. No I/O, no clock.

Order of dispatch:
- bands strictly by priority: every critical request before any standard one, every standard
  before any sheddable one;
- within a band, fair share across tenants: the tenants with waiting requests take turns, one
  request each (round robin), so a heavy tenant cannot take more than an equal share from a
  light one while both wait, and gets all the rest when the light one stops;
- within a tenant, first come first served (`fcfs`) or earliest deadline first (`edf`).

Each band holds at most its own `max_queue` requests; `push` says False when it is full.
"""

from __future__ import annotations

import bisect
import itertools
from collections import deque
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

BANDS = ("critical", "standard", "sheddable")  # dispatch order
Ordering = Literal["fcfs", "edf"]


def band_of(priority: int) -> str:
    """The objective's priority -> band: > 0 critical, 0 standard, < 0 sheddable."""
    return "critical" if priority > 0 else "standard" if priority == 0 else "sheddable"


@dataclass(eq=False, slots=True)
class Waiting:
    """One queued request. `deadline`: what `edf` orders by (a monotonic time, the caller's): when
    it stops waiting, or earlier, when its latency objective runs out."""

    band: str
    tenant: str
    arrived: float
    deadline: float
    payload: Any = None  # whatever the caller needs to dispatch it
    seq: int = 0  # set by the queue: ties broken by arrival
    key: tuple[float, int] = field(default=(0.0, 0))


class _Band:
    __slots__ = ("size", "tenants", "turns")

    def __init__(self) -> None:
        self.tenants: dict[str, list[Waiting]] = {}  # each sorted by key
        self.turns: deque[str] = deque()  # tenants with waiting requests, next turn first
        self.size = 0


class FlowQueue:
    def __init__(self, max_queue: Mapping[str, int], ordering: Ordering = "fcfs") -> None:
        unknown = set(max_queue) - set(BANDS)
        if unknown:
            raise ValueError(f"unknown band(s): {sorted(unknown)}")
        self.max_queue = {band: max_queue.get(band, 0) for band in BANDS}
        self.ordering = ordering
        self._bands = {band: _Band() for band in BANDS}
        self._seq = itertools.count()

    def push(self, item: Waiting) -> bool:
        """Queue `item`; False (and nothing queued) when its band is full."""
        band = self._bands[item.band]
        if band.size >= self.max_queue[item.band]:
            return False
        item.seq = next(self._seq)
        item.key = (item.deadline if self.ordering == "edf" else item.arrived, item.seq)
        line = band.tenants.get(item.tenant)
        if line is None:
            line = band.tenants[item.tenant] = []
            band.turns.append(item.tenant)
        bisect.insort(line, item, key=lambda w: w.key)
        band.size += 1
        return True

    def peek(self) -> Waiting | None:
        """The request that goes next, left in the queue."""
        for name in BANDS:
            band = self._bands[name]
            if band.turns:
                return band.tenants[band.turns[0]][0]
        return None

    def pop(self) -> Waiting | None:
        """Take the next request; its tenant's turn passes to the next tenant."""
        item = self.peek()
        if item is not None:
            self.remove(item, served=True)
        return item

    def remove(self, item: Waiting, *, served: bool = False) -> bool:
        """Take `item` out wherever it is; False if it is not queued. `served`: it was
        dispatched, so its tenant's turn is used up (a timeout or a departed client uses none)."""
        band = self._bands[item.band]
        line = band.tenants.get(item.tenant)
        if line is None:
            return False
        i = bisect.bisect_left(line, item.key, key=lambda w: w.key)
        if i >= len(line) or line[i] is not item:
            return False
        del line[i]
        band.size -= 1
        if not line:
            del band.tenants[item.tenant]
            band.turns.remove(item.tenant)
        elif served and band.turns[0] == item.tenant:
            band.turns.rotate(-1)
        return True

    def waiting_ahead(self, band: str) -> bool:
        """Whether a request of this band or a higher one is waiting (a new arrival queues behind)."""
        for name in BANDS:
            if self._bands[name].size:
                return True
            if name == band:
                return False
        return False

    def length(self, band: str, tenant: str | None = None) -> int:
        b = self._bands[band]
        if tenant is None:
            return b.size
        return len(b.tenants.get(tenant, ()))

    def __len__(self) -> int:
        return sum(b.size for b in self._bands.values())

    def __iter__(self) -> Iterator[Waiting]:
        for b in self._bands.values():
            for line in b.tenants.values():
                yield from line
