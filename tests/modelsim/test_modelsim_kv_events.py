"""modelsim publishes vLLM KV events; the EPP's subscriber keeps a precise index of them.

A real ZMQ round trip on loopback with free ports: modelsim's PUB + replay ROUTER sockets ->
`epp.datalayer.kv_events.KVEventSubscribers` -> `KVIndex.lookup` on the engine's own token ids.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
import yaml
import zmq
import zmq.asyncio

from epp.app import EppApp
from epp.datalayer.endpoint_records import Endpoint
from epp.datalayer.kv_events import KVEventMetrics, KVEventSubscribers
from epp.datalayer.kv_index import KVIndex
from gateway.pool_config import KvEventsConfig
from modelsim.fleet import Fleet, FleetSpec, SpecError, run_fleet
from modelsim.kv_events import KVEventsConfig as SimKVEventsConfig
from modelsim.kv_events import KVEventsConfigError
from tests.unit import kv_wire_structs as wire
from tests.waiting import until

KV = {
    "enable_kv_cache_events": True,
    "publisher": "zmq",
    "endpoint": "tcp://127.0.0.1:0",
    "replay_endpoint": "tcp://127.0.0.1:0",
    "topic": "kv@127.0.0.1@llama",
}
PROMPT = "the quick brown fox jumps over the lazy dog " * 12


@pytest.fixture
async def kv_fleet() -> AsyncIterator[Fleet]:
    spec = FleetSpec.from_dict(
        {
            "time_scale": 50.0,
            "pods": [
                {
                    "name": "llama-0",
                    "model": "llama",
                    "adapters": ["llama-sql"],
                    "num_gpu_blocks": 64,
                    "kv_events": KV,
                },
                {"name": "plain", "model": "llama"},  # events off by default
            ],
        }
    )
    async with run_fleet(spec) as fleet:
        yield fleet


@pytest.fixture
async def subs(kv_fleet: Fleet) -> AsyncIterator[tuple[KVIndex, KVEventSubscribers]]:
    pod = kv_fleet.pod("llama-0")
    index = KVIndex(10_000)
    ctx = zmq.asyncio.Context()
    manager = KVEventSubscribers(index, KVEventMetrics(None), context=ctx)
    manager.sync(
        [Endpoint(pod.address, frozenset({"llama"}), kv_replay_port=pod.kv_replay_port)],
        KvEventsConfig(port=pod.kv_events_port),
    )
    yield index, manager
    await manager.stop()
    ctx.destroy(linger=0)


async def _tokens(client: httpx.AsyncClient, **body: object) -> list[int]:
    r = await client.post("/tokenize", json={"model": "llama", **body})
    r.raise_for_status()
    return r.json()["tokens"]


async def _complete(client: httpx.AsyncClient, model: str = "llama", prompt: str = PROMPT) -> None:
    r = await client.post("/v1/completions", json={"model": model, "prompt": prompt, "max_tokens": 2})
    r.raise_for_status()


def test_kv_events_config_mirrors_vllm() -> None:
    assert SimKVEventsConfig.parse(None) is None
    assert SimKVEventsConfig.parse('{"enable_kv_cache_events": false}') is None
    cfg = SimKVEventsConfig.parse('{"enable_kv_cache_events": true, "endpoint": "tcp://127.0.0.1:5557"}')
    assert cfg is not None and cfg.buffer_steps == 10_000 and cfg.replay_endpoint is None
    assert cfg.offset(2).endpoint == "tcp://127.0.0.1:5559"  # vLLM's per-DP-rank port offset
    for bad in ("[1]", "{", '{"enable_kv_cache_events": true, "bogus": 1}', '{"buffer_steps": 0}'):
        with pytest.raises(KVEventsConfigError):
            SimKVEventsConfig.parse(bad)
    with pytest.raises(SpecError):
        FleetSpec.from_dict({"pods": [{"model": "m", "kv_events": {"publisher": "kafka"}}]})


async def test_round_trip_store_evict_reset_restart(
    kv_fleet: Fleet, subs: tuple[KVIndex, KVEventSubscribers]
) -> None:
    index, manager = subs
    pod = kv_fleet.pod("llama-0")
    assert kv_fleet.pod("plain").kv_events_port is None
    assert pod.info()["kv_events_port"] == pod.kv_events_port
    sub = manager.subscriber(pod.address)
    assert sub is not None
    async with httpx.AsyncClient(base_url=pod.url, timeout=10) as client:
        ids = await _tokens(client, prompt=PROMPT)
        full = len(ids) // 16
        assert full >= 4
        await _complete(client)
        await until(lambda: index.lookup(ids, "llama").get(pod.address) == full, "prompt blocks indexed")
        # the engine itself agrees on what it holds
        assert pod.probe(ids)["cached_prefix_tokens"] == (len(ids) - 1) // 16 * 16
        assert index.pod(pod.address).precise

        # an adapter's blocks are keyed apart
        sql_ids = await _tokens(client, prompt=PROMPT)
        await _complete(client, model="llama-sql")
        await until(lambda: index.lookup(sql_ids, "llama", "llama-sql").get(pod.address) == full, "adapter")

        # 64 blocks of KV: other prompts evict the first one's blocks -> BlockRemoved
        for i in range(8):
            await _complete(client, prompt=f"request number {i} " + "lorem ipsum dolor sit amet " * 20)
        await until(lambda: index.lookup(ids, "llama").get(pod.address, 0) < full, "eviction seen")
        assert index.size() <= 64  # never more entries than the engine has blocks

        # reset_prefix_cache -> AllBlocksCleared
        r = await client.post("/reset_prefix_cache")
        assert r.status_code == 200
        await until(lambda: index.size() == 0, "AllBlocksCleared")

        # a crashed and restarted engine: seq from 0 on the same ports, state rebuilt
        await _complete(client)
        await until(lambda: index.lookup(ids, "llama").get(pod.address) == full, "indexed again")
        resyncs = sub.resyncs
        await pod.crash()
        await pod.restart()
        await until(lambda: sub.resyncs > resyncs, "restart noticed")
        assert index.lookup(ids, "llama").get(pod.address, 0) == 0
        await _complete(client)
        await until(lambda: index.lookup(ids, "llama").get(pod.address) == full, "fresh engine indexed")
        await until(lambda: index.pod(pod.address).precise, "precise after restart")
    debug = manager.debug()
    assert debug["precise"] == [pod.address] and debug["pods"][pod.address]["lag_s"] is not None


async def test_publisher_frames_match_vllm(kv_fleet: Fleet) -> None:
    """Raw replay frames as a non-gateway consumer sees them, in vLLM 0.34's form: topic, 8-byte
    seq, msgspec-decodable payload (the end marker with an empty topic and payload)."""
    pod = kv_fleet.pod("llama-0")
    ctx = zmq.asyncio.Context()
    dealer = ctx.socket(zmq.DEALER)
    try:
        async with httpx.AsyncClient(base_url=pod.url, timeout=10) as client:
            await _complete(client)
        dealer.connect(f"tcp://127.0.0.1:{pod.kv_replay_port}")
        await dealer.send_multipart((b"", (0).to_bytes(8, "big")))
        frames = []
        while True:
            assert await dealer.poll(10_000), "no replay answer"
            empty, topic, seq, payload = await dealer.recv_multipart()
            assert empty == b"" and len(seq) == 8
            if int.from_bytes(seq, "big", signed=True) == -1:
                assert payload == b"" == topic
                break
            assert topic == b"kv@127.0.0.1@llama"
            frames.append((int.from_bytes(seq, "big"), wire.decode_current(payload)))
        assert [s for s, _ in frames] == list(range(len(frames))) and frames
        stored = [e for _, b in frames for e in b.events if type(e).__name__ == "BlockStored"]
        assert stored and stored[0].parent_block_hash is None and stored[0].block_size == 16
        assert len(stored[0].token_ids) == 16 * len(stored[0].block_hashes)
        assert json.loads(json.dumps(KV))["topic"] == "kv@127.0.0.1@llama"
    finally:
        dealer.close(linger=0)
        ctx.destroy(linger=0)


async def test_epp_app_subscribes_discovered_pods(kv_fleet: Fleet, tmp_path: Path) -> None:
    """The EPP wires a subscriber to every pod with an events port, reports it in /debug/pool
    and /metrics, and drops it when the pod leaves the configuration."""
    pod, plain = kv_fleet.pod("llama-0"), kv_fleet.pod("plain")

    def write(endpoints: list[dict]) -> None:
        config = {
            "pools": [
                {
                    "name": "p",
                    "models": [{"name": "llama", "adapters": ["llama-sql"]}],
                    "endpoints": endpoints,
                    "kvEvents": {"maxBlocks": 5000},
                }
            ]
        }
        tmp = tmp_path / "gw.yaml.tmp"
        tmp.write_text(yaml.safe_dump(config))
        tmp.replace(tmp_path / "gw.yaml")

    with_events = {
        "address": pod.address,
        "kvEventsPort": pod.kv_events_port,
        "kvReplayPort": pod.kv_replay_port,
    }
    write([with_events, {"address": plain.address}])
    app = EppApp(tmp_path / "gw.yaml", "p")
    await app.start()
    try:
        assert app.kv_index.max_blocks == 5000
        async with httpx.AsyncClient(base_url=pod.url, timeout=10) as client:
            ids = await _tokens(client, prompt=PROMPT)
            await _complete(client)
        await until(lambda: app.kv_index.lookup(ids, "llama").get(pod.address, 0) > 0, "indexed via the app")
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{app.metrics_port}", timeout=10) as admin:
            debug = (await admin.get("/debug/pool")).json()["kv_events"]
            assert debug["precise"] == [pod.address] and plain.address not in debug["pods"]
            assert debug["no_events"] == [plain.address] and debug["approximate"] == []
            assert debug["index_max_blocks"] == 5000 and debug["index_blocks"] > 0
            metrics = (await admin.get("/metrics")).text
            assert "gateway_kv_index_blocks " in metrics
            assert f'gateway_kv_event_lag_seconds{{pod="{pod.address}"}}' in metrics
        write([{"address": plain.address}])
        assert app._watcher.check()  # the file watcher's reload, without waiting for its poll
        await until(lambda: app.kv_events.subscriber(pod.address) is None, "pod removed", within=30)
        assert app.kv_index.size() == 0
    finally:
        await app.stop()


def test_launcher_passes_event_ports_through() -> None:
    from devstack.launch import gateway_config_for
    from gateway.config import parse_config

    pods = [
        {
            "name": "a",
            "model": "llama",
            "address": "127.0.0.1:9001",
            "kv_events_port": 9101,
            "kv_replay_port": 9102,
        },
        {"name": "b", "model": "llama", "address": "127.0.0.1:9002"},
    ]
    config = parse_config(gateway_config_for(pods, {}))
    a, b = config.pool("llama").endpoints
    assert (a.kv_events_port, a.kv_replay_port) == (9101, 9102)
    assert (b.kv_events_port, b.kv_replay_port) == (None, None)
