"""The scheduler seam: request + pool snapshot in, ranked endpoints out."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from epp.datalayer.endpoint_records import PoolSnapshot
from epp.scheduling.request import InferenceRequest


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


class PredictedTtft(Mapping[str, float]):
    """address -> its predicted seconds to this request's first token (the prediction's
    `TtftTerms.total_s`), read only for the decision header: nothing is built per decision."""

    __slots__ = ("_addresses", "_index", "_terms")

    def __init__(self, addresses: Sequence[str], terms: Sequence[object]) -> None:
        self._addresses, self._terms = addresses, terms
        self._index: dict[str, int] | None = None

    def __getitem__(self, address: str) -> float:
        if self._index is None:
            self._index = {a: i for i, a in enumerate(self._addresses)}
        terms = self._terms[self._index[address]]
        if terms is None:
            raise KeyError(address)
        return float(terms.total_s)  # type: ignore[attr-defined]

    def __iter__(self) -> Iterator[str]:
        return (a for a, t in zip(self._addresses, self._terms, strict=True) if t is not None)

    def __len__(self) -> int:
        return sum(1 for t in self._terms if t is not None)


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
    # The predicted seconds of the request's own prefill on ranked[0] (0: not predicted), which
    # the pick commits to that pod's ledger.
    prefill_s: float = 0.0
    # Disaggregated serving (epp/scheduling/disaggregation.py): the pod that prefills for ranked[0], the
    # decode pod; None: ranked[0] does both.
    prefill: str | None = None
    # A request with a latency objective (epp/scheduling/slo.py): whether ranked[0] is predicted
    # to meet it (True), none of the pods is (False); None: no objective.
    slo_met: bool | None = None
    # Each candidate's predicted time to first token, when the profile predicted it.
    predicted: Mapping[str, float] | None = None
    # ranked[0] is saturated but holds most of the prompt (epp/scheduling/filters.py
    # `unsaturated`, `holders`): the best place is where its history is, once it has room.
    # With flow control the request waits for that in the EPP's queue rather than joining
    # the full pod (where its prompt would take KV the running decodes grow into).
    hold: bool = False

    @property
    def waits(self) -> bool:
        """With flow control, the request waits in the EPP's queue: every candidate is saturated,
        or the best one is its saturated home (`hold`)."""
        return self.saturated or self.hold


class Scheduler(Protocol):
    def pick(self, request: InferenceRequest, snapshot: PoolSnapshot) -> Decision: ...

    def on_routed(self, request: InferenceRequest, address: str) -> None:
        """Learn from a routing decision (e.g. remember its prefix on that pod)."""
        ...

    def on_first_token(self, request: InferenceRequest, address: str) -> None:
        """The pod at `address` began the request's response."""
        ...

    def on_finished(self, request: InferenceRequest, address: str) -> None:
        """The request routed to `address` (`on_routed`) ended there; once per `on_routed`, or
        `on_aborted` instead."""
        ...

    def on_aborted(self, request: InferenceRequest, address: str) -> None:
        """The request routed to `address` ended there without a response."""
        ...

    def wants_tokens(self, request: InferenceRequest) -> bool:
        """Does picking for this request read its token ids (worth tokenizing it first)?"""
        ...
