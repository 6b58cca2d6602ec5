"""vLLM KV events: decoding (against msgspec-built fixtures), the precise index, and the
subscriber's gap / replay / resync / restart handling over real ZMQ sockets on loopback."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import msgpack
import pytest
import zmq
import zmq.asyncio

from epp.datalayer.endpoint_records import Endpoint
from epp.datalayer.kv_event_batches import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventError,
    apply_batch,
    decode_batch,
    stored_adapters,
)
from epp.datalayer.kv_events import KVEventMetrics, KVEventSubscriber, KVEventSubscribers
from epp.datalayer.kv_index import KVIndex, block_keys
from gateway.pool_config import KvEventsConfig
from modelsim.kv_events import all_blocks_cleared, block_removed, block_stored, encode_batch
from tests.unit import kv_wire_structs as wire
from tests.waiting import until

FAMILIES = list(wire.FAMILIES)
BS = 4


def _tokens(n_blocks: int, start: int = 0) -> list[int]:
    return list(range(start, start + n_blocks * BS))


# ---- decoding ------------------------------------------------------------------------------
@pytest.mark.parametrize("family", FAMILIES)
def test_decodes_every_vllm_encoding(family: str) -> None:
    big = 2**64 - 1  # vLLM's hashes are unsigned 64-bit: msgpack uint64
    payload = wire.encode(
        family,
        12.5,
        [
            wire.stored(family, [big, 7], None, _tokens(2), BS, lora_name="sql"),
            wire.stored(family, [9], 7, _tokens(1, 8), BS),
            wire.removed(family, [7]),
            wire.cleared(family),
        ],
        rank=3,
    )
    batch = decode_batch(payload)
    assert batch.ts == 12.5 and batch.data_parallel_rank == 3
    a, b, c, d = batch.events
    assert a == BlockStored([big, 7], None, _tokens(2), BS, "sql", "GPU", None)
    assert b == BlockStored([9], 7, _tokens(1, 8), BS, None, "GPU", None)
    assert c == BlockRemoved([7], "GPU", None)
    assert d == AllBlocksCleared()


@pytest.mark.parametrize("family", FAMILIES)
def test_stored_adapters_name_each_gpu_adapter_once(family: str) -> None:
    """What adapter residency reads: the adapters a batch stored GPU blocks for, by name,
    by id (older vLLM: lora_id only) or both; other tiers and base-model blocks say nothing."""
    payload = wire.encode(
        family,
        1.0,
        [
            wire.stored(family, [1], None, _tokens(1), BS, lora_name="sql"),
            wire.stored(family, [2], 1, _tokens(1, 4), BS, lora_name="sql"),
            wire.stored(family, [3], None, _tokens(1), BS, lora_id=4),
            wire.stored(family, [4], None, _tokens(1), BS, lora_name="chat", lora_id=2),
            wire.stored(family, [5], None, _tokens(1), BS, lora_name="cpu-only", medium="CPU"),
            wire.stored(family, [6], None, _tokens(1), BS),
            wire.removed(family, [1]),
        ],
    )
    batch = decode_batch(payload)
    assert batch.events[2] == BlockStored([3], None, _tokens(1), BS, None, "GPU", None, 4)
    assert stored_adapters(batch) == [("sql", None), (None, 4), ("chat", 2)]


def test_bytes_hashes_unknown_fields_and_event_types() -> None:
    event = {
        "type": "BlockStored",
        "block_hashes": [b"\x01" * 32],
        "parent_block_hash": None,
        "token_ids": [1, 2, 3, 4],
        "block_size": 4,
        "lora_id": None,
        "medium": "GPU",
        "lora_name": None,
        "some_future_field": {"x": 1},
    }
    payload = msgpack.packb({"ts": 1.0, "events": [event, {"type": "BlockPinned", "block_hashes": [1]}]})
    batch = decode_batch(payload)
    assert batch.events == [BlockStored([b"\x01" * 32], None, [1, 2, 3, 4], 4, None, "GPU")]


@pytest.mark.parametrize(
    "payload",
    [
        b"",
        b"\xc1",
        msgpack.packb(5),
        msgpack.packb([1.0]),
        msgpack.packb(["x", []]),
        msgpack.packb([1.0, [7]]),
        msgpack.packb([1.0, [{"type": 3}]]),
        msgpack.packb([1.0, [["BlockStored", [1], None, [1, 2], 4, None, "GPU"]]]),  # too few tokens
        msgpack.packb([1.0, [["BlockStored", [1.5], None, [1, 2, 3, 4], 4]]]),
        msgpack.packb([1.0, [["BlockStored", [1], None, [1, 2, 3, -4], 4]]]),
        msgpack.packb([1.0, [["BlockStored", [1], None, [1, 2, 3, 4], 0]]]),
        msgpack.packb([1.0, [["BlockRemoved", "abc"]]]),
    ],
)
def test_garbage_is_a_clear_error(payload: bytes) -> None:
    with pytest.raises(KVEventError):
        decode_batch(payload)


def test_modelsim_encoder_decodes_with_vllm_structs() -> None:
    """modelsim encodes with msgpack; vLLM's own struct shapes (msgspec, typed) must read it."""
    payload = encode_batch(
        3.0,
        [block_stored([1, 2], None, _tokens(2), BS, "sql"), block_removed([2]), all_blocks_cleared()],
        data_parallel_rank=0,
    )
    batch = wire.decode_current(payload)
    f = wire.FAMILIES["current"]
    assert batch.ts == 3.0 and batch.data_parallel_rank == 0
    assert batch.events[0] == f["BlockStored"](
        block_hashes=[1, 2],
        parent_block_hash=None,
        token_ids=_tokens(2),
        block_size=BS,
        lora_id=None,
        medium="GPU",
        lora_name="sql",
        extra_keys=[("sql",), ("sql",)],
        group_idx=0,
    )
    assert batch.events[1] == f["BlockRemoved"](block_hashes=[2], medium="GPU", group_idx=0)
    assert isinstance(batch.events[2], f["AllBlocksCleared"])


