"""Stub model-server pods that serve only `/metrics`, for scrape benchmarks at fleet scale.

    python -m bench.micro.metrics_stub --pods 100 [--idle]

Serves realistic vLLM pages (bench/micro/metric_pages.py, ~38 KB, the size of a real vLLM page)
on `--pods` loopback ports from one process and prints the ports as one JSON line. A raw
asyncio protocol writes pre-rendered responses (keep-alive, Content-Length): an aiohttp
stub (bench/micro/stub_server.py) costs several times more CPU per request, and at 1,000 pods
x 20 Hz the stubs would starve the EPP they are meant to measure. Busy pages rotate over a
few variants (queue lengths change between scrapes, as on a loaded server); `--idle` pages
show an idle pod and never change, which lets the scraper's cadence back off.

`stub_fleet(pods)` runs it in a child process, so its CPU never counts as the EPP's.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import subprocess
import sys
from collections.abc import Iterator

from bench.micro.metric_pages import PageSpec, vllm_page

BUSY_VARIANTS = 4


def responses(idle: bool) -> list[bytes]:
    """Complete HTTP/1.1 responses, one per page variant."""
    if idle:
        specs = [PageSpec(waiting=(0.0, 0.0), running=(0.0, 0.0), kv=(0.0, 0.0))]
    else:
        specs = [PageSpec(waiting=(3.0 + i, 1.0), running=(7.0, 2.0 + i)) for i in range(BUSY_VARIANTS)]
    out = []
    for spec in specs:
        body = vllm_page(spec)
        head = f"HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {len(body)}\r\n\r\n"
        out.append(head.encode() + body)
    return out


class _MetricsProtocol(asyncio.Protocol):
    def __init__(self, pages: list[bytes]) -> None:
        self.pages = pages
        self.served = 0
        self.buf = b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while (end := self.buf.find(b"\r\n\r\n")) >= 0:
            self.buf = self.buf[end + 4 :]
            self.served += 1
            assert self.transport is not None
            self.transport.write(self.pages[self.served % len(self.pages)])


async def serve(pods: int, idle: bool) -> None:
    loop = asyncio.get_running_loop()
    pages = responses(idle)
    ports = []
    for _ in range(pods):
        server = await loop.create_server(lambda: _MetricsProtocol(pages), "127.0.0.1", 0, backlog=1024)
        ports.append(server.sockets[0].getsockname()[1])
    print(json.dumps({"ports": ports, "page_bytes": len(pages[0])}), flush=True)
    await asyncio.Event().wait()


@contextlib.contextmanager
def stub_fleet(pods: int, idle: bool = False) -> Iterator[tuple[list[int], int]]:
    """(ports, page size in bytes) of `pods` stub pods served by a child process."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "bench.micro.metrics_stub",
            "--pods",
            str(pods),
            *(["--idle"] if idle else []),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError(f"metrics stub exited with {proc.wait()}")
        info = json.loads(line)
        yield info["ports"], info["page_bytes"]
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=1)
    parser.add_argument("--idle", action="store_true")
    args = parser.parse_args()
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(args.pods, args.idle))


if __name__ == "__main__":
    main()
