"""The work this EPP committed to one pod, exact for its own picks, between two scrapes too.

A scrape is a photograph taken up to an interval ago; between two of them the EPP used to know a
pod as that page plus a count of what it routed since. Burst picks then clumped: a pod that was
sent a request read as "one more queued" until the next page, however short that request's
prefill, and a 4,000-token prompt counted the same as a 50-token one. The ledger instead keeps
one `Commitment` per pick, from the pick to the end of its response:

- its prefill: the seconds the picking scorer predicted for this request's own uncached tokens
  on this pod (`prefill_s`), chained FIFO behind the pod's earlier pending prefills (vLLM admits
  first come, first served), so the pod reads busy exactly until its projected prefills end
  (`busy_s`);
- its KV tokens (prompt + expected output), so admission and flow control can count what is
  committed and not yet on the page (`unseen_kv_tokens`).

Every scrape reconciles it with the pod's truth at the moment the scrape was sent: the first
tokens the pod produced since the last scrape (its TTFT histogram's count) retire that many of the
oldest pending prefills (this EPP's share of them when other replicas route too), the projection
restarts from the scrape instant, and what the page shows waiting beyond this EPP's own pending
picks is other traffic (`foreign_waiting`: other replicas, clients that bypass the gateway).
Without a first-token count (engines without the histogram) a pick counts as started once the
page's waiting count no longer holds it.

Pure bookkeeping: no clock of its own (every call takes `now`), no I/O. `Pool` owns one per pod.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass

# A pick routed this shortly before a scrape was sent may not have reached the pod when the page
# was rendered (Envoy forwards it after the EPP's reply): the page is no evidence about it yet.
TRANSIT_S = 0.003
# A pick shown waiting this long past its projected start is not waiting for the step in
# progress (a decode step of a full batch is tens of milliseconds) but for room on the pod.
STEP_SLACK_S = 0.05


@dataclass(slots=True)
class Commitment:
    """One pick on one pod, from the pick to the end of its response."""

    key: int
    routed_at: float  # monotonic
    prefill_s: float  # predicted seconds of its own prefill on the pod (0: not predicted)
    kv_tokens: int  # prompt + expected output
    prefilled: bool = False  # its first token was produced (or the pod no longer shows it waiting)
    # When its prefill is projected to end (FIFO behind the pod's earlier pending ones); a pick
    # without a predicted prefill has none and stays pending until a page retires it.
    ends_at: float = float("inf")
    in_projection: bool = False  # counted in the ledger's projection (its deque), not yet expired


class PodLedger:
    """One pod's commitments (insertion order = pick order) and the projection of its prefills."""

    __slots__ = (
        "_busy_until",
        "_dead",
        "_entries",
        "_last_routed",
        "_next_key",
        "_pending",
        "_projection",
        "_stuck",
        "first_tokens",
        "foreign_waiting",
    )

    def __init__(self) -> None:
        self._entries: OrderedDict[int, Commitment] = OrderedDict()
        self._last_routed = -1e300  # the newest pick's time: no pick is newer than this
        self._next_key = 0
        self._pending = 0  # entries not prefilled
        self._stuck = 0  # of those, with no projected end
        # The projected ones in chain order (their ends rise along it), so `pending(now)` drops
        # the expired ones from the left instead of scanning every commitment per decision;
        # `_dead` counts the ones in it that left the projection since (released, retired).
        self._projection: deque[Commitment] = deque()
        self._dead = 0
        self._busy_until = -1e300  # monotonic time the projected pending prefills end
        # Waiting requests on the last page that are not this EPP's pending picks.
        self.foreign_waiting = 0.0
        self.first_tokens: float | None = None  # the pod's cumulative first-token count, last page

    # -- picks and their ends ---------------------------------------------------------
    def commit(self, now: float, prefill_s: float, kv_tokens: int) -> Commitment:
        """Record a pick: its prefill starts when the pod's earlier pending ones end."""
        key = self._next_key
        self._next_key += 1
        c = Commitment(key, now, prefill_s if prefill_s > 0.0 else 0.0, kv_tokens)
        self._entries[key] = c
        if now > self._last_routed:
            self._last_routed = now
        self._pending += 1
        start = self._busy_until if self._busy_until > now else now
        self._busy_until = start + c.prefill_s
        if c.prefill_s > 0.0:
            c.ends_at = self._busy_until
            c.in_projection = True
            self._projection.append(c)
        else:
            self._stuck += 1
        return c

    def _settle(self, c: Commitment) -> None:
        """`c` (pending) stops counting as pending: retired by a page or released."""
        if c.ends_at == float("inf"):
            self._stuck -= 1
        elif c.in_projection:
            c.in_projection = False
            self._dead += 1

    def release(self, commitment: Commitment | None) -> None:
        """The request ended (completed, reset, aborted, moved): drop its commitment. Without
        a handle (callers that never had one) the oldest commitment goes."""
        entries = self._entries
        if commitment is None:
            if not entries:
                return
            commitment = next(iter(entries.values()))
        if entries.pop(commitment.key, None) is not None and not commitment.prefilled:
            self._pending -= 1
            self._settle(commitment)
            # Its prefill no longer occupies the pod; the projection of the others stays (an
            # aborted request's prefill may have run already: the next scrape re-anchors it).
            if self._pending == 0:
                self._busy_until = -1e300

    # -- the pod's own word -----------------------------------------------------------
    def reconcile(
        self,
        sent_at: float,
        waiting: float | None,
        first_tokens: float | None,
        own_share: float,
        transit_s: float = TRANSIT_S,
    ) -> None:
        """A scrape sent at `sent_at` showed `waiting` requests and `first_tokens` produced in
        all: retire the prefills that ended, restart the projection from `sent_at`. Picks routed
        less than `transit_s` before it may not be on the page yet."""
        seen = [c for c in self._entries.values() if not c.prefilled and c.routed_at <= sent_at - transit_s]
        done: float | None = None
        if first_tokens is not None and self.first_tokens is not None and first_tokens >= self.first_tokens:
            done = (first_tokens - self.first_tokens) * (own_share if 0.0 <= own_share <= 1.0 else 1.0)
        if first_tokens is not None:
            self.first_tokens = first_tokens
        retire = 0
        if done is not None:
            retire = min(len(seen), int(done + 0.5))
        if done is None and waiting is not None and len(seen) - retire > waiting:
            retire = len(seen) - int(waiting)  # the page shows fewer waiting than are pending
        for c in seen[:retire]:
            self._settle(c)
            c.prefilled = True
        self._pending -= retire
        # Pending picks beyond the page's waiting count are prefilling (the engine counts a
        # request as waiting until its prefill starts, and produced no first token for it
        # yet): they keep their projection, restarted from the scrape instant.
        prefilling = max(len(seen) - retire - (int(waiting) if waiting is not None else 0), 0)
        started = set()
        for c in seen[retire : retire + prefilling]:
            started.add(c.key)
            if c.ends_at == float("inf") and c.prefill_s > 0.0:
                # Shown waiting before (stuck), prefilling now: it started since the last page.
                self._stuck -= 1
                c.ends_at = sent_at + c.prefill_s
        for c in seen[retire + prefilling :]:
            # The page shows it waiting. Behind the pod's earlier pending prefills, or for the
            # step in progress, that is what its projection says; past its projected start (by
            # more than a step) the pod had no room for it (a sequence limit, full KV, every LoRA
            # slot pinned), so no projection says when it starts. It stays pending until a page
            # retires it and counts as waiting (`stuck`), not in `busy_s`.
            if c.ends_at - c.prefill_s > sent_at - STEP_SLACK_S:
                continue
            if c.ends_at != float("inf"):
                self._settle(c)
                c.ends_at = float("inf")
                self._stuck += 1
        still_seen = len(seen) - retire
        self.foreign_waiting = max(0.0, waiting - still_seen) if waiting is not None else 0.0
        self._reproject(sent_at, started)

    def _reproject(self, start: float, started: set[int]) -> None:
        """Chain the pending prefills from `start`; the `started` ones (prefilling when the page
        was rendered) keep their projected end, at least `start`: restarting them there would
        price a 300 ms prefill that began 250 ms ago as 300 ms still ahead."""
        t, projection = start, deque[Commitment]()
        for c in self._entries.values():
            if not c.prefilled and c.prefill_s > 0.0 and c.ends_at != float("inf"):
                if c.key in started:
                    t = c.ends_at if c.ends_at > t else t
                else:
                    t = (t if t > c.routed_at else c.routed_at) + c.prefill_s
                c.ends_at = t
                c.in_projection = True
                projection.append(c)
        self._projection, self._dead = projection, 0
        self._busy_until = t if projection else -1e300

    # -- what scheduling reads ----------------------------------------------------------
    def busy_s(self, now: float) -> float:
        """Seconds until this EPP's pending prefills on the pod are projected to end."""
        left = self._busy_until - now
        return left if left > 0.0 else 0.0

    def pending(self, now: float) -> int:
        """This EPP's picks whose prefill has not ended: not retired by a page and not projected
        to have ended by `now` (picks without a predicted prefill wait for a page). `now` never
        goes back between calls (an expired projection is dropped until the next page)."""
        projection = self._projection
        while projection and (not projection[0].in_projection or projection[0].ends_at <= now):
            c = projection.popleft()
            if c.in_projection:
                c.in_projection = False  # expired
            else:
                self._dead -= 1
        return self._stuck + len(projection) - self._dead

    @property
    def last_routed(self) -> float:
        """When this EPP last picked the pod (monotonic; -1e300: never): near-equal pods rotate
        by it (epp/scheduling/picker.py)."""
        return self._last_routed

    def stuck(self) -> int:
        """Pending picks with no projected end: the page showed them waiting, or their prefill
        was not predicted. Scheduling prices them as queued requests of a typical size."""
        return self._stuck

    def unseen_since(self, now: float, since: float) -> tuple[int, int]:
        """(of `pending(now)`, the picks routed after `since`; the KV tokens of every pick routed
        after `since` and still in flight): what the last page, sent at `since`, cannot show yet.
        One walk from the newest pick, since the pool's snapshot reads both for every pod at
        every decision."""
        if self._last_routed <= since:
            return 0, 0  # no pick since the page: most pods at most decisions
        pending = tokens = 0
        for c in reversed(self._entries.values()):
            if c.routed_at <= since:
                break
            tokens += c.kv_tokens
            if not c.prefilled and c.ends_at > now:
                pending += 1
        return pending, tokens

    def busy_since_s(self, now: float, since: float) -> float:
        """The projected prefill seconds still ahead of the pod for the pending picks routed after
        `since` (the last page's send time): the part of `busy_s` no page shows yet, which the
        other replicas price exactly (epp/datalayer/shared_state.py) instead of counting requests."""
        total = 0.0
        for c in reversed(self._entries.values()):
            if c.routed_at <= since:
                break
            if not c.prefilled and c.prefill_s > 0.0 and c.ends_at > now:
                left = c.ends_at - now
                total += left if left < c.prefill_s else c.prefill_s
        return total

    def __len__(self) -> int:
        """This EPP's picks in flight on the pod."""
        return len(self._entries)

    def unseen(self, since: float) -> int:
        """Picks routed after `since` (the last scrape's send time) and still in flight."""
        n = 0
        for c in reversed(self._entries.values()):
            if c.routed_at <= since:
                break
            n += 1
        return n
