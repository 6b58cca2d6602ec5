"""Scrape cost at fleet scale: EPP process CPU per pod per scrape, against stub pods.

    python -m bench.micro.scrape_bench clients [--requests 2000] [--repeat 5] [--event-loop uvloop]
    python -m bench.micro.scrape_bench fleet --pods 100 --hz 20 [--seconds 5] [--repeat 3] [--idle]

`clients` compares HTTP clients on one stub pod (sequential GETs of a 38 KB vLLM page):
httpx, aiohttp and epp/datalayer/metrics_http.py, then where `scrape_once`'s CPU goes: the parse alone,
`scrape_once` on a canned page (parse, speed histograms, pool update; no I/O) and the whole
`scrape_once` (more than the GET plus the canned figure: the parse then runs on caches that
went cold while the process waited). `fleet` runs the real `Scraper` over `--pods` stub pods
at `--hz` for `--seconds` and reports the cores it used and the CPU per scrape. Both run on
the event loop the EPP runs on (`--event-loop`, uvloop by default, as `python -m epp`).

Every figure is CPU time of this process (time.process_time), never wall time: the
stub pods run in a child process (bench/micro/metrics_stub.py) so their CPU is excluded, and CPU
time is what stays meaningful on a shared, overloaded machine. Each figure is repeated;
the median and the min-max spread are printed.
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import json
import os
import resource
import statistics
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import asdict, dataclass
from typing import Any, TypeVar

from bench.micro.metrics_stub import responses, stub_fleet
from epp.datalayer.endpoint_records import Endpoint
from epp.datalayer.metric_dialects import parse_metrics
from epp.datalayer.pool import Pool
from epp.datalayer.scrape import SPEED_SERIES, Scraper, SpeedTracker

T = TypeVar("T")
EVENT_LOOPS = ("uvloop", "asyncio")


def run_on(event_loop: str, coro: Coroutine[Any, Any, T]) -> T:
    """`coro` on the named loop, chosen the way the EPP chooses its own."""
    try:
        from gateway.service_cli import event_loop_factory
    except ImportError:  # a tree from before --event-loop: asyncio's loop only
        return asyncio.run(coro)
    with asyncio.Runner(loop_factory=event_loop_factory(event_loop)) as runner:
        return runner.run(coro)


def cpu_s() -> float:
    """CPU time of this process, user + system, all threads (os.times ticks at 10 ms: too coarse)."""
    return time.process_time()


def sys_s() -> float:
    """The kernel's share of it (loopback TCP, epoll): a scrape's cost, not Python's."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_stime


@dataclass(frozen=True)
class Spread:
    median: float
    low: float
    high: float

    @classmethod
    def of(cls, values: list[float]) -> Spread:
        return cls(statistics.median(values), min(values), max(values))

    def __str__(self) -> str:
        return f"{self.median:.1f} ({self.low:.1f}-{self.high:.1f})"


async def _per_call_cpu_us(call: Callable[[], Awaitable[object]], requests: int) -> float:
    for _ in range(min(50, requests)):  # warm-up: connection opened, caches filled
        await call()
    start = cpu_s()
    for _ in range(requests):
        await call()
    return (cpu_s() - start) / requests * 1e6


CLIENTS = ("httpx", "aiohttp", "metrics_http", "parse", "scrape_no_get", "scrape_once")
LABELS = {
    "httpx": "httpx GET",
    "aiohttp": "aiohttp GET",
    "metrics_http": "metrics_http GET",
    "parse": "parse_metrics of the page (+ histograms)",
    "scrape_no_get": "scrape_once minus the GET",
    "scrape_once": "scrape_once (GET + parse + record)",
}


class _CannedPages:
    """A client that returns the stub's pages without I/O: scrape_once's cost minus the GET."""

    def __init__(self, pages: list[bytes]) -> None:
        self.pages, self.n = pages, 0

    async def get(self, host: str, port: int, path: str, timeout_s: float | None = None) -> bytes:
        self.n += 1
        return self.pages[self.n % len(self.pages)]

    async def aclose(self) -> None:
        pass


