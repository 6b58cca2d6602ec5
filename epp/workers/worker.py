"""One ext_proc worker of a multi-core EPP (epp/workers/processes.py starts them; not run by hand).

`python -m epp.workers.worker --socket PATH --port 9002 [--host ...] [TLS flags]`: serves Envoy's
ext_proc streams on the EPP's port (SO_REUSEPORT, shared with the other workers) and asks the
scheduling process at PATH for every decision (extproc/remote.py), after parsing the request
itself (epp/requestcontrol/parse.py: JSON, fields, prompt hashes), so that process only decides. Its gRPC health is SERVING
only while that link is up. Without the link a stream fails at once with UNAVAILABLE (Envoy then
applies the pool's failure mode). It exits when its scheduling process is gone, and drains on
SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os

from grpc_health.v1 import health_pb2

from epp.requestcontrol.parse import WorkerParser
from extproc.remote import RemoteProcessor, SchedulerLink
from extproc.server import GrpcService, start_grpc_service, tls_from_arguments, wait_for_shutdown_signal
from extproc.stream import ExtProcServicer
from gateway.service_cli import add_event_loop_argument, run_service, service_parser
from gateway.supervise import Backoff

log = logging.getLogger("epp.workers.worker")

SERVICE_NAMES = ("", "envoy.service.ext_proc.v3.ExternalProcessor")
RECONNECT = Backoff(0.05, 1.0)


async def _set_health(grpc: GrpcService | None, up: bool) -> None:
    if grpc is None:
        return
    status = health_pb2.HealthCheckResponse.SERVING if up else health_pb2.HealthCheckResponse.NOT_SERVING
    for name in SERVICE_NAMES:
        await grpc.health.set(name, status)


async def keep_linked(link: SchedulerLink, parent: int, on_gone: asyncio.Event) -> None:
    """Connect, and reconnect after each loss, while the scheduling process that started this
    worker lives; set `on_gone` once it does not (this worker then exits)."""
    failures = 0
    while True:
        if os.getppid() != parent:
            log.warning("the scheduling process is gone: this worker stops")
            on_gone.set()
            return
        try:
            await link.connect()
        except OSError as exc:
            failures += 1
            if failures in (1, 10, 100):
                log.warning("cannot reach the scheduling process at %s: %s", link.path, exc)
            await asyncio.sleep(RECONNECT.delay(failures))
            continue
        failures = 0
        await link.wait_lost()
        log.warning("link to the scheduling process lost; reconnecting")


async def serve(args: argparse.Namespace) -> None:
    parent = os.getppid()
    grpc: GrpcService | None = None

    def on_change(up: bool) -> None:
        asyncio.get_running_loop().create_task(_set_health(grpc, up))

    link = SchedulerLink(args.socket, on_change=on_change)
    parse = WorkerParser()  # the request-local first step of every decision (epp/requestcontrol/parse.py)
    servicer = ExtProcServicer(lambda: RemoteProcessor(link, parse), name=f"epp-worker-{os.getpid()}")
    gone = asyncio.Event()
    linker = asyncio.get_running_loop().create_task(keep_linked(link, parent, gone))
    # Serve only once decisions can be made.
    connected, gone_wait = asyncio.ensure_future(link.wait_connected()), asyncio.ensure_future(gone.wait())
    await asyncio.wait([connected, gone_wait], return_when=asyncio.FIRST_COMPLETED)
    connected.cancel()
    gone_wait.cancel()
    if gone.is_set():
        return
    grpc = await start_grpc_service(
        servicer, host=args.host, port=args.port, tls=tls_from_arguments(args), reuse_port=True
    )
    log.info("epp worker %d serving %s:%d", os.getpid(), args.host, grpc.port)
    signal_task = asyncio.ensure_future(wait_for_shutdown_signal())
    gone_task = asyncio.ensure_future(gone.wait())
    await asyncio.wait([signal_task, gone_task], return_when=asyncio.FIRST_COMPLETED)
    signal_task.cancel()
    gone_task.cancel()
    await grpc.drain_and_stop(args.drain_seconds)
    linker.cancel()
    link.close()


def main() -> None:
    parser = service_parser(
        "epp-worker", "ext_proc worker of a multi-core EPP", default_port=9002, config_required=False
    )
    parser.add_argument("--socket", required=True, help="the scheduling process's Unix socket")
    add_event_loop_argument(parser)
    run_service(serve, parser.parse_args())


if __name__ == "__main__":
    main()
