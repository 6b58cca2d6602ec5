"""The scheduler seam: request + pool snapshot in, ranked endpoints out."""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from epp.pool import PoolSnapshot
from epp.request import InferenceRequest


class ScoreTable(Mapping[str, Mapping[str, float]]):
    """address -> {scorer: value, ..., "total": value}, each row built only when read.

    A decision at 1,000 pods would otherwise build 1,000 dicts per request that nobody reads
    unless the client asked for the decision header; the servicer reads only the chosen
    pod's row, which `first` finds without indexing the table.
    """

    __slots__ = ("_addresses", "_columns", "_first", "_index", "_totals")

    def __init__(
        self,
        addresses: Sequence[str],
        columns: Sequence[tuple[str, Sequence[float]]],
        totals: Sequence[float],
        first: int = 0,
    ) -> None:
        self._addresses, self._columns, self._totals, self._first = addresses, columns, totals, first
        self._index: dict[str, int] | None = None

    def _position(self, address: str) -> int:
        first = self._first
        if first < len(self._addresses) and self._addresses[first] == address:
            return first
        if self._index is None:
            self._index = {a: i for i, a in enumerate(self._addresses)}
        return self._index[address]  # KeyError for an unknown address, as a dict would

    def __getitem__(self, address: str) -> dict[str, float]:
        i = self._position(address)
        row = {name: values[i] for name, values in self._columns}
        row["total"] = self._totals[i]
        return row

    def __iter__(self) -> Iterator[str]:
        return iter(self._addresses)

    def __len__(self) -> int:
        return len(self._addresses)

    def __repr__(self) -> str:
        return f"ScoreTable({dict(self)!r})"


@dataclass(frozen=True, slots=True)
class Decision:
    """Endpoints best first. Empty `ranked` means no endpoint can serve the request.

    `scores` (address -> {scorer: value, "total": value}) explains the choice; `reason` says
    why a request was refused when `ranked` is empty; `saturated` tells admission that every
    candidate is over its thresholds.
    """

    ranked: tuple[str, ...]
    scores: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    profile: str = "default"
    reason: str = ""
    saturated: bool = False


class Scheduler(Protocol):
    def pick(self, request: InferenceRequest, snapshot: PoolSnapshot) -> Decision: ...

    def on_routed(self, request: InferenceRequest, address: str) -> None:
        """Learn from a routing decision (e.g. remember its prefix on that pod)."""
        ...


class RoundRobinScheduler:
    """Rotate over the endpoints that serve the model. Baseline and fallback policy."""

    def __init__(self) -> None:
        self._counter = itertools.count()

    def pick(self, request: InferenceRequest, snapshot: PoolSnapshot) -> Decision:
        candidates = [
            s.address
            for s in snapshot.endpoints
            if s.healthy and s.endpoint.serves(request.target_model, request.adapter)
        ]
        if not candidates:
            return Decision(ranked=(), profile="round-robin", reason="no endpoint serves this model")
        start = next(self._counter) % len(candidates)
        ranked = tuple(candidates[start:] + candidates[:start])
        return Decision(ranked=ranked, profile="round-robin")

    def on_routed(self, request: InferenceRequest, address: str) -> None:
        return None