async def _clients_round(port: int, requests: int, only: tuple[str, ...] = CLIENTS) -> dict[str, float]:
    """us of CPU per call for each client in `only`, each over its own kept-alive connection."""
    import aiohttp
    import httpx

    url = f"http://127.0.0.1:{port}/metrics"
    out: dict[str, float] = {}
    if "httpx" in only:
        async with httpx.AsyncClient() as hx:

            async def httpx_get() -> object:
                return (await hx.get(url)).content

            out["httpx"] = await _per_call_cpu_us(httpx_get, requests)
    if "aiohttp" in only:
        async with aiohttp.ClientSession() as session:

            async def aiohttp_get() -> object:
                async with session.get(url) as r:
                    return await r.read()

            out["aiohttp"] = await _per_call_cpu_us(aiohttp_get, requests)
    if "metrics_http" in only:
        from epp.datalayer.metrics_http import MetricsHttpClient  # absent before the hand-written client

        raw = MetricsHttpClient(timeout_s=5)

        async def raw_get() -> object:
            return await raw.get("127.0.0.1", port, "/metrics")

        out["metrics_http"] = await _per_call_cpu_us(raw_get, requests)
        await raw.aclose()
    pages = [r.split(b"\r\n\r\n", 1)[1] for r in responses(idle=False)]  # what the stub serves
    if "parse" in only:
        also = tuple(name for series in SPEED_SERIES["vllm"] if series for name in series)
        count = iter(range(1 << 62))

        async def parse() -> object:
            page = pages[next(count) % len(pages)]
            return parse_metrics(page, "vllm", 0.0, rejected=[], also=also, also_found={})

        out["parse"] = await _per_call_cpu_us(parse, requests)
    if "scrape_no_get" in only:
        pool = Pool([Endpoint(f"127.0.0.1:{port}", frozenset({"m"}))])
        canned = Scraper(pool, timeout_s=5, client=_CannedPages(pages))  # type: ignore[arg-type]
        ep, speed = pool.endpoints()[0], SpeedTracker()

        async def scrape_no_get() -> object:
            return await canned.scrape_once(ep, speed)

        out["scrape_no_get"] = await _per_call_cpu_us(scrape_no_get, requests)
    if "scrape_once" in only:
        pool = Pool([Endpoint(f"127.0.0.1:{port}", frozenset({"m"}))])
        scraper = Scraper(pool, timeout_s=5)
        ep, speed = pool.endpoints()[0], SpeedTracker()

        async def scrape() -> object:
            return await scraper.scrape_once(ep, speed)

        out["scrape_once"] = await _per_call_cpu_us(scrape, requests)
        await scraper.stop()
    return out


def run_clients(
    requests: int, repeat: int, only: tuple[str, ...] = CLIENTS, event_loop: str = "asyncio"
) -> dict[str, Spread]:
    rounds: list[dict[str, float]] = []
    with stub_fleet(1) as (ports, page_bytes):
        print(f"page: {page_bytes} bytes; {requests} sequential GETs per client per round, {repeat} rounds")
        for _ in range(repeat):
            rounds.append(run_on(event_loop, _clients_round(ports[0], requests, only)))
    return {k: Spread.of([r[k] for r in rounds]) for k in rounds[0]}


@dataclass(frozen=True)
class FleetRound:
    pods: int
    seconds: float
    scrapes: int
    failures: int
    cpu_s: float
    sys_s: float

    @property
    def cores(self) -> float:
        return self.cpu_s / self.seconds

    @property
    def us_per_scrape(self) -> float:
        return self.cpu_s / max(1, self.scrapes) * 1e6

    @property
    def hz_per_pod(self) -> float:
        return self.scrapes / self.seconds / self.pods


