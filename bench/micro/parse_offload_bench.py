"""The scheduling process's CPU per request with and without the workers' parse (epp/requestcontrol/parse.py).

In one process, on a 4-pod picture with the default profile: the REQUEST frame decoded as the
scheduling process decodes it (extproc/ipc.py), then the decision, in two ways:
- "body": the frame carries the raw body only; the processor parses it (`on_request`), which is
  what the scheduling process did before the workers parsed;
- "parsed": the frame carries the raw body and the worker's parsed record (`on_prepared`).
Each request is closed after its decision (its in-flight slot returned). Per body size: CPU
microseconds per request (process time), median [min-max] over rounds.

python -m bench.micro.parse_offload_bench [--sizes 1024,32768] [--requests 2000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import Sequence

from epp.datalayer.endpoint_records import Endpoint, Metrics
from epp.datalayer.pool import Pool
from epp.requestcontrol.context import EppContext
from epp.requestcontrol.parse import WorkerParser
from epp.requestcontrol.processor import EppProcessor
from epp.requestcontrol.telemetry import Telemetry
from epp.scheduling.weighted import WeightedScheduler
from extproc import ipc
from gateway.config import parse_config

CONFIG = parse_config({"pools": [{"name": "llama", "models": [{"name": "llama"}]}]})
PODS = [f"10.0.0.{i}:8000" for i in range(1, 5)]


def make_ctx() -> EppContext:
    pool = Pool([Endpoint(a, frozenset({"llama"})) for a in PODS])
    for i, address in enumerate(PODS):
        pool.record_metrics(address, Metrics(waiting=0.0, kv_usage=0.05 * i, scraped_at=pool.clock()))
    return EppContext(
        "llama", pool, WeightedScheduler(CONFIG.scheduler_profiles()), lambda: CONFIG, Telemetry("llama")
    )


def body_of(size: int, i: int) -> bytes:
    """A chat request of about `size` bytes; one of 8 shared prefixes, then its own text."""
    base = {"model": "llama", "messages": [{"role": "user", "content": ""}], "max_tokens": 4, "stream": True}
    head = f"document {i % 8}: " + "lorem ipsum dolor sit amet " * (size // 54)
    tail = f" question {i}"
    base["messages"][0]["content"] = (head + tail)[: max(0, size - 100)]  # type: ignore[index]
    return json.dumps(base).encode()


async def measure(size: int, requests: int, parsed: bool) -> float:
    ctx = make_ctx()
    settings = {"max_body_bytes": CONFIG.bbr.max_body_bytes, "parse": ctx.parse_hints().to_wire()}
    parse = WorkerParser()
    frames = []
    for i in range(requests):  # the worker's side, not measured
        headers = {"x-request-id": f"r{i}", ":path": "/v1/chat/completions"}
        body = body_of(size, i)
        prepared = parse(headers, body, settings) if parsed else None
        frames.append(ipc.encode([ipc.REQUEST, i, headers, body, prepared]))
    decoder = ipc.FrameDecoder()
    started = time.process_time()
    for frame in frames:
        (message,) = decoder.feed(frame)
        _, _, headers, body, prepared = message
        processor = EppProcessor(ctx)
        if prepared is None:
            await processor.on_request(headers, body)
        else:
            await processor.on_prepared(headers, body, prepared)
        processor.on_close(True)
    return (time.process_time() - started) * 1e6 / requests


def spread(values: Sequence[float]) -> str:
    ordered = sorted(values)
    return f"{ordered[len(ordered) // 2]:.0f} [{ordered[0]:.0f}-{ordered[-1]:.0f}]"


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m bench.micro.parse_offload_bench", description=__doc__.split("\n")[0]
    )
    ap.add_argument("--sizes", default="1024,32768")
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args(argv)
    print("| body | scheduling process CPU us/req, body parsed there | with the worker's parse | saved |")
    print("|---|---|---|---|")
    for size in (int(s) for s in args.sizes.split(",")):
        before, after = [], []
        for _ in range(args.rounds):  # interleaved
            before.append(asyncio.run(measure(size, args.requests, parsed=False)))
            after.append(asyncio.run(measure(size, args.requests, parsed=True)))
        saved = [b - a for b, a in zip(before, after, strict=True)]
        print(f"| {size // 1024} KB | {spread(before)} | {spread(after)} | {spread(saved)} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
