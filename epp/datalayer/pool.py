"""`Pool`: the one mutable owner of a pool's live state, updated by the edges (discovery,
scraper, ext_proc servicer, shared state) and read by scheduling as an immutable `PoolSnapshot`
(the records are in epp/datalayer/endpoint_records.py). One asyncio loop per process owns a
`Pool`: no locks. Each pod's record holds its in-flight accounting, its ledger and its speeds
(epp/datalayer/pod_speeds.py); the other replicas' load is epp/datalayer/peer_load.py's.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from epp.datalayer.endpoint_records import Endpoint, EndpointState, Metrics, PoolSnapshot
from epp.datalayer.ledger import TRANSIT_S, Commitment, PodLedger
from epp.datalayer.peer_load import PeerLoad
from epp.datalayer.pod_speeds import DEFAULT_SPEED_HALF_LIFE_S, SPEED_EXPIRY_HALF_LIVES, PodSpeeds

_NO_REMOTE = (0, 0)  # a pod no other replica has requests on


@dataclass(slots=True)
class _Live:
    """One pod's live record."""

    endpoint: Endpoint
    metrics: Metrics | None = None
    inflight_requests: int = 0
    inflight_tokens: int = 0
    finished_since_scrape: int = 0
    routed_since_scrape: int = 0  # this EPP's, still in flight (EndpointState)
    scrape_seen_at: float = -math.inf  # monotonic time the last scrape was recorded
    scrape_sent_at: float = -math.inf  # monotonic time the last recorded scrape was sent
    ledger: PodLedger = field(default_factory=PodLedger)
    speeds: PodSpeeds = field(default_factory=PodSpeeds)
    failures: int = 0

    def count_out(self, tokens: int, routed_at: float | None, commitment: Commitment | None) -> None:
        """A request leaves the pod's accounting (finished there, or moved away by a retry)."""
        self.inflight_requests = max(0, self.inflight_requests - 1)
        self.inflight_tokens = max(0, self.inflight_tokens - tokens)
        # Without `routed_at` the request is taken as routed since the scrape: the count only
        # errs low then, and every scrape resets it.
        if self.routed_since_scrape > 0 and (routed_at is None or routed_at > self.scrape_seen_at):
            self.routed_since_scrape -= 1
        self.ledger.release(commitment)

    def foreign_waiting(self, remote_requests: int) -> float:
        """The page's waiting requests that are not this EPP's, plus the other replicas' in-flight
        requests the page cannot show yet (more than the page's running + waiting hold beyond
        this EPP's own): they queue ahead of a new request just as this EPP's pending ones do."""
        waiting = self.ledger.foreign_waiting
        m = self.metrics
        if not remote_requests or m is None:
            return waiting
        own_on_page = len(self.ledger) - self.ledger.unseen(self.scrape_sent_at)
        foreign_on_page = (m.waiting or 0.0) + (m.running or 0.0) - own_on_page
        unseen = remote_requests - (foreign_on_page if foreign_on_page > 0.0 else 0.0)
        return waiting + unseen if unseen > 0.0 else waiting