# ---- the index -----------------------------------------------------------------------------
def _index(*pods: str, model: str = "m", max_blocks: int = 10_000) -> KVIndex:
    index = KVIndex(max_blocks)
    for pod in pods:
        index.add_pod(pod, model)
    return index


def _feed(index: KVIndex, pod: str, family: str, events: list) -> None:
    apply_batch(index, pod, decode_batch(wire.encode(family, time.time(), events)))


@pytest.mark.parametrize("family", FAMILIES)
def test_lookup_counts_leading_blocks_per_pod(family: str) -> None:
    index = _index("a", "b")
    prompt = _tokens(3)
    _feed(index, "a", family, [wire.stored(family, [11, 12, 13], None, prompt, BS)])
    # b stores the first block, then the next one in a second event chained by parent hash
    _feed(index, "b", family, [wire.stored(family, [21], None, prompt[:BS], BS)])
    _feed(index, "b", family, [wire.stored(family, [22], 21, prompt[BS : 2 * BS], BS)])
    assert index.lookup([*prompt, 99], "m") == {"a": 3, "b": 2}
    assert index.lookup([7, 7, 7, 7], "m") == {"a": 0, "b": 0}
    assert index.lookup(prompt, "other-model") == {}


def test_blocks_are_keyed_per_model_and_adapter() -> None:
    index = _index("a")
    index.add_pod("c", "m2")
    prompt = _tokens(2)
    _feed(index, "a", "current", [wire.stored("current", [1, 2], None, prompt, BS, lora_name="sql")])
    _feed(index, "c", "current", [wire.stored("current", [1, 2], None, prompt, BS)])
    assert index.lookup(prompt, "m", "sql") == {"a": 2}
    assert index.lookup(prompt, "m") == {"a": 0}  # the base model's blocks are others
    assert index.lookup(prompt, "m2") == {"c": 2}
    assert block_keys(prompt, BS, "m", "sql") != block_keys(prompt, BS, "m", None)


