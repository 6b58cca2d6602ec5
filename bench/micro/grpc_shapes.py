"""The gRPC server shape's own floor (issue #52): a do-nothing ext_proc written directly on
grpc.aio (an async generator of answers) and on the threaded `grpc.server`, each behind Envoy in
the single-hop shape (request body FULL_DUPLEX_STREAMED, response trailers sent), 1 KB bodies
at concurrency 1, interleaved per round. Neither goes through extproc/'s servicer: this is what
Python gRPC costs per three-message stream before any code of ours.

    python -m bench.micro.grpc_shapes measure sync,aio ROUNDS REQUESTS OUT.json
    python -m bench.micro.grpc_shapes serve sync|aio PORT      # one server alone
"""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import tempfile
import time
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc

from bench.micro import overhead_gateway as og
from bench.micro.noop_floor import measured
from devstack.launch import free_port
from extproc import messages


def answer(msg: Any) -> list[Any]:
    """The protocol's do-nothing answer to each message (the body re-emitted, as
    FULL_DUPLEX_STREAMED requires)."""
    kind = msg.WhichOneof("request")
    if kind == "request_headers":
        return [pb.ProcessingResponse(request_headers=pb.HeadersResponse())]
    if kind == "request_body":
        b = msg.request_body
        return [_body(b.body, b.end_of_stream)]
    if kind == "request_trailers":
        return [messages.request_trailers_response()]
    if kind == "response_headers":
        return [messages.continue_response_headers()]
    if kind == "response_trailers":
        return [messages.continue_response_trailers()]
    return [messages.continue_response_body()]


def _body(chunk: bytes, eos: bool) -> Any:
    r = pb.ProcessingResponse()
    m = r.request_body.response.body_mutation.streamed_response
    m.body = chunk
    m.end_of_stream = eos
    return r


class SyncNoop(pb_grpc.ExternalProcessorServicer):
    def Process(self, it, context):
        for msg in it:
            yield from answer(msg)


class AioNoop(pb_grpc.ExternalProcessorServicer):
    async def Process(self, it, context):
        async for msg in it:
            for r in answer(msg):
                yield r


def serve(kind, port):
    if kind == "sync":
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=16))
        pb_grpc.add_ExternalProcessorServicer_to_server(SyncNoop(), server)
        server.add_insecure_port(f"127.0.0.1:{port}")
        server.start()
        server.wait_for_termination()
    else:
        try:
            import uvloop

            uvloop.install()
        except ImportError:
            pass

        async def main():
            server = grpc.aio.server()
            pb_grpc.add_ExternalProcessorServicer_to_server(AioNoop(), server)
            server.add_insecure_port(f"127.0.0.1:{port}")
            await server.start()
            await server.wait_for_termination()

        asyncio.run(main())


def start_server(kind: str) -> tuple[subprocess.Popen[bytes], int]:
    """One do-nothing server in its own process, once it serves."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "bench.micro.grpc_shapes", "serve", kind, str(port)])
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return proc, port
        except OSError:  # not listening yet
            time.sleep(0.1)
    proc.terminate()
    raise TimeoutError(f"{kind} ext_proc did not start")


async def measure(kinds: list[str], rounds: int, requests: int) -> list[dict[str, Any]]:
    work = Path(tempfile.mkdtemp(prefix="shapes-"))
    stub_proc, stub = await og.start_stub(4)
    procs: dict[str, subprocess.Popen[bytes]] = {}
    setups: dict[str, og.Setup] = {}
    try:
        for k in kinds:
            procs[k], port = await asyncio.to_thread(start_server, k)
            setups[k] = await og.start_envoy_setup(
                k, work / f"envoy-{k}", stub, ("127.0.0.1", port), "NONE", "SEND"
            )
        rows: list[dict[str, Any]] = []
        for r in range(rounds):
            for k in kinds:
                cell = await measured(setups[k], procs[k].pid, list(setups[k].pids)[:1], 1024, requests)
                rows.append({"round": r + 1, "kind": k, **cell})
                print(json.dumps(rows[-1]), flush=True)
        return rows
    finally:
        for setup in setups.values():
            setup.stop()
        for proc in procs.values():
            proc.terminate()
        stub_proc.terminate()
        await stub_proc.wait()


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        serve(sys.argv[2], int(sys.argv[3]))
    else:
        rows = asyncio.run(measure(sys.argv[2].split(","), int(sys.argv[3]), int(sys.argv[4])))
        Path(sys.argv[5]).write_text(json.dumps(rows, indent=1))
