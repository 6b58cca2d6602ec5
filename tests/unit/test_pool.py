"""Pool state between scrapes: what the EPP knows that the last scrape cannot show yet."""

from __future__ import annotations

from epp.datalayer.endpoint_records import Endpoint, Metrics, kv_room
from epp.datalayer.pool import Pool
from epp.scheduling.saturation import is_saturated
from gateway.scheduling_params import SaturationParams


def test_a_page_retires_the_picks_it_no_longer_shows_waiting() -> None:
    """The ledger (epp/datalayer/ledger.py): this EPP's picks are pending until the page says otherwise;
    a completion of a running request retires nothing (the engine admits by KV, not one for one)."""
    pool = Pool([Endpoint("a", frozenset({"m"}))])
    handles = [pool.on_routed("a", 10) for _ in range(6)]
    pool.record_metrics("a", Metrics(waiting=2, running=4, kv_usage=0.5))  # shows all six
    assert pool.snapshot().endpoints[0].queue == 2
    pool.on_finished("a", 10, commitment=handles[0])  # one of the four running ones
    assert pool.snapshot().endpoints[0].queue == 2
    pool.record_metrics("a", Metrics(waiting=1, running=4, kv_usage=0.5))
    assert pool.snapshot().endpoints[0].queue == 1  # a fresh page is the truth again
    pool.record_metrics("a", Metrics(waiting=3, running=2, kv_usage=0.5))
    pod = pool.snapshot().endpoints[0]
    assert pod.queue == 3 and pod.foreign_waiting == 2  # more waiting than ours: other traffic
    for h in handles[1:]:
        pool.on_finished("a", 10, commitment=h)
    assert len(pool.ledger("a") or ()) == 0 and pool.inflight_total() == 0


def test_requests_routed_since_the_scrape_are_pending_whatever_finished() -> None:
    """Measured on bursty-qwen3-235b: a pod that finished as many requests as it was sent
    since its last scrape read an empty queue (in-flight - waiting - running nets the two), so
    a burst clumped onto it between scrapes. The requests routed since the scrape and still in
    flight each still need their prefill; the ones that finished freed running slots."""
    pool = Pool([Endpoint("a", frozenset({"m"}))])
    old = [pool.on_routed("a", 10) for _ in range(10)]
    pool.record_metrics("a", Metrics(waiting=0, running=10, kv_usage=0.5))
    for h in old[:5]:
        pool.on_finished("a", 10, commitment=h)  # five of the scraped ten finish
    new = [pool.on_routed("a", 10) for _ in range(5)]  # and five new ones come
    pod = pool.snapshot().endpoints[0]
    assert pod.inflight_requests == 10 and pod.routed_since_scrape == 5
    assert pod.queue == 5  # netted, the old estimate read 0
    pool.on_finished("a", 10, commitment=new[0])  # one of the new ones is done
    assert pool.snapshot().endpoints[0].queue == 4
    pool.on_finished("a", 10, commitment=old[5])  # an old one: the new ones still pend
    assert pool.snapshot().endpoints[0].queue == 4
    pool.record_metrics("a", Metrics(waiting=1, running=7, kv_usage=0.5))
    assert pool.snapshot().endpoints[0].queue == 1  # the scrape is the truth again


def _pod(pool: Pool, *, waiting: float, running: float, kv: float, blocks: int | None = 1000) -> None:
    pool.record_metrics(
        "a", Metrics(waiting=waiting, running=running, kv_usage=kv, block_size=16, num_gpu_blocks=blocks)
    )


def test_kv_room_is_free_blocks_over_the_mean_request_size() -> None:
    m = Metrics(waiting=0, running=10, kv_usage=0.49, block_size=16, num_gpu_blocks=1000)
    # 16,000 tokens, 1 % watermark: (1 - 0.01 - 0.49) * 16,000 = 8,000 free; 500 tokens a request.
    assert kv_room(m, 10, 5_000) == 16
    assert kv_room(m, 0, 0) == 0  # no in-flight request: no size to go by
    assert kv_room(Metrics(kv_usage=0.995, block_size=16, num_gpu_blocks=1000), 10, 5_000) == 0
    assert kv_room(Metrics(kv_usage=0.5, block_size=16, num_gpu_blocks=None), 10, 5_000) == 0
    assert kv_room(Metrics(kv_usage=None, block_size=16, num_gpu_blocks=1000), 10, 5_000) == 0