class Pool:
    """The mutable state of one pool: endpoints, scraped metrics, in-flight accounting."""

    def __init__(
        self,
        endpoints: Iterable[Endpoint] = (),
        *,
        unhealthy_after: int = 3,
        speed_half_life_s: float = DEFAULT_SPEED_HALF_LIFE_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._live: dict[str, _Live] = {}
        # The one clock of this EPP's timestamps (scrapes, routing, speeds, snapshots): the
        # monotonic clock live; a simulated one in the virtual-time benchmark (bench/vtime/).
        self.clock = clock
        self.peers = PeerLoad()  # the other EPP replicas' load (the shared-state loop's)
        self._unhealthy_after = unhealthy_after
        self.speed_half_life_s = speed_half_life_s  # set again on every config reload
        # Called with the address of every routed request (the scraper wakes an idle pod's loop).
        self.routed_hook: Callable[[str], None] | None = None
        # Called with (address, predicted prefill s, tokens) of every pick (shared state pushes it).
        self.pick_hook: Callable[[str, float, int], None] | None = None
        # Called when capacity may have freed: a request finished or a scrape came in (flow control).
        self.capacity_hook: Callable[[], None] | None = None
        self.set_endpoints(endpoints)

    # -- discovery edge -------------------------------------------------------------
    def set_endpoints(self, endpoints: Iterable[Endpoint]) -> None:
        """Replace the endpoint set, keeping state (metrics, in-flight) of pods that stay."""
        fresh: dict[str, _Live] = {}
        for ep in endpoints:
            old = self._live.get(ep.address)
            if old is None:
                fresh[ep.address] = _Live(ep)
            else:
                old.endpoint = ep
                fresh[ep.address] = old
        self._live = fresh

    def endpoints(self) -> list[Endpoint]:
        return [live.endpoint for live in self._live.values()]

    def endpoint(self, address: str) -> Endpoint | None:
        live = self._live.get(address)
        return live.endpoint if live is not None else None

    def __contains__(self, address: object) -> bool:
        return address in self._live

    def has_ready(self) -> bool:
        """Whether any pod can take a request now: healthy, with a scraped page (scale from zero,
        epp/requestcontrol/scale_from_zero.py)."""
        after = self._unhealthy_after
        return any(live.metrics is not None and live.failures < after for live in self._live.values())

    # -- scraper edge ---------------------------------------------------------------
    def record_metrics(
        self,
        address: str,
        metrics: Metrics,
        *,
        sent_at: float | None = None,
        first_tokens: float | None = None,
    ) -> None:
        """A scrape of the pod: `sent_at` (the pool's clock) when it was sent, default now (the
        page is taken as current: every pick so far is on it);
        `first_tokens` the pod's cumulative first-token count (TTFT histogram), when it has one.
        Reconciles the pod's ledger with the page."""
        live = self._live.get(address)
        if live is not None:
            now = self.clock()
            live.metrics = metrics
            live.failures = 0
            live.finished_since_scrape = 0
            live.routed_since_scrape = 0
            live.scrape_seen_at = now
            # Without a send time the page is taken as current: every pick so far is on it.
            sent = now if sent_at is None else sent_at
            live.scrape_sent_at = sent
            remote = self.peers.inflight.get(address, (0, 0))[0]
            own = live.inflight_requests
            share = own / (own + remote) if own + remote > 0 else 1.0
            live.ledger.reconcile(
                sent, metrics.waiting, first_tokens, share, transit_s=0.0 if sent_at is None else TRANSIT_S
            )
            if self.capacity_hook is not None:
                self.capacity_hook()

    def metrics(self, address: str) -> Metrics | None:
        """The pod's last scraped metrics (None: unknown pod or not scraped yet)."""
        live = self._live.get(address)
        return live.metrics if live is not None else None

    def record_scrape_failure(self, address: str) -> None:
        live = self._live.get(address)
        if live is not None:
            live.failures += 1

    @property
    def unhealthy_after(self) -> int:
        """Failed scrapes in a row after which a pod leaves routing."""
        return self._unhealthy_after

    def mark_unhealthy(self, address: str) -> None:
        """Unhealthy now (its scrape loop crashed), healthy again at the next good scrape."""
        live = self._live.get(address)
        if live is not None:
            live.failures = max(live.failures, self._unhealthy_after)

    # -- request accounting edge ----------------------------------------------------
    def on_routed(
        self, address: str, tokens: int, prefill_s: float = 0.0, now: float | None = None
    ) -> Commitment | None:
        """A request routed to `address` with `tokens` (prompt + expected output) and a predicted
        prefill of `prefill_s` seconds there: its commitment, to hand back to `on_finished`."""
        live = self._count_in(address, tokens)
        if live is None:
            return None
        live.routed_since_scrape += 1
        if self.pick_hook is not None:
            self.pick_hook(address, prefill_s, tokens)
        return live.ledger.commit(self.clock() if now is None else now, prefill_s, tokens)

    def _count_in(self, address: str, tokens: int) -> _Live | None:
        live = self._live.get(address)
        if live is not None:
            live.inflight_requests += 1
            live.inflight_tokens += tokens
            if self.routed_hook is not None:
                self.routed_hook(address)
        return live

    def on_finished(
        self,
        address: str,
        tokens: int,
        routed_at: float | None = None,
        commitment: Commitment | None = None,
    ) -> None:
        """Undo `on_routed`; callers guarantee exactly one call per routed request.
        `routed_at` (monotonic) tells whether it was routed since the pod's last scrape;
        `commitment` is what `on_routed` returned (None: the pod's oldest is released)."""
        live = self._live.get(address)
        if live is not None:
            live.count_out(tokens, routed_at, commitment)
            live.finished_since_scrape += 1
        if self.capacity_hook is not None:
            self.capacity_hook()

    def move_inflight(
        self,
        old: str,
        new: str,
        tokens: int,
        routed_at: float | None = None,
        commitment: Commitment | None = None,
    ) -> Commitment | None:
        """A retry served the request on `new` instead of `old`: move its slot, as if routed
        there in the first place (nothing finished on `old`). Its finish must then not pass a
        `routed_at` (it was never counted as routed since `new`'s scrape), and must pass the
        commitment returned here."""
        live = self._live.get(old)
        if live is not None:
            live.count_out(tokens, routed_at, commitment)
        moved = self._count_in(new, tokens)  # served there already: no prefill of ours to project
        if moved is None:
            return None
        return moved.ledger.commit(self.clock(), 0.0, tokens)

    def observe_speed(
        self,
        address: str,
        *,
        ttft: float | None = None,
        tpot: float | None = None,
        now: float | None = None,
    ) -> None:
        """Fold one observation into the pod's smoothed speeds (`PodSpeeds.observe`)."""
        live = self._live.get(address)
        if live is not None:
            live.speeds.observe(ttft, tpot, self.clock() if now is None else now, self.speed_half_life_s)

    def observe_prefill(
        self,
        address: str,
        *,
        tokens_per_s: float,
        uncached_fraction: float | None,
        mean_prompt_tokens: float | None,
        now: float | None = None,
    ) -> None:
        """Fold one interval's prefill figures (epp/datalayer/prefill_pace.py `PrefillSample`) into the
        pod's smoothed ones, with the speeds' half-life (`PodSpeeds.observe_prefill`)."""
        live = self._live.get(address)
        if live is not None:
            now = self.clock() if now is None else now
            speeds = live.speeds
            speeds.observe_prefill(
                tokens_per_s, uncached_fraction, mean_prompt_tokens, now, self.speed_half_life_s
            )

    def inflight(self, address: str) -> int:
        """This replica's own in-flight requests on `address`."""
        live = self._live.get(address)
        return live.inflight_requests if live is not None else 0

    def local_inflight(self) -> dict[str, tuple[int, int]]:
        """This replica's own (requests, tokens) per pod with any in flight: what it publishes."""
        return {
            a: (live.inflight_requests, live.inflight_tokens)
            for a, live in self._live.items()
            if live.inflight_requests or live.inflight_tokens
        }

    def set_remote_inflight(self, counts: Mapping[str, tuple[int, int]]) -> None:
        """The other replicas' (requests, tokens) per pod; added to this replica's in snapshots."""
        self.peers.set_inflight(counts)

    def add_remote_pick(self, address: str, prefill_s: float, tokens: int, now: float | None = None) -> None:
        """Another replica's pick, pushed as it was made (`PeerLoad.add_pick`), on a pod of the pool."""
        if address in self._live:
            self.peers.add_pick(address, prefill_s, tokens, self.clock() if now is None else now)

    def set_remote_busy(self, seconds: Mapping[str, float], now: float | None = None) -> None:
        """The other replicas' projected prefill seconds ahead of each pod that no page shows
        yet (their picks since it), summed: added to `busy_s` in snapshots, and their picks no
        longer counted as unseen requests at the typical prompt."""
        self.peers.set_busy(seconds, self.clock() if now is None else now)

    def local_busy_ms(self, now: float | None = None) -> dict[str, int]:
        """This replica's unseen pending prefill per pod, in ms (what it publishes beside its counts)."""
        now = self.clock() if now is None else now
        out: dict[str, int] = {}
        for address, live in self._live.items():
            if live.ledger.pending(now) or live.ledger.busy_s(now):
                ms = int(live.ledger.busy_since_s(now, live.scrape_sent_at) * 1000.0 + 0.5)
                if ms > 0:
                    out[address] = ms
        return out

    def ledger(self, address: str) -> PodLedger | None:
        """The pod's ledger (tests, /debug/pool)."""
        live = self._live.get(address)
        return live.ledger if live is not None else None

    def inflight_total(self) -> int:
        return sum(live.inflight_requests for live in self._live.values())

    # -- scheduling edge ------------------------------------------------------------
    def snapshot(self, now: float | None = None) -> PoolSnapshot:
        """One `EndpointState` per pod at `now`. Built for every decision, so the loop reads each
        input once and the records are plain slots (at 100 pods the snapshot was most of a
        decision's CPU: `python -m bench.micro.decision_instructions`, docs/benchmarks/costs.md)."""
        now = self.clock() if now is None else now
        # A speed older than this is forgotten (read inline below: five per pod, every decision).
        horizon = SPEED_EXPIRY_HALF_LIVES * self.speed_half_life_s
        peers = self.peers
        remote, remote_busy, busy_known = peers.inflight, peers.busy_until, peers.busy_known
        unhealthy_after = self._unhealthy_after
        inf = math.inf
        states = []
        for address, live in self._live.items():
            metrics, ledger, speeds = live.metrics, live.ledger, live.speeds
            ttft, tpot, pace = speeds.ttft, speeds.tpot, speeds.prefill_tps
            uncached, prompt = speeds.uncached, speeds.prompt_tokens
            requests, tokens = remote.get(address, _NO_REMOTE)
            unseen_pending, unseen_kv = ledger.unseen_since(now, live.scrape_sent_at)
            until = remote_busy.get(address)
            busy = ledger.busy_s(now) + (until - now if until is not None and until > now else 0.0)
            states.append(
                EndpointState(
                    endpoint=live.endpoint,
                    metrics=metrics,
                    metrics_age=(now - metrics.scraped_at) if metrics else inf,
                    inflight_requests=live.inflight_requests + requests,
                    inflight_tokens=live.inflight_tokens + tokens,
                    ttft_ewma=ttft.value if now - ttft.at < horizon else None,
                    tpot_ewma=tpot.value if now - tpot.at < horizon else None,
                    prefill_tps=pace.value if now - pace.at < horizon else None,
                    uncached_fraction=uncached.value if now - uncached.at < horizon else None,
                    mean_prompt_tokens=prompt.value if now - prompt.at < horizon else None,
                    healthy=live.failures < unhealthy_after,
                    finished_since_scrape=live.finished_since_scrape,
                    routed_since_scrape=live.routed_since_scrape,
                    pending_requests=ledger.pending(now),
                    unseen_pending=unseen_pending,
                    stuck_requests=ledger.stuck(),
                    busy_s=busy,
                    foreign_waiting=live.foreign_waiting(0 if busy_known else requests)
                    if requests
                    else ledger.foreign_waiting,
                    unseen_kv_tokens=unseen_kv,
                    last_routed_at=ledger.last_routed,
                )
            )
        return PoolSnapshot(endpoints=tuple(states), taken_at=now)