def test_removed_blocks_leave_the_index() -> None:
    index = _index("a")
    prompt = _tokens(3)
    _feed(index, "a", "v026", [wire.stored("v026", [1, 2, 3], None, prompt, BS)])
    _feed(index, "a", "v026", [wire.removed("v026", [2])])
    assert index.lookup(prompt, "m") == {"a": 1}
    assert index.size() == 2
    _feed(index, "a", "v026", [wire.removed("v026", [1, 3, 999])])  # unknown hashes are fine
    assert index.lookup(prompt, "m") == {"a": 0} and index.size() == 0


def test_all_blocks_cleared_drops_only_that_pod() -> None:
    index = _index("a", "b")
    prompt = _tokens(2)
    for pod in ("a", "b"):
        _feed(index, pod, "legacy", [wire.stored("legacy", [1, 2], None, prompt, BS)])
    _feed(index, "a", "legacy", [wire.cleared("legacy")])
    assert index.lookup(prompt, "m") == {"a": 0, "b": 2}


def test_unknown_parent_is_unanchored_not_guessed() -> None:
    index = _index("a")
    _feed(index, "a", "current", [wire.stored("current", [5], 4, _tokens(1), BS)])
    assert index.size() == 0 and index.pod("a").unanchored == 1


def test_host_memory_events_fill_their_own_tier_and_other_tiers_and_groups_are_ignored() -> None:
    """medium "CPU" (vLLM's CPU offload) goes to the host tier: `lookup` (the GPU) does not see
    it, `lookup_held` does, and its removal leaves the GPU copy alone; a disk tier and other
    KV-cache groups are not modelled."""
    index = _index("a")
    prompt = _tokens(1)
    _feed(index, "a", "current", [wire.stored("current", [1], None, prompt, BS, medium="CPU")])
    _feed(index, "a", "current", [wire.stored("current", [1], None, prompt, BS, medium="DISK")])
    _feed(index, "a", "current", [wire.stored("current", [1], None, prompt, BS, group_idx=1)])
    assert index.size() == 0 and index.host_size() == 1
    assert index.lookup(prompt, "m") == {"a": 0} and index.lookup_held(prompt, "m") == {"a": 1}
    _feed(index, "a", "current", [wire.stored("current", [1], None, prompt, BS)])
    _feed(index, "a", "current", [wire.removed("current", [1], medium="CPU")])
    assert index.lookup(prompt, "m") == {"a": 1} and index.host_size() == 0
    _feed(index, "a", "current", [wire.stored("current", [1], None, prompt, BS, medium="CPU")])
    index.clear_pod("a")  # AllBlocksCleared or a resync forgets both tiers
    assert index.size() == 0 and index.host_size() == 0


def test_index_stays_under_its_bound_in_a_flood() -> None:
    bound = 500
    index = _index("a", "b", max_blocks=bound)
    for i in range(400):  # 400 batches x 8 blocks x 2 pods = 6400 entries offered
        for pod in ("a", "b"):
            hashes = [i * 100 + j for j in range(8)]
            _feed(index, pod, "current", [wire.stored("current", hashes, None, _tokens(8, i * 1000), BS)])
        assert index.size() <= bound and index.distinct_blocks() <= bound
    assert index.size() == bound and index.evicted == 6400 - bound
    # the newest survive, the oldest are gone, and removals of evicted hashes are harmless
    assert index.lookup(_tokens(8, 399 * 1000), "m") == {"a": 8, "b": 8}
    assert index.lookup(_tokens(8, 0), "m") == {"a": 0, "b": 0}
    _feed(index, "a", "current", [wire.removed("current", list(range(8)))])
    assert sum(index.entries_by_pod().values()) == index.size()


# ---- the subscriber over real sockets ------------------------------------------------------
TOPIC = b"kv@127.0.0.1@m"


