"""gRPC server bootstrap shared by BBR and the EPP: ext_proc + the standard health service."""

from __future__ import annotations

import argparse
import asyncio
import errno
import logging
import signal
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc
from grpc_health.v1 import _async as health_async
from grpc_health.v1 import health_pb2, health_pb2_grpc

from extproc.stream import ExtProcServicer

log = logging.getLogger(__name__)


class StartupError(Exception):
    """A service cannot start for a reason its user can fix (port taken, file unreadable, no
    cluster): the command line prints the message, which says what and what to do, on one line."""


def check_port_free(host: str, port: int, flag: str) -> None:
    """Fail with a StartupError naming `flag` when `host:port` cannot be listened on. gRPC
    binds with SO_REUSEPORT off (see `start_grpc_service`), but its own bind error is a C-core
    log line and a generic RuntimeError; this check gives the reason first."""
    if port == 0:
        return
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        socket.create_server((host.strip("[]"), port), family=family).close()
    except OSError as exc:
        raise StartupError(listen_error(host, port, flag, exc)) from None


def listen_error(host: str, port: int, flag: str, exc: OSError) -> str:
    if exc.errno == errno.EADDRINUSE:
        return f"{host}:{port}: address already in use: stop what listens there or pass another {flag}"
    return f"cannot listen on {host}:{port} ({exc.strerror or exc}): pass another {flag} or --host"


@dataclass(frozen=True, slots=True)
class TlsFiles:
    """Server certificate, key and (for mTLS) the CA that client certificates must chain to."""

    cert: Path
    key: Path
    client_ca: Path | None = None

    def credentials(self) -> grpc.ServerCredentials:
        return grpc.ssl_server_credentials(
            [(_read_pem(self.key, "--tls-key"), _read_pem(self.cert, "--tls-cert"))],
            root_certificates=_read_pem(self.client_ca, "--tls-client-ca") if self.client_ca else None,
            require_client_auth=self.client_ca is not None,
        )


def _read_pem(path: Path, flag: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise StartupError(
            f"cannot read {flag} {path} ({exc.strerror or exc}): pass a readable PEM file"
        ) from None


class GrpcService:
    """A started gRPC server with health reporting; `port` is the bound port."""

    def __init__(
        self,
        server: grpc.aio.Server,
        health: health_async.HealthServicer,
        port: int,
        servicer: ExtProcServicer | None = None,
    ) -> None:
        self.server = server
        self.health = health
        self.port = port
        self.servicer = servicer

    async def drain_and_stop(self, grace_s: float) -> None:
        """Report NOT_SERVING so Envoy/Kubernetes stop sending, release the streams that only
        wait for their response to end (the responses carry on), then give requests still being
        decided `grace_s` to finish."""
        await self.health.enter_graceful_shutdown()
        if self.servicer is not None:
            released = self.servicer.release_held()
            log.info("%d held stream(s) released for the drain", released)
        await self.server.stop(grace_s)


async def start_grpc_service(
    servicer: ExtProcServicer | Any,
    *,
    host: str,
    port: int,
    tls: TlsFiles | None = None,
    extra_services: Sequence[tuple[Callable[[Any, grpc.aio.Server], None], Any, str]] = (),
    port_flag: str = "--port",
    reuse_port: bool = False,
) -> GrpcService:
    """ext_proc + health on one port; `extra_services` are (add_to_server, servicer, health
    name) triples for a service that shares the port (the global router's heartbeat API).
    `reuse_port`: the EPP's workers (epp/workers/processes.py), which share one port on purpose; their
    scheduling process checked that it was free before starting them."""
    credentials = tls.credentials() if tls else None  # a missing file fails before any bind
    if not reuse_port:
        check_port_free(host, port, port_flag)
    server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", 8 * 1024 * 1024),
            ("grpc.max_send_message_length", 8 * 1024 * 1024),
            # gRPC's default SO_REUSEPORT lets a second service bind a taken port and silently
            # share its traffic; a port in use must be an error instead.
            ("grpc.so_reuseport", 1 if reuse_port else 0),
        ]
    )
    pb_grpc.add_ExternalProcessorServicer_to_server(servicer, server)
    for add, extra, _ in extra_services:
        add(extra, server)
    health = health_async.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    bound = _bind(server, host, port, port_flag, credentials)
    await server.start()
    await health.set("", health_pb2.HealthCheckResponse.SERVING)
    for name in ("envoy.service.ext_proc.v3.ExternalProcessor", *(n for _, _, n in extra_services)):
        await health.set(name, health_pb2.HealthCheckResponse.SERVING)
    return GrpcService(server, health, bound, servicer if isinstance(servicer, ExtProcServicer) else None)


def _bind(
    server: grpc.aio.Server, host: str, port: int, flag: str, credentials: grpc.ServerCredentials | None
) -> int:
    address = f"{host}:{port}" if ":" not in host else f"[{host}]:{port}"
    try:
        if credentials is not None:
            return server.add_secure_port(address, credentials)
        return server.add_insecure_port(address)
    except RuntimeError:  # taken between the check and the bind
        raise StartupError(
            f"{address}: cannot listen (address already in use, or not this host's): pass another {flag} or --host"
        ) from None


# Service names probes ask the reference EPP's health port for: Kubernetes probes in its
# manifests use `inference-extension`, gateways and grpc-health-probe the ext_proc service name
# or "", and with leader election `liveness` / `readiness` (GIE cmd/epp/runner/health.go).
REFERENCE_HEALTH_SERVICES = (
    "",
    "inference-extension",
    "envoy.service.ext_proc.v3.ExternalProcessor",
    "liveness",
    "readiness",
)


async def start_health_server(
    host: str, port: int, services: Sequence[str] = REFERENCE_HEALTH_SERVICES
) -> GrpcService:
    """The standard gRPC health service alone on its own port (the reference EPP's 9003)."""
    check_port_free(host, port, "--grpc-health-port")
    server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
    health = health_async.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    bound = _bind(server, host, port, "--grpc-health-port", None)
    await server.start()
    for name in services:
        await health.set(name, health_pb2.HealthCheckResponse.SERVING)
    return GrpcService(server, health, bound)


async def wait_for_shutdown_signal() -> None:
    """Block until SIGINT or SIGTERM."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()


def add_tls_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("TLS (mTLS when --tls-client-ca is given)")
    group.add_argument("--tls-cert", type=Path, help="server certificate (PEM)")
    group.add_argument("--tls-key", type=Path, help="server private key (PEM)")
    group.add_argument("--tls-client-ca", type=Path, help="CA that client certificates must chain to")


def tls_from_arguments(args: argparse.Namespace) -> TlsFiles | None:
    if args.tls_cert is None and args.tls_key is None:
        if args.tls_client_ca is not None:
            raise SystemExit("--tls-client-ca needs --tls-cert and --tls-key")
        return None
    if args.tls_cert is None or args.tls_key is None:
        raise SystemExit("--tls-cert and --tls-key go together")
    return TlsFiles(args.tls_cert, args.tls_key, args.tls_client_ca)
