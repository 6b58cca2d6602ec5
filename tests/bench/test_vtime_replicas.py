"""EPP replicas in virtual time: the virtual store does what the live store's script does, and
one replica is the single EPP it always was."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry

from bench.probes.engine_check import VirtualClock
from bench.vtime.cli import run_one
from bench.vtime.epp import VirtualEpp
from bench.vtime.loop import TIMER, Events
from bench.vtime.shared_store import StoreScript, VirtualSharedStore
from devstack.redis_server import RedisServer
from epp.datalayer.adapter_residency import AdapterResidency
from epp.datalayer.endpoint_records import Endpoint
from epp.datalayer.pool import Pool
from epp.datalayer.prefix_index import PrefixIndex
from epp.datalayer.shared_state import SharedState
from gateway.config import SharedStateConfig
from tests.bench.test_vtime import SCENARIO

POD_A, POD_B = "10.0.0.1:8000", "10.0.0.2:8000"


def _replica(url: str, prefix: str, name: str) -> tuple[Pool, PrefixIndex, SharedState]:
    pool = Pool([Endpoint(POD_A, frozenset({"m"})), Endpoint(POD_B, frozenset({"m"}))])
    index = PrefixIndex()
    config = SharedStateConfig.model_validate({"redis": url, "keyPrefix": prefix})
    residency = AdapterResidency(clock=pool.clock)
    state = SharedState(
        pool, "p", config, CollectorRegistry(), replica_id=name, prefix_index=index, residency=residency
    )
    return pool, index, state


def _picture(pool: Pool, state: SharedState) -> dict[str, Any]:
    by = pool.snapshot().by_address()
    return {
        "peers": list(state.peers),
        "remote": dict(state.remote),
        "learned": state.learned,
        "lora": state.residency.in_flight(POD_A) if state.residency is not None else None,
        "inflight": {a: (s.inflight_requests, s.inflight_tokens) for a, s in by.items()},
    }


async def test_the_virtual_script_answers_as_the_redis_script(redis: RedisServer) -> None:
    """The same steps, once through a redis-server and once through StoreScript: the same
    peers, summed counts, learned decisions and stream position on both replicas."""
    live = {n: _replica(redis.url, "vs", n) for n in ("a", "b")}
    virtual = {n: _replica(redis.url, "vs-unused", n) for n in ("a", "b")}
    script = StoreScript(ttl_s=1.0, stream_max_len=10_000)
    hashes = live["a"][1].hashes("m", "a shared system prompt " * 40)

    async def step(name: str) -> None:
        _, _, state = live[name]
        assert await state.sync_once()
        vpool, _, vstate = virtual[name]
        out = vstate.outgoing(vpool.local_inflight(), vpool.local_busy_ms(), vstate.local_lora())
        assert vstate.apply_reply(script.call(0.0, vstate.replica_id, vstate.last_read, out))

    for replicas in (live, virtual):
        replicas["a"][0].on_routed(POD_A, 10)
        residency = replicas["a"][2].residency
        assert residency is not None
        residency.on_routed(POD_A, "sql", 40)
        replicas["a"][0].on_routed(POD_A, 20)
        replicas["a"][1].add(POD_A, hashes)
        replicas["b"][0].on_routed(POD_B, 7)
    await step("a")
    await step("b")
    await step("a")
    for name in ("a", "b"):
        assert _picture(*live[name][::2]) == _picture(*virtual[name][::2])
    assert virtual["b"][2].remote == {POD_A: (2, 30)} and virtual["a"][2].remote == {POD_B: (1, 7)}
    assert virtual["b"][1].match(hashes, POD_A) == len(hashes)
    b_residency = virtual["b"][2].residency
    assert b_residency is not None and b_residency.in_flight(POD_A) == {"sql": 1}  # a's, summed
    assert live["a"][2].last_read and virtual["a"][2].last_read
    for _, _, state in live.values():
        await state.stop()


def _run_to(events: Events, t: float) -> None:
    """Run the events up to `t` (run_until drops the first event past its limit: a marker stops it)."""
    reached: list[bool] = []
    events.at(t, TIMER, lambda: reached.append(True))
    events.run_until(float("inf"), lambda: bool(reached))


def test_pushed_picks_reach_the_peer_after_the_round_trip() -> None:
    """Two replicas on the virtual store: a pick of `a` is counted by `b` half a round trip
    after `a`'s call reaches the store, and its counts after `b`'s next round trip."""
    events = Events(VirtualClock())
    store = VirtualSharedStore(events, time_scale=1.0, rtt_ms=1.0)
    (pool_a, _, a), (pool_b, _, b) = (_replica("redis://virtual:1", "v", n) for n in ("a", "b"))
    for state in (a, b):
        store.attach("p", state)
        state.pool.clock = store.epp_now
    _run_to(events, 0.3)  # past an idle interval: each knows the other
    assert a.peers == ["b"] and b.peers == ["a"]
    t0 = events.now
    pool_a.on_routed(POD_A, 50, 0.004)  # pick_hook: wakes a's loop
    assert a.residency is not None and b.residency is not None
    a.residency.on_routed(POD_A, "sql", 30)  # the scheduler's part of the same routing
    _run_to(events, t0 + 0.0009)
    assert b.picks_learned == 0  # the call is on its way (0.5 ms) and so is the message
    _run_to(events, t0 + 0.0011)
    assert b.picks_learned == 1
    assert pool_b.snapshot().by_address()[POD_A].inflight_requests == 1
    assert b.residency.in_flight(POD_A) == {"sql": 1}  # its adapter too: b places it where a did
    assert b.residency.adapters(POD_A, 1) == ["sql"]
    _run_to(events, t0 + 0.5)
    assert b.remote == {POD_A: (1, 50)}  # the counts, once the push is replaced by the totals
    assert pool_b.snapshot().by_address()[POD_A].inflight_requests == 1  # counted once
    assert b.residency.in_flight(POD_A) == {"sql": 1}
    a.residency.on_finished(POD_A, "sql")
    _run_to(events, t0 + 1.0)
    assert b.residency.in_flight(POD_A) == {}  # a's round trip after the end: gone for b too


def test_a_silent_replica_expires_from_the_virtual_store() -> None:
    script = StoreScript(ttl_s=1.0, stream_max_len=100)
    pool, _, state = _replica("redis://virtual:1", "v", "a")
    pool.on_routed(POD_A, 5)
    script.call(0.0, "a", "", state.outgoing(pool.local_inflight()))
    _, _, other = _replica("redis://virtual:1", "v", "b")
    quiet = other.outgoing({})
    assert script.call(0.5, "b", "", quiet)[1] == [POD_A.encode(), 1, 5]
    assert script.call(1.5, "b", "", quiet)[:2] == [[], []]  # its hash expired: not a peer
    assert script.members == ["b"]


def test_one_replica_is_the_single_epp() -> None:
    single, _, _ = run_one(SCENARIO, "epp-default", gateway_ms=0.0)
    one, _, one_router = run_one(SCENARIO, "epp-default", gateway_ms=0.0, replicas=1)
    key = [(r.index, r.pod, r.ttft_s, r.e2e_s) for r in single]
    assert key == [(r.index, r.pod, r.ttft_s, r.e2e_s) for r in one]
    assert isinstance(one_router, VirtualEpp) and one_router.store is None
    assert one_router.name == "epp-default" and "replicas" not in one_router.config()


def test_replicas_share_the_requests_and_record_the_store() -> None:
    results, _, router = run_one(SCENARIO, "epp-default", gateway_ms=0.0, replicas=2)
    assert all(r.status == 200 for r in results)
    assert isinstance(router, VirtualEpp) and router.name == "epp-default-2replicas"
    config = router.config()
    assert config["replicas"] == 2
    store = config["shared_store"]
    assert isinstance(store, dict) and store["rtt_ms"] == 0.3 and store["round_trips"] > 0
    again, _, _ = run_one(SCENARIO, "epp-default", gateway_ms=0.0, replicas=2)
    assert [(r.pod, r.ttft_s) for r in again] == [(r.pod, r.ttft_s) for r in results]