class FakeVllm:
    """A vLLM-shaped publisher built from raw pyzmq + msgspec fixtures, with a controllable
    replay buffer (independent of modelsim's publisher)."""

    def __init__(self, ctx: zmq.asyncio.Context, replay_topic: bool = True) -> None:
        """`replay_topic`: replies carry the topic frame, as vLLM 0.34's do (older: without)."""
        self.replay_topic = replay_topic
        self.pub = ctx.socket(zmq.PUB)
        self.pub.setsockopt(zmq.LINGER, 0)
        self.port = self.pub.bind_to_random_port("tcp://127.0.0.1")
        self.router = ctx.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.LINGER, 0)
        self.replay_port = self.router.bind_to_random_port("tcp://127.0.0.1")
        self.buffer: list[tuple[int, bytes]] = []
        self.replay_requests: list[int] = []
        self._task = asyncio.get_running_loop().create_task(self._serve())

    async def _serve(self) -> None:
        while True:
            client, _, start = await self.router.recv_multipart()
            begin = int.from_bytes(start, "big")
            self.replay_requests.append(begin)
            topic = (TOPIC,) if self.replay_topic else ()
            for seq, payload in self.buffer:
                if seq >= begin:
                    await self.router.send_multipart((client, b"", *topic, seq.to_bytes(8, "big"), payload))
            end = (-1).to_bytes(8, "big", signed=True)
            await self.router.send_multipart((client, b"", *(b"" for _ in topic), end, b""))

    async def publish(self, seq: int, events: list, *, send: bool = True, keep: bool = True) -> None:
        payload = wire.encode("current", time.time(), events)
        if keep:
            self.buffer.append((seq, payload))
        if send:
            await self.pub.send_multipart((TOPIC, seq.to_bytes(8, "big"), payload))

    def close(self) -> None:
        self._task.cancel()
        self.pub.close(linger=0)
        self.router.close(linger=0)


@pytest.fixture
async def ctx() -> AsyncIterator[zmq.asyncio.Context]:
    context = zmq.asyncio.Context()
    yield context
    context.destroy(linger=0)


def _stored(h: int, parent: int | None, block: int) -> object:
    return wire.stored("current", [h], parent, _tokens(1, block * BS), BS)


async def _start(ctx: zmq.asyncio.Context, vllm: FakeVllm, replay: bool = True, **hooks: Any):
    """A subscriber of pod 127.0.0.1:8000 running on `vllm` (`hooks`: on_batch, on_restart)."""
    index = _index()
    sub = KVEventSubscriber(
        "127.0.0.1:8000",
        "m",
        index,
        vllm.port,
        vllm.replay_port if replay else None,
        metrics=KVEventMetrics(None),
        context=ctx,
        replay_timeout_s=5.0,
        **hooks,
    )
    task = asyncio.get_running_loop().create_task(sub.run())
    return index, sub, task


async def _connected(vllm: FakeVllm, sub: KVEventSubscriber, next_seq: int) -> int:
    """Publish heartbeat batches until the subscriber has applied one (PUB/SUB slow joiner)."""
    seq = next_seq
    deadline = time.monotonic() + 20
    while sub.last_seq is None or sub.last_seq < next_seq:
        await vllm.publish(seq, [wire.removed("current", [123456789])])
        seq += 1
        await asyncio.sleep(0.05)
        assert time.monotonic() < deadline, "subscriber never connected"
    await until(lambda: sub.last_seq == seq - 1, "heartbeats applied")
    return seq


@pytest.mark.parametrize("replay_topic", [True, False], ids=["vllm-0.34-replies", "older-replies"])
async def test_gap_is_filled_by_replay(ctx: zmq.asyncio.Context, replay_topic: bool) -> None:
    vllm = FakeVllm(ctx, replay_topic=replay_topic)
    # history before the subscriber existed: replay from 0 must bring it in
    await vllm.publish(0, [_stored(100, None, 0)], send=False)
    index, sub, task = await _start(ctx, vllm)
    try:
        seq = await _connected(vllm, sub, 1)
        assert 0 in vllm.replay_requests and index.pod("127.0.0.1:8000").precise
        # two batches lost on the wire (kept in the replay buffer), then one delivered
        await vllm.publish(seq, [_stored(101, 100, 1)], send=False)
        await vllm.publish(seq + 1, [_stored(102, 101, 2)], send=False)
        await vllm.publish(seq + 2, [_stored(103, 102, 3)])
        await until(lambda: sub.last_seq == seq + 2, "gap replayed")
        assert seq in vllm.replay_requests
        assert index.lookup(_tokens(4), "m") == {"127.0.0.1:8000": 4}
        assert index.pod("127.0.0.1:8000").precise and sub.resyncs == 0
    finally:
        task.cancel()
        vllm.close()