async def _fleet_round(
    ports: list[int], hz: float, seconds: float, max_interval_ms: int | None
) -> FleetRound:
    pool = Pool([Endpoint(f"127.0.0.1:{p}", frozenset({"m"})) for p in ports])
    kwargs: dict[str, float] = {"interval_s": 1.0 / hz, "timeout_s": 2.0}
    if "max_interval_s" in inspect.signature(Scraper).parameters:  # absent before adaptive cadence
        kwargs["max_interval_s"] = (max_interval_ms or 1000.0 / hz) / 1000.0
    scraper = Scraper(pool, **kwargs)  # type: ignore[arg-type]
    scraper.sync()
    await asyncio.sleep(min(2.0, seconds / 2))  # warm-up: connections opened, phases spread
    scrapes, failures, cpu, kernel, wall = (
        scraper.scrapes,
        scraper.failures,
        cpu_s(),
        sys_s(),
        time.monotonic(),
    )
    await asyncio.sleep(seconds)
    result = FleetRound(
        pods=len(ports),
        seconds=time.monotonic() - wall,
        scrapes=scraper.scrapes - scrapes,
        failures=scraper.failures - failures,
        cpu_s=cpu_s() - cpu,
        sys_s=sys_s() - kernel,
    )
    await scraper.stop()
    return result


def run_fleet(
    pods: int,
    hz: float,
    seconds: float,
    repeat: int,
    idle: bool,
    max_interval_ms: int | None,
    event_loop: str = "asyncio",
) -> list[FleetRound]:
    with stub_fleet(pods, idle=idle) as (ports, _):
        return [run_on(event_loop, _fleet_round(ports, hz, seconds, max_interval_ms)) for _ in range(repeat)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="mode", required=True)
    c = sub.add_parser("clients")
    c.add_argument("--requests", type=int, default=2000)
    c.add_argument("--repeat", type=int, default=5)
    c.add_argument("--only", default=",".join(CLIENTS), help=f"comma-separated subset of {','.join(CLIENTS)}")
    f = sub.add_parser("fleet")
    f.add_argument("--pods", type=int, default=100)
    f.add_argument("--hz", type=float, default=20.0)
    f.add_argument("--seconds", type=float, default=5.0)
    f.add_argument("--repeat", type=int, default=3)
    f.add_argument("--idle", action="store_true", help="idle, unchanging pages (the cadence backs off)")
    f.add_argument(
        "--max-interval-ms", type=int, default=None, help="idle bound; default = the fast interval"
    )
    f.add_argument("--json", action="store_true")
    for sub_parser in (c, f):
        sub_parser.add_argument("--event-loop", choices=EVENT_LOOPS, default="uvloop", help="as the EPP's")
    args = parser.parse_args()
    load = os.getloadavg()
    print(
        f"load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f} on {os.cpu_count()} CPUs; {args.event_loop} loop"
    )
    if args.mode == "clients":
        only = tuple(args.only.split(","))
        for name, spread in run_clients(args.requests, args.repeat, only, args.event_loop).items():
            print(f"{LABELS[name]:>36}: {spread} us CPU per call (median, min-max)")
        return
    rounds = run_fleet(
        args.pods, args.hz, args.seconds, args.repeat, args.idle, args.max_interval_ms, args.event_loop
    )
    if args.json:
        print(json.dumps([asdict(r) for r in rounds]))
    for r in rounds:
        print(
            f"pods={r.pods} target={args.hz:g} Hz: {r.hz_per_pod:.1f} scrapes/s/pod, {r.cores:.3f} cores, "
            f"{r.us_per_scrape:.0f} us CPU/scrape ({r.sys_s / r.cpu_s:.0%} kernel), {r.failures} failures"
        )
    cores = Spread.of([r.cores for r in rounds])
    per = Spread.of([r.us_per_scrape for r in rounds])
    rate = Spread.of([r.hz_per_pod for r in rounds])
    print(f"median (min-max) over {len(rounds)}: cores {cores.median:.3f} ({cores.low:.3f}-{cores.high:.3f}), "
          f"us CPU/scrape {per}, scrapes/s/pod {rate}")  # fmt: skip


if __name__ == "__main__":
    main()
