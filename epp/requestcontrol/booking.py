"""One routed request's booking: everything the EPP records at a pick, released in one place.

A pick is recorded by four owners: the pool (the pod's in-flight count and its ledger entry,
epp/datalayer/pool.py), the scheduler (the request's prefix and adapter on the pod, its learned
indexes), the data-parallel ranks (the rank pinned on the pod, epp/requestcontrol/dp_ranks.py)
and, for a disaggregated request, the pool and the scheduler again for its prefill pod. A
`Booking` makes those records (`book`), moves them when a retry lands on another pod (`move`),
releases the prefill pod's once its prefill is over (`release_prefill`) and releases all of
them exactly once (`release`), whatever ends the stream. The scheduler's lifecycle hooks
(its plugins', epp/scheduling/plugins/base.py) go out from here: routed (`book`, `move`),
first token (`responded`), finished or aborted (`release`). The processor keeps only the request's
protocol state.

The scheduler is the context's current one at each step (a configuration reload replaces it;
the learned indexes carry over), as are the pool and the ranks.
"""

from __future__ import annotations

import math

from epp.datalayer.ledger import Commitment
from epp.requestcontrol.context import EppContext
from epp.scheduling.decision import Decision
from epp.scheduling.request import InferenceRequest


class Booking:
    def __init__(self, ctx: EppContext, request: InferenceRequest, address: str) -> None:
        self._ctx = ctx
        self.request = request
        self.address = address  # the pod it is booked on now (a retry may move it)
        self.routed_at = self.counted_at = ctx.pool.clock()  # counted_at: on its current pod
        self._commitment: Commitment | None = None  # its entry in the pod's ledger
        self.rank: int | None = None  # the data-parallel rank pinned on the pod
        self._rank_pod: str | None = None
        self.prefill_address: str | None = None  # a disaggregated request's prefill pod
        self._prefill_commitment: Commitment | None = None
        self.released = False

    @classmethod
    def book(cls, ctx: EppContext, request: InferenceRequest, decision: Decision) -> Booking:
        """Record the decision's best pod (and its prefill pod) for `request`."""
        booking = cls(ctx, request, decision.ranked[0])
        booking._commitment = ctx.pool.on_routed(
            booking.address, request.estimated_tokens, decision.prefill_s, now=booking.routed_at
        )
        ctx.scheduler.on_routed(request, booking.address)
        return booking

    def pin_rank(self, data_parallel_size: int) -> int:
        """Pin a data-parallel rank of the pod (one with more than one); returns it."""
        rank, hashes = self._ctx.ranks.pick(self.request, self.address, data_parallel_size)
        self._ctx.ranks.on_routed(self.address, rank, hashes)
        self.rank, self._rank_pod = rank, self.address
        return rank

    def book_prefill(self, prefill: str) -> None:
        """Hold an in-flight slot on the prefill pod too, until its prefill is over."""
        self.prefill_address = prefill
        self._prefill_commitment = self._ctx.pool.on_routed(
            prefill, self.request.prompt_tokens, now=self.routed_at
        )
        self._ctx.scheduler.on_routed(self.request, prefill)  # its prefix is cached there now

    def release_prefill(self) -> None:
        """The prefill pod's slot, once: at the decode pod's response headers (the sidecar calls
        the decode engine only after the prefill answered), or at the release."""
        if self.prefill_address is None:
            return
        self._ctx.pool.on_finished(
            self.prefill_address,
            self.request.prompt_tokens,
            routed_at=self.routed_at,
            commitment=self._prefill_commitment,
        )
        self._ctx.scheduler.on_finished(self.request, self.prefill_address)
        self.prefill_address = self._prefill_commitment = None

    def move(self, served: str) -> None:
        """A retry moved the request to another endpoint of the ranked list: account it there."""
        if self.released or served == self.address:
            return
        self._commitment = self._ctx.pool.move_inflight(
            self.address,
            served,
            self.request.estimated_tokens,
            routed_at=self.counted_at,
            commitment=self._commitment,
        )
        self._ctx.scheduler.on_aborted(self.request, self.address)
        self._ctx.scheduler.on_routed(self.request, served)  # it runs (and caches) there
        self.address, self.counted_at = served, -math.inf  # not routed since `served`'s scrape

    def responded(self, status: int) -> None:
        """The pod began its response (its headers: the first the EPP sees of it); a 5xx is no
        first token (the request ends aborted)."""
        if status < 500 and not self.released:
            self._ctx.scheduler.on_first_token(self.request, self.address)

    def release(self, aborted: bool = False) -> bool:
        """Every record, exactly once; False when already released. `aborted`: the request
        ended without a response (the scheduler's plugins hear `on_aborted`, not `on_finished`)."""
        if self.released:
            return False
        self.released = True
        if self._rank_pod is not None and self.rank is not None:
            self._ctx.ranks.on_finished(self._rank_pod, self.rank)
            self._rank_pod = None
        self.release_prefill()
        self._ctx.pool.on_finished(
            self.address,
            self.request.estimated_tokens,
            routed_at=self.counted_at,
            commitment=self._commitment,
        )
        if aborted:
            self._ctx.scheduler.on_aborted(self.request, self.address)
        else:
            self._ctx.scheduler.on_finished(self.request, self.address)
        self._commitment = None
        return True
