"""Pool state between scrapes: what the EPP knows that the last scrape cannot show yet."""

from __future__ import annotations

from epp.pool import Endpoint, Metrics, Pool


def test_the_queue_estimate_follows_completions_between_scrapes() -> None:
    """Each request that finishes lets the engine admit one waiting request: the scraped
    waiting count is lowered by the completions seen since, until the next scrape says."""
    pool = Pool([Endpoint("a", frozenset({"m"}))])
    pool.record_metrics("a", Metrics(waiting=2, running=4, kv_usage=0.5))
    for _ in range(6):
        pool.on_routed("a", 10)
    assert pool.snapshot().endpoints[0].queue == 2
    pool.on_finished("a", 10)
    assert pool.snapshot().endpoints[0].queue == 1  # one waiting request was admitted meanwhile
    pool.on_finished("a", 10)
    pool.on_finished("a", 10)
    assert pool.snapshot().endpoints[0].queue == 0  # never below zero
    pool.record_metrics("a", Metrics(waiting=1, running=2, kv_usage=0.5))
    assert pool.snapshot().endpoints[0].queue == 1  # a fresh scrape is the truth again
    pool.move_inflight("a", "a", 10)  # a retry's move is not a completion
    assert pool.snapshot().endpoints[0].queue == 1
