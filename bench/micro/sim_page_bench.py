"""Time to write one simulated pod's /metrics page: modelsim's writer vs prometheus_client's.

    python -m bench.micro.sim_page_bench [--pages 500]

The simulated fleet renders every pod's page in the process that runs all the engines, so a
page's cost there slows every pod's steps (docs/benchmarks/history.md, "Harness changes before the reporting runs").
Prints ms per page (best of 3 passes) per dialect for both writers on an idle engine.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Callable, Sequence

from prometheus_client import CollectorRegistry, generate_latest

from modelsim.clock import SimClock
from modelsim.engine import Engine
from modelsim.metrics import DIALECTS, make_registry, render
from modelsim.profiles import builtin_profiles


def _ms_per_page(
    write: Callable[[CollectorRegistry], bytes], registry: CollectorRegistry, pages: int
) -> float:
    best = float("inf")
    for _ in range(3):
        started = time.perf_counter()
        for _ in range(pages):
            write(registry)
        best = min(best, (time.perf_counter() - started) / pages * 1e3)
    return best


async def _run(pages: int) -> None:
    engine = Engine(builtin_profiles()["h100x2-qwen3-32b"], SimClock(1.0), model="m", seed=1)
    for dialect in DIALECTS:
        registry = make_registry(engine, "m", dialect)
        ours, lib = _ms_per_page(render, registry, pages), _ms_per_page(generate_latest, registry, pages)
        size = len(render(registry))
        print(f"{dialect}: {size:,} bytes, modelsim {ours:.3f} ms, prometheus_client {lib:.3f} ms per page")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.micro.sim_page_bench")
    parser.add_argument("--pages", type=int, default=500)
    asyncio.run(_run(parser.parse_args(argv).pages))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