def test_requests_in_transit_to_a_pod_with_free_kv_are_no_backlog() -> None:
    """Measured (bench/probes/flow_probe.py): the request routed to a pod since its last scrape made
    the effective queue read 1 on a pod with half its KV free, and at a queue threshold of 1
    the pool read saturated all the time. Its free KV admits them at the next engine step."""
    pool = Pool([Endpoint("a", frozenset({"m"}))])
    for _ in range(40):
        pool.on_routed("a", 200)
    _pod(pool, waiting=0, running=40, kv=0.49)
    for _ in range(2):
        pool.on_routed("a", 200)  # 40 running, 2 routed since the scrape
    pod = pool.snapshot().endpoints[0]
    assert pod.queue == 2
    assert pod.backlog == 0  # 8,000 free tokens hold 40 requests of 200
    th = SaturationParams(queue=1, kvCache=1.0)
    assert not is_saturated(pod, th)
    _pod(pool, waiting=1, running=41, kv=0.49)  # the scrape shows one the engine did not admit
    pod = pool.snapshot().endpoints[0]
    assert pod.queue == 1 and pod.backlog == 1  # scraped waiting is a backlog whatever the KV
    assert is_saturated(pod, th)


def test_a_full_pod_keeps_its_backlog() -> None:
    pool = Pool([Endpoint("a", frozenset({"m"}))])
    for _ in range(43):
        pool.on_routed("a", 200)
    _pod(pool, waiting=3, running=40, kv=0.975)  # 240 free tokens: one request of 200
    for _ in range(2):
        pool.on_routed("a", 200)
    pod = pool.snapshot().endpoints[0]
    assert pod.queue == 5 and pod.backlog == 4  # 3 waiting + 2 unseen, one of which fits
    assert is_saturated(pod, SaturationParams(queue=1, kvCache=1.0))
    for _ in range(2):
        pool.on_routed("a", 200)
    _pod(pool, waiting=3, running=40, kv=0.5, blocks=None)  # page current: 2 of ours started
    for _ in range(2):
        pool.on_routed("a", 200)
    pod = pool.snapshot().endpoints[0]
    assert pod.backlog == pod.queue == 5  # capacity unknown: every unseen pick counts


def test_committed_kv_counts_what_every_in_flight_request_will_hold() -> None:
    """thresholds.kvMeasure: committed reads a pod as full once its in-flight requests' prompts
    and expected outputs fill the cache, though the page still shows room (flow control's gate)."""
    pool = Pool([Endpoint("a", frozenset({"m"}))])
    for _ in range(10):
        pool.on_routed("a", 1000)
    _pod(pool, waiting=0, running=10, kv=0.2)  # 16,000 tokens; what runs holds 3,200 so far
    pod = pool.snapshot().endpoints[0]
    assert pod.kv_level("page") == 0.2
    level = pod.kv_level("committed")
    assert level is not None and abs(level - 10_000 / (0.99 * 16_000)) < 1e-9
    page = SaturationParams(kvCache=0.6)
    committed = SaturationParams(kvCache=0.6, kvMeasure="committed")
    assert not is_saturated(pod, page) and is_saturated(pod, committed)
    # Above 1: an overcommit of the expected outputs (flow control's standard band,
    # bench/harness/flow_policies.py).
    overcommit = SaturationParams(queue=1e6, kvCache=1.5, kvMeasure="committed")  # the KV term alone
    assert not is_saturated(pod, overcommit)
    for _ in range(14):  # 24,000 tokens in flight: 1.52 x what the cache holds
        pool.on_routed("a", 1000)
    assert is_saturated(pool.snapshot().endpoints[0], overcommit)
    assert _capacity_unknown_reads_the_page(pool)


def _capacity_unknown_reads_the_page(pool: Pool) -> bool:
    _pod(pool, waiting=0, running=10, kv=0.2, blocks=None)
    return pool.snapshot().endpoints[0].kv_level("committed") == 0.2
