"""The scheduler seam: request + pool snapshot in, ranked endpoints out."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Protocol

from epp.pool import PoolSnapshot
from epp.request import InferenceRequest


@dataclass(frozen=True, slots=True)
class Decision:
    """Endpoints best first. Empty `ranked` means no endpoint can serve the request.

    `scores` (address -> {scorer: value, "total": value}) explains the choice; `reason` says
    why a request was refused when `ranked` is empty; `saturated` tells admission that every
    candidate is over its thresholds.
    """

    ranked: tuple[str, ...]
    scores: dict[str, dict[str, float]] = field(default_factory=dict)
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