async def test_uncoverable_gap_resyncs_then_fresh_events_make_it_precise(ctx: zmq.asyncio.Context) -> None:
    vllm = FakeVllm(ctx)
    index, sub, task = await _start(ctx, vllm)
    pod = "127.0.0.1:8000"
    try:
        seq = await _connected(vllm, sub, 0)
        await vllm.publish(seq, [_stored(100, None, 0)])
        await until(lambda: index.size() == 1, "block stored")
        # the eviction of block 100 is lost and the replay buffer no longer has it
        await vllm.publish(seq + 1, [wire.removed("current", [100])], send=False, keep=False)
        states: list[bool] = []
        real_drop = sub._drop

        def spy(reason: str) -> None:
            real_drop(reason)
            states.append(index.pod(pod).precise)

        sub._drop = spy
        await vllm.publish(seq + 2, [_stored(200, None, 5)])
        await until(lambda: sub.last_seq == seq + 2, "resync")
        assert states == [False]  # approximate between the drop and the fresh batch
        assert sub.resyncs == 1
        # the phantom block 100 is gone (its removal was lost), the fresh one is there
        assert index.lookup(_tokens(1), "m") == {pod: 0}
        assert index.lookup(_tokens(1, 5 * BS), "m") == {pod: 1}
        assert index.pod(pod).precise
    finally:
        task.cancel()
        vllm.close()


async def test_gap_without_replay_socket_resyncs(ctx: zmq.asyncio.Context) -> None:
    vllm = FakeVllm(ctx)
    index, sub, task = await _start(ctx, vllm, replay=False)
    try:
        seq = await _connected(vllm, sub, 0)
        await vllm.publish(seq, [_stored(100, None, 0)])
        await until(lambda: index.size() == 1, "block stored")
        await vllm.publish(seq + 5, [_stored(300, None, 7)])
        await until(lambda: sub.last_seq == seq + 5, "resync")
        assert index.size() == 1 and index.lookup(_tokens(1, 7 * BS), "m") == {"127.0.0.1:8000": 1}
        assert sub.resyncs >= 1 and not vllm.replay_requests
    finally:
        task.cancel()
        vllm.close()


async def test_sequence_reset_is_a_restart(ctx: zmq.asyncio.Context) -> None:
    vllm = FakeVllm(ctx)
    index, sub, task = await _start(ctx, vllm)
    pod = "127.0.0.1:8000"
    restarts: list[str] = []
    sub.on_restart = restarts.append  # adapter residency forgets the pod's slots
    try:
        seq = await _connected(vllm, sub, 0)
        await vllm.publish(seq, [_stored(100, None, 0), _stored(101, 100, 1)])
        await until(lambda: index.size() == 2, "blocks stored")
        # a new engine process: seq from 0, empty cache, new blocks
        vllm.buffer.clear()
        await vllm.publish(0, [_stored(500, None, 9)])
        await until(lambda: sub.last_seq == 0, "restart seen")
        assert restarts == [pod]
        assert index.lookup(_tokens(2), "m") == {pod: 0}
        assert index.lookup(_tokens(1, 9 * BS), "m") == {pod: 1}
        assert index.pod(pod).precise and index.size() == 1
    finally:
        task.cancel()
        vllm.close()


