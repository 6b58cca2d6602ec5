"""The ledger of committed work per pod (epp/datalayer/ledger.py), alone and as the scheduler reads it."""

from __future__ import annotations

import random
from collections import Counter

from epp.datalayer.endpoint_records import Endpoint, Metrics
from epp.datalayer.ledger import PodLedger
from epp.datalayer.pool import Pool
from epp.scheduling.request import parse_request
from epp.scheduling.weighted import WeightedScheduler
from gateway.profiles import BUILTIN_PROFILES


def test_prefills_chain_first_come_first_served_and_expire_by_projection() -> None:
    ledger = PodLedger()
    a = ledger.commit(10.0, 0.02, 100)
    ledger.commit(10.0, 0.03, 100)
    assert abs(ledger.busy_s(10.0) - 0.05) < 1e-9 and ledger.pending(10.0) == 2
    assert ledger.pending(10.025) == 1  # the first is projected done at 10.02
    assert ledger.pending(10.06) == 0 and ledger.busy_s(10.06) == 0.0
    ledger.release(a)
    assert len(ledger) == 1


def test_first_tokens_on_the_page_retire_the_oldest_pending_prefills() -> None:
    ledger = PodLedger()
    ledger.reconcile(0.0, 0, 100, 1.0)  # the baseline count
    for i in range(4):
        ledger.commit(1.0 + i * 0.01, 0.0, 100)  # no prediction: pending until a page says
    ledger.reconcile(2.0, 4, 102, 1.0)  # two first tokens since the last page
    assert ledger.pending(2.0) == 2
    assert ledger.foreign_waiting == 2  # the page shows 4 waiting, 2 of them ours
    ledger.reconcile(3.0, 0, 102, 1.0)  # nothing waits any more: ours are prefilling
    assert ledger.pending(3.0) == 2 and ledger.foreign_waiting == 0
    ledger.reconcile(3.1, 0, 104, 1.0)  # their first tokens: done
    assert ledger.pending(3.1) == 0


def test_without_first_tokens_a_pick_the_page_no_longer_shows_waiting_counts_as_started() -> None:
    ledger = PodLedger()
    for i in range(2):
        ledger.commit(1.0 + i * 0.01, 0.0, 100)
    ledger.reconcile(2.0, 0, None, 1.0)
    assert ledger.pending(2.0) == 0


def test_a_long_prefill_the_page_shows_running_keeps_its_projected_end() -> None:
    """An engine stops counting a request as waiting when its prefill starts, not when it ends:
    an 8k-token prefill of 0.3 s stays pending until its first token, and a page read 0.25 s
    into it does not restart its 0.3 s (it ends at 1.3, as projected at the pick)."""
    ledger = PodLedger()
    ledger.reconcile(0.0, 0, 10, 1.0)
    ledger.commit(1.0, 0.3, 8192)
    ledger.reconcile(1.25, 0, 10, 1.0)
    assert ledger.pending(1.25) == 1
    assert abs(ledger.busy_s(1.25) - 0.05) < 1e-9
    ledger.reconcile(1.35, 0, 11, 1.0)
    assert ledger.pending(1.35) == 0 and ledger.busy_s(1.35) == 0.0


def test_a_pick_queued_behind_a_prefill_keeps_its_projection_until_it_is_overdue() -> None:
    ledger = PodLedger()
    ledger.reconcile(0.0, 0, 10, 1.0)
    ledger.commit(1.0, 0.3, 8192)
    ledger.commit(1.01, 0.3, 8192)  # projected to start at 1.3
    ledger.reconcile(1.1, 1, 10, 1.0)  # the page shows it waiting, as projected
    assert ledger.stuck() == 0 and abs(ledger.busy_s(1.1) - 0.5) < 1e-9
    ledger.reconcile(1.5, 1, 10, 1.0)  # still waiting 0.2 s past its projected start: no room
    assert ledger.stuck() == 1
    ledger.reconcile(1.6, 0, 11, 1.0)  # the first one's first token; the other one prefills now
    assert ledger.stuck() == 0 and ledger.pending(1.6) == 1
    assert abs(ledger.busy_s(1.6) - 0.3) < 1e-9  # projected from the page that shows it started


def test_another_replicas_first_tokens_retire_only_our_share() -> None:
    ledger = PodLedger()
    ledger.reconcile(0.0, 0, 0, 1.0)
    for _ in range(4):
        ledger.commit(1.0, 0.0, 100)
    ledger.reconcile(2.0, 8, 4, 0.5)  # half the pod's in-flight is ours
    assert ledger.pending(2.0) == 2


