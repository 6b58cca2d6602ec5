"""Microbenchmark: the EPP's KV-event path (decode + index) in events and blocks per CPU second.

    python -m bench.micro.kv_events_bench [--pods 8] [--batches 4000] [--max-blocks 200000]

Batches are what a busy vLLM engine sends per step, encoded by modelsim's publisher encoder:
one ``BlockStored`` of a new prompt's blocks (``--blocks`` x 16 tokens, chained on a shared
prefix) and, once the engine is full, one ``BlockRemoved`` per evicted block. Each batch is
decoded (`epp.datalayer.kv_event_batches.decode_batch`) and folded into a bounded `KVIndex` (`apply_batch`),
round-robin over ``--pods`` pods; CPU time (``time.process_time``), best of 3 rounds.
"""

from __future__ import annotations

import argparse
import random
import time

from epp.datalayer.kv_event_batches import apply_batch, decode_batch
from epp.datalayer.kv_index import KVIndex
from modelsim.kv_events import block_removed, block_stored, encode_batch

BLOCK = 16


def make_payloads(n: int, blocks: int, engine_blocks: int, seed: int = 0) -> tuple[list[bytes], int, int]:
    """Payloads of one engine's stream; returns them with the event and block counts."""
    rng = random.Random(seed)
    payloads: list[bytes] = []
    resident: list[int] = []
    next_hash = 1
    events = stored_blocks = 0
    for _ in range(n):
        batch = []
        hashes = list(range(next_hash, next_hash + blocks))
        next_hash += blocks
        tokens = [rng.randrange(128_000) for _ in range(blocks * BLOCK)]
        # the engine evicts least recently used blocks before storing new ones
        while len(resident) + blocks > engine_blocks:
            batch.append(block_removed([resident.pop(0)]))
        batch.append(block_stored(hashes, None, tokens, BLOCK, None))
        resident.extend(hashes)
        stored_blocks += blocks
        events += len(batch)
        payloads.append(encode_batch(time.time(), batch))
    return payloads, events, stored_blocks


def run(pods: int, batches: int, blocks: int, engine_blocks: int, max_blocks: int) -> dict[str, float]:
    names = [f"10.0.0.{i}:8000" for i in range(pods)]
    streams = [make_payloads(batches // pods, blocks, engine_blocks, seed=i) for i in range(pods)]
    events = sum(s[1] for s in streams)
    stored = sum(s[2] for s in streams)
    # interleaved as the pods' steps arrive: (pod, payload) in round-robin order
    work = [(names[p], streams[p][0][i]) for i in range(batches // pods) for p in range(pods)]
    batches = len(work)
    best = float("inf")
    size = 0
    for _ in range(3):
        index = KVIndex(max_blocks)
        for name in names:
            index.add_pod(name, "m")
        start = time.process_time()
        for name, payload in work:
            apply_batch(index, name, decode_batch(payload))
        best = min(best, time.process_time() - start)
        size = index.size()
    # lookup: the last prompt of pod 0 (fully held) through all pods, blocks x 16 tokens
    prompt = decode_batch(streams[0][0][-1]).events[-1].token_ids  # type: ignore[union-attr]
    n = 2000
    start = time.process_time()
    for _ in range(n):
        index.lookup(prompt, "m")
    lookup_us = (time.process_time() - start) / n * 1e6
    return {
        "cpu_s": best,
        "batches_per_s": batches / best,
        "events_per_s": events / best,
        "blocks_per_s": stored / best,
        "index_entries": size,
        "lookup_us": lookup_us,
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pods", type=int, default=8)
    ap.add_argument("--batches", type=int, default=4000)
    ap.add_argument("--blocks", type=int, default=8, help="blocks stored per batch")
    ap.add_argument("--engine-blocks", type=int, default=2000, help="KV blocks per engine (evictions)")
    ap.add_argument("--max-blocks", type=int, default=200_000, help="index bound")
    args = ap.parse_args(argv)
    r = run(args.pods, args.batches, args.blocks, args.engine_blocks, args.max_blocks)
    print(
        f"{args.batches} batches, {args.blocks} blocks x {BLOCK} tokens each, {args.pods} pods: "
        f"{r['cpu_s']:.3f} CPU s -> {r['batches_per_s']:,.0f} batches/s, {r['events_per_s']:,.0f} events/s, "
        f"{r['blocks_per_s']:,.0f} stored blocks/s per core; index {r['index_entries']:,} entries; lookup of a {args.blocks}-block prompt over {args.pods} pods: {r['lookup_us']:.1f} us"
    )


if __name__ == "__main__":
    main()
