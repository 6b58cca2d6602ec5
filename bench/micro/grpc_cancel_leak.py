"""Reproduce BBR's native memory growth without Envoy: ext_proc streams that the client resets.

`python -m bench.micro.grpc_cancel_leak --streams 4000` runs BBR's real servicer in a child process
and drives it from a grpc.aio client, once with streams the client cancels after the reply
(what Envoy does to every BBR stream) and once with streams it half-closes. It prints the
server's glibc malloc in-use growth per stream (see docs/reliability.md, soak section; the
mechanism is grpc/grpc#43360).
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import time
from collections.abc import AsyncIterator

import grpc
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc

from devstack.launch import free_port, grpc_serving, wait_until


def _get_request() -> pb.ProcessingRequest:
    headers = [
        base_pb2.HeaderValue(key=":method", raw_value=b"GET"),
        base_pb2.HeaderValue(key=":path", raw_value=b"/"),
    ]
    return pb.ProcessingRequest(
        request_headers=pb.HttpHeaders(headers=base_pb2.HeaderMap(headers=headers), end_of_stream=True)
    )


async def _serve(port: int) -> None:
    """BBR's servicer; prints malloc in-use KiB for each line read on stdin."""
    from bbr.router import BodyRouter
    from bbr.service import BbrProcessor
    from extproc.server import start_grpc_service
    from extproc.stream import ExtProcServicer
    from gateway.config import parse_config
    from gateway.heaptrace import malloc_kib

    config = parse_config({"pools": [{"name": "p", "models": [{"name": "m"}]}]})
    router = BodyRouter(lambda: config)
    servicer = ExtProcServicer(lambda: BbrProcessor(router, lambda: config), name="bbr")
    service = await start_grpc_service(
        servicer, host="127.0.0.1", port=port
    )  # keep it: unreferenced, it stops
    loop = asyncio.get_running_loop()
    while await loop.run_in_executor(None, sys.stdin.readline):
        print(malloc_kib()["malloc_in_use_kib"], flush=True)
    await service.drain_and_stop(0)


async def _requests(hold: asyncio.Event | None) -> AsyncIterator[pb.ProcessingRequest]:
    yield _get_request()
    if hold is not None:  # keep the request side open, as Envoy does, until the reset
        await hold.wait()


async def _streams(port: int, count: int, *, cancel: bool) -> None:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = pb_grpc.ExternalProcessorStub(channel)
        for _ in range(count):
            release = asyncio.Event()

            call = stub.Process(_requests(release if cancel else None))
            await call.read()
            if cancel:
                call.cancel()
                release.set()
            await call.code()


def _measure(count: int, *, cancel: bool) -> float:
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "bench.micro.grpc_cancel_leak", "--serve", str(port)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        wait_until(lambda: grpc_serving(port), 60, "server", server)

        def in_use() -> int:
            assert server.stdin and server.stdout
            server.stdin.write("\n")
            server.stdin.flush()
            return int(server.stdout.readline())

        asyncio.run(_streams(port, 500, cancel=cancel))  # warm-up
        time.sleep(0.5)
        before = in_use()
        asyncio.run(_streams(port, count, cancel=cancel))
        time.sleep(0.5)
        return 1024 * (in_use() - before) / count
    finally:
        server.terminate()
        server.wait(10)


def main() -> None:
    parser = argparse.ArgumentParser(description="grpc.aio native growth on client-cancelled streams")
    parser.add_argument("--streams", type=int, default=4000)
    parser.add_argument("--serve", type=int, metavar="PORT", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        asyncio.run(_serve(args.serve))
        return
    for cancel in (True, False):
        per_stream = _measure(args.streams, cancel=cancel)
        how = "cancelled by the client" if cancel else "half-closed by the client"
        print(f"{args.streams} streams {how}: server malloc in use +{per_stream:.0f} bytes/stream")


if __name__ == "__main__":
    main()