def test_a_pick_in_transit_when_the_page_was_sent_stays_pending() -> None:
    ledger = PodLedger()
    ledger.commit(1.0, 0.0, 100)
    ledger.reconcile(1.001, 0, None, 1.0)  # sent 1 ms after the pick: may not be on the page
    assert ledger.pending(1.01) == 1
    ledger.reconcile(1.1, 0, None, 1.0)
    assert ledger.pending(1.1) == 0


def test_the_ledger_returns_to_zero_whatever_ends_the_requests() -> None:
    """Completion, reset, client abort (each ends the stream: `on_finished` with the handle),
    a retry moving the slot, and a request whose handle was lost: nothing stays counted."""
    pool = Pool([Endpoint("a", frozenset({"m"})), Endpoint("b", frozenset({"m"}))])
    handles = [pool.on_routed("a", 50, 0.01) for _ in range(5)]
    pool.record_metrics("a", Metrics(waiting=2, running=3, kv_usage=0.1), first_tokens=3)
    moved = pool.move_inflight("a", "b", 50, commitment=handles.pop())
    for h in handles[:-1]:
        pool.on_finished("a", 50, commitment=h)
    pool.on_finished("a", 50)  # no handle: the oldest goes
    pool.on_finished("b", 50, commitment=moved)
    for address in ("a", "b"):
        ledger = pool.ledger(address)
        assert ledger is not None and len(ledger) == 0 and ledger.pending(1e9) == 0
    assert pool.inflight_total() == 0
    assert all(s.queue == 0 or s.metrics is None for s in pool.snapshot().endpoints)


def _request(i: int) -> object:
    body = {"model": "m", "messages": [{"role": "user", "content": f"question {i} " * 40}], "max_tokens": 100}
    return parse_request(body, request_id=str(i), target_model="m", adapter=None, headers={})


def test_a_burst_within_one_scrape_interval_spreads_as_evenly_as_round_robin() -> None:
    """Identical idle pods, one page each, then a burst of 4 x 25 picks before the next page:
    each pick commits its prefill to the pod's ledger, so the next one sees it busy."""
    pods = [Endpoint(f"10.0.0.{i}:8000", frozenset({"m"})) for i in range(4)]
    pool = Pool(pods)
    for ep in pods:
        pool.record_metrics(
            ep.address, Metrics(waiting=0, running=0, kv_usage=0.0, block_size=16, num_gpu_blocks=10_000)
        )
    scheduler = WeightedScheduler(BUILTIN_PROFILES, rng=random.Random(7))
    now = 100.0
    counts: Counter[str] = Counter()
    for i in range(100):
        request = _request(i)
        decision = scheduler.pick(request, pool.snapshot(now=now))  # type: ignore[arg-type]
        address = decision.ranked[0]
        assert decision.prefill_s > 0.0
        pool.on_routed(address, 300, decision.prefill_s, now=now)
        scheduler.on_routed(request, address)  # type: ignore[arg-type]
        counts[address] += 1
        now += 0.0005  # 100 requests in 50 ms
    assert sorted(counts.values()) == [25, 25, 25, 25], counts


def _naive_pending(ledger: PodLedger, now: float) -> tuple[int, int]:
    """What `pending` and `stuck` count, by a scan of every commitment."""
    live = [c for c in ledger._entries.values() if not c.prefilled]
    return sum(c.ends_at > now for c in live), sum(c.ends_at == float("inf") for c in live)


def _naive_unseen(ledger: PodLedger, now: float, since: float) -> tuple[int, int]:
    """What `unseen_since` counts, by a scan of every commitment."""
    after = [c for c in ledger._entries.values() if c.routed_at > since]
    return sum(not c.prefilled and c.ends_at > now for c in after), sum(c.kv_tokens for c in after)


def test_the_incremental_counts_agree_with_a_scan_of_every_commitment() -> None:
    rng = random.Random(3)
    ledger, handles, now, first = PodLedger(), [], 0.0, 0.0
    for _ in range(3000):
        now += rng.random() * 0.01
        op = rng.random()
        if op < 0.45:
            handles.append(ledger.commit(now, rng.choice([0.0, 0.002, 0.01, 0.05]), 100))
        elif op < 0.8 and handles:
            ledger.release(handles.pop(rng.randrange(len(handles))))
        elif op < 0.9:
            first += rng.randrange(3)
            ledger.reconcile(now - rng.random() * 0.02, rng.randrange(4), first, 1.0)
        assert (ledger.pending(now), ledger.stuck()) == _naive_pending(ledger, now)
        # The snapshot's one-walk read (with its "no pick since the page" shortcut) against the
        # two walks it replaced, for a page sent a little before now and one sent after every pick.
        for since in (now - rng.random() * 0.05, now):
            assert ledger.unseen_since(now, since) == _naive_unseen(ledger, now, since)
