"""The other EPP replicas' load on each pod of a pool, as the shared-state loop
(epp/datalayer/shared_state.py) reports it: their in-flight counts, replaced wholesale at each
round trip and raised by their pushed picks between round trips, and the prefill seconds their
picks queued that no page shows yet. Empty when replicas do not share state or Redis is down.
`Pool.snapshot` adds it to this replica's own figures."""

from __future__ import annotations

from collections.abc import Mapping


class PeerLoad:
    """Per pod: the peers' (requests, tokens) in flight and when their pending prefills end."""

    def __init__(self) -> None:
        self.inflight: dict[str, tuple[int, int]] = {}
        # Their pending prefills the pages do not show yet, per pod, as the monotonic time they
        # are projected to end (from their `busy_since_s`, when received).
        self.busy_until: dict[str, float] = {}
        self.busy_known = False  # the peers publish it (else their unseen picks are counted)

    def set_inflight(self, counts: Mapping[str, tuple[int, int]]) -> None:
        self.inflight = dict(counts)

    def add_pick(self, address: str, prefill_s: float, tokens: int, now: float) -> None:
        """A peer's pick, pushed as it was made: one more request in flight on the pod and its
        predicted prefill queued behind the others' (chained, as the ledger chains its own),
        until the next round trip replaces the peers' totals."""
        requests, held = self.inflight.get(address, (0, 0))
        self.inflight[address] = (requests + 1, held + tokens)
        if prefill_s > 0.0:
            until = self.busy_until.get(address, now)
            self.busy_until[address] = (until if until > now else now) + prefill_s
        self.busy_known = True

    def set_busy(self, seconds: Mapping[str, float], now: float) -> None:
        """Their projected prefill seconds ahead of each pod that no page shows yet, summed."""
        self.busy_until = {a: now + s for a, s in seconds.items() if s > 0.0}
        self.busy_known = True
