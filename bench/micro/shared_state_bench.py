"""What one shared-state cycle (publish ours + read the peers', epp/datalayer/shared_state.py) costs the
EPP's event loop, against a real private redis-server on loopback.

Per setup (pods in the pool x peer replicas whose hashes the call reads back): this replica
routes one request per cycle (its counts change, so every cycle publishes; with the prefix
index one routing decision goes into the stream) and each peer appends one decision that
this replica reads and learns; then `sync_once` is timed. Reported per cycle: the event-loop
thread's CPU (`time.thread_time`, the figure that delays ext_proc messages queued behind
it), the whole process's CPU (`time.process_time`: the same unless work moved to another
thread) and the wall time of the round trip. The peers' writes happen between the timed
calls with a separate blocking client and are not counted. Each setup is run `--repeats`
times, the setups taking turns, and min / median over the repeats are printed: the machine
may be shared, which inflates every figure alike.

With `--scrape-share F` (shareScrapes) the peers also append F x pods scrape entries per
cycle in total, which the timed call reads, decodes and records: at the defaults (scrape every
50 ms, spread over the replicas; a 20 ms cycle) the pool's scrapes reach each replica at about
0.4 per pod per cycle.

python -m bench.micro.shared_state_bench [--pods 16 100] [--peers 1 3] [--cycles 2000] [--repeats 3]
    [--event-loop uvloop|asyncio] [--scrape-share 0.4]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from statistics import median

import msgpack
import redis
from prometheus_client import CollectorRegistry

from devstack.redis_server import start_redis
from epp.datalayer.endpoint_records import Endpoint, Metrics
from epp.datalayer.pool import Pool
from epp.datalayer.prefix_index import PrefixIndex
from epp.datalayer.shared_state import SharedState
from epp.datalayer.shared_state_wire import encode_scrape
from gateway.config import SharedStateConfig
from gateway.service_cli import add_event_loop_argument, event_loop_factory

WARMUP = 50


@dataclass
class Cycle:
    loop_cpu_us: float
    process_cpu_us: float
    wall_us: float


def _pool(pods: int) -> Pool:
    return Pool([Endpoint(f"10.0.{i // 250}.{i % 250 + 1}:8000", frozenset({"m"})) for i in range(pods)])


async def measure(url: str, pods: int, peers: int, cycles: int, tag: str, scrape_share: float = 0.0) -> Cycle:
    # A generous timeout: this measures the cost of a cycle, and a loaded machine can stall one.
    config = SharedStateConfig.model_validate(
        {"redis": url, "ttlMs": 60_000, "timeoutMs": 5000, "keyPrefix": tag}
    )
    addresses = [e.address for e in _pool(pods).endpoints()]
    others = []
    for n in range(peers):  # peers with something in flight on every pod, read back each cycle
        peer_pool = _pool(pods)
        for a in addresses:
            peer_pool.on_routed(a, 100 + n)
        peer = SharedState(peer_pool, "p", config, CollectorRegistry(), replica_id=f"peer{n}")
        assert await peer.sync_once(), "peer could not publish"
        others.append(peer)
    pool, index = _pool(pods), PrefixIndex()
    for a in addresses:
        pool.on_routed(a, 50)
    shared = SharedState(
        pool,
        "p",
        config,
        CollectorRegistry(),
        replica_id="me",
        prefix_index=index,
        on_scrape=lambda address, metrics, _: pool.record_metrics(address, metrics),
    )
    per_cycle = round(scrape_share * pods)
    scraped = Metrics(
        waiting=2,
        running=30,
        kv_usage=0.5,
        running_adapters=frozenset({"a", "b"}),
        max_lora=4,
        block_size=16,
        num_gpu_blocks=20_000,
    )
    hashes = index.hashes("m", "a shared system prompt of some length " * 20)
    blob = msgpack.packb([[addresses[0], list(hashes)]])
    writer = redis.Redis.from_url(url)
    stream = f"{tag}:{{p}}:prefix"
    loop_cpu = process_cpu = wall = 0.0
    for i in range(WARMUP + cycles):
        pod = addresses[i % pods]
        pool.on_routed(pod, 10)  # counts change: the cycle publishes
        index.add(pod, hashes)  # one routing decision of ours
        for n in range(peers):  # and one of each peer's, read back by this cycle
            writer.xadd(stream, {"r": f"peer{n}", "b": blob}, maxlen=1000, approximate=True)
        if per_cycle:  # the peers' scrapes of this cycle, in one entry (not timed)
            wall_now, mono = time.time(), time.monotonic()
            entries = [
                encode_scrape(addresses[(i + k) % pods], scraped, mono, wall_now, mono)
                for k in range(per_cycle)
            ]
            writer.xadd(stream, {"r": "peer0", "s": msgpack.packb(entries)}, maxlen=1000, approximate=True)
        t0, p0, w0 = time.thread_time(), time.process_time(), time.perf_counter()
        ok = await shared.sync_once()
        t1, p1, w1 = time.thread_time(), time.process_time(), time.perf_counter()
        assert ok, "round trip failed"
        pool.on_finished(pod, 10)
        if i >= WARMUP:
            loop_cpu, process_cpu, wall = loop_cpu + t1 - t0, process_cpu + p1 - p0, wall + w1 - w0
    assert len(shared.peers) == peers and shared.learned >= cycles * peers
    assert shared.scrapes_learned >= cycles * per_cycle
    writer.close()
    for s in (shared, *others):
        await s.stop()
    scale = 1e6 / cycles
    return Cycle(loop_cpu * scale, process_cpu * scale, wall * scale)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--pods", type=int, nargs="+", default=[16, 100])
    parser.add_argument("--peers", type=int, nargs="+", default=[1, 3])
    parser.add_argument("--cycles", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--scrape-share", type=float, default=0.0, help="peers' scrapes per pod per cycle")
    add_event_loop_argument(parser)  # the EPP's own choice and default (uvloop)
    args = parser.parse_args()
    factory = event_loop_factory(args.event_loop)
    setups = [(pods, peers) for pods in args.pods for peers in args.peers]
    results: dict[tuple[int, int], list[Cycle]] = {s: [] for s in setups}
    with tempfile.TemporaryDirectory() as tmp:
        server = start_redis(Path(tmp))
        try:
            for r in range(args.repeats):
                for pods, peers in setups:
                    tag = f"bench{r}x{pods}x{peers}"
                    with asyncio.Runner(loop_factory=factory) as runner:
                        results[pods, peers].append(
                            runner.run(measure(server.url, pods, peers, args.cycles, tag, args.scrape_share))
                        )
        finally:
            server.stop()
    try:
        import hiredis  # noqa: F401

        parser_name = "hiredis"
    except ImportError:
        parser_name = "pure Python"
    loop_name = "asyncio" if factory is None else args.event_loop
    print(
        f"event loop: {loop_name}; reply parser: {parser_name}; {args.cycles} cycles x {args.repeats} repeats;"
        f" peers' scrapes per pod per cycle: {args.scrape_share};"
        " per cycle, min / median:"
    )
    print("| pods | peers | event-loop CPU us | process CPU us | wall us |")
    print("|---|---|---|---|---|")
    for (pods, peers), runs in results.items():
        cells = []
        for field in ("loop_cpu_us", "process_cpu_us", "wall_us"):
            values = [getattr(c, field) for c in runs]
            cells.append(f"{min(values):.0f} / {median(values):.0f}")
        print(f"| {pods} | {peers} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
