"""Which files of this repository one warm request runs code in, and how many distinct lines
of each (docs/architecture.md, "One request through the EPP, file by file"; issue #54).

`sys.settrace` over `EppProcessor.on_request` to `on_close` of the last of a few requests of the
default profile in one process: two pods (metrics recorded, no LoRA), no flow control, no P/D,
no tokenizer. The ext_proc layer under it (extproc/server.py, stream.py, messages.py) is not
traced here: it runs around the processor, per message.

    python -m tools.request_walk
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections import defaultdict
from pathlib import Path
from types import FrameType
from typing import Any

from epp.datalayer.endpoint_records import Endpoint, Metrics
from epp.datalayer.pool import Pool
from epp.requestcontrol.context import EppContext
from epp.requestcontrol.processor import EppProcessor
from epp.requestcontrol.telemetry import Telemetry
from epp.scheduling.weighted import WeightedScheduler
from gateway.config import parse_config

ROOT = Path(__file__).resolve().parents[1]
CONFIG = parse_config({"pools": [{"name": "llama", "models": [{"name": "llama"}]}]})
PODS = ("10.0.0.1:8000", "10.0.0.2:8000")


def context() -> EppContext:
    pool = Pool([Endpoint(a, frozenset({"llama"})) for a in PODS])
    for i, address in enumerate(PODS):
        pool.record_metrics(address, Metrics(waiting=float(i), kv_usage=0.1 * i, scraped_at=pool.clock()))
    scheduler = WeightedScheduler(CONFIG.scheduler_profiles())
    return EppContext("llama", pool, scheduler, lambda: CONFIG, Telemetry("llama"))


def body(i: int) -> bytes:
    content = "You are a helpful assistant. " * 40 + f"question {i}"
    return json.dumps({"model": "llama", "messages": [{"role": "user", "content": content}]}).encode()


async def walk(warm: int = 5) -> dict[str, int]:
    ctx = context()
    for i in range(warm):
        processor = EppProcessor(ctx)
        await processor.on_request({"x-request-id": f"w{i}", ":path": "/v1/chat/completions"}, body(i))
        processor.on_close(True)
    lines: dict[str, set[int]] = defaultdict(set)

    def tracer(frame: FrameType, event: str, arg: Any) -> Any:
        path = Path(frame.f_code.co_filename)
        if path.is_relative_to(ROOT) and not {".venv", "tools"} & set(path.relative_to(ROOT).parts):
            lines[path.relative_to(ROOT).as_posix()].add(frame.f_lineno)
        return tracer

    processor = EppProcessor(ctx)
    sys.settrace(tracer)
    try:
        await processor.on_request({"x-request-id": "traced", ":path": "/v1/chat/completions"}, body(warm))
        processor.on_close(True)
    finally:
        sys.settrace(None)
    return {path: len(seen) for path, seen in sorted(lines.items())}


def main() -> None:
    files = asyncio.run(walk())
    for path, count in files.items():
        print(f"{count:5d}  {path}")
    print(f"{len(files)} files")


if __name__ == "__main__":
    main()