async def test_pod_removal_closes_and_forgets(ctx: zmq.asyncio.Context) -> None:
    vllm = FakeVllm(ctx)
    index = _index()
    subs = KVEventSubscribers(index, KVEventMetrics(None), context=ctx)
    ep = Endpoint("127.0.0.1:8000", frozenset({"m"}), kv_events_port=vllm.port)
    try:
        subs.sync([ep], KvEventsConfig(replayPort=vllm.replay_port))
        sub = subs.subscriber(ep.address)
        assert sub is not None and sub.replay_endpoint.endswith(str(vllm.replay_port))
        await vllm.publish(0, [_stored(100, None, 0)], send=False)
        seq = await _connected(vllm, sub, 1)
        assert seq >= 2 and index.size() == 1
        assert subs.debug()["precise"] == [ep.address]
        (_, _, task) = subs._subs[ep.address]
        subs.sync([], None)
        await until(task.done, "subscriber task ended")
        assert index.size() == 0 and index.pod(ep.address) is None and subs.debug()["pods"] == {}
    finally:
        await subs.stop()
        vllm.close()


def test_bench_runs_and_respects_the_bound() -> None:
    from bench.micro.kv_events_bench import run

    r = run(pods=2, batches=40, blocks=4, engine_blocks=1000, max_blocks=50)
    assert r["index_entries"] == 50 and r["events_per_s"] > 0 and r["lookup_us"] > 0


async def test_dead_replay_port_times_out_into_a_resync(ctx: zmq.asyncio.Context) -> None:
    vllm = FakeVllm(ctx)
    vllm.router.close(linger=0)  # nothing answers (or even listens) on the replay port
    index, sub, task = await _start(ctx, vllm)
    sub.replay_timeout_s = 0.3
    try:
        seq = await _connected(vllm, sub, 0)
        await vllm.publish(seq + 3, [_stored(300, None, 7)])
        await until(lambda: sub.last_seq == seq + 3, "resync after the replay timeout")
        assert index.lookup(_tokens(1, 7 * BS), "m") == {"127.0.0.1:8000": 1}
        assert not task.done()
    finally:
        task.cancel()
        vllm.close()


async def test_every_applied_batch_reaches_the_hook(ctx: zmq.asyncio.Context) -> None:
    """The subscriber hands each applied batch (live or replayed) to `on_batch`, the edge
    adapter residency hangs off."""
    vllm = FakeVllm(ctx)
    await vllm.publish(0, [wire.stored("current", [1], None, _tokens(1), BS, lora_name="sql")], send=False)
    seen: list[tuple[str, list]] = []
    _, sub, task = await _start(
        ctx, vllm, on_batch=lambda pod, batch: seen.append((pod, stored_adapters(batch)))
    )
    try:
        seq = await _connected(vllm, sub, 1)
        await vllm.publish(seq, [wire.stored("current", [2], None, _tokens(1), BS, lora_id=3)])
        await until(lambda: sub.last_seq == seq, "live batch applied")
        assert seen[0] == ("127.0.0.1:8000", [("sql", None)])  # replayed from seq 0
        assert seen[-1] == ("127.0.0.1:8000", [(None, 3)])
        assert len(seen) == seq + 1  # heartbeats too: one call per applied batch
    finally:
        task.cancel()
        vllm.close()


async def test_a_bad_batch_resyncs_the_pod(ctx: zmq.asyncio.Context) -> None:
    vllm = FakeVllm(ctx)
    index, sub, task = await _start(ctx, vllm)
    pod = "127.0.0.1:8000"
    try:
        seq = await _connected(vllm, sub, 0)
        await vllm.publish(seq, [_stored(100, None, 0)])
        await until(lambda: index.size() == 1, "block stored")
        resyncs = sub.resyncs
        await vllm.pub.send_multipart((b"t", (seq + 1).to_bytes(8, "big"), b"\xc1 not msgpack"))
        await until(lambda: sub.last_seq == seq + 1, "bad batch seen")
        assert index.size() == 0 and sub.resyncs == resyncs + 1 and not index.pod(pod).precise
        await vllm.publish(seq + 2, [_stored(200, None, 5)])
        await until(lambda: index.pod(pod).precise, "fresh events after the bad batch")
        assert index.size() == 1 and not task.done()
    finally:
        task.cancel()
        vllm.close()
