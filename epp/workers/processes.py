"""A multi-core EPP: N ext_proc worker processes, one scheduling process, one exact picture.

With `epp.workers` N > 1 the EPP process keeps everything a decision reads or changes (pool,
scraper, ledger, in-flight counts, prefix and KV index, adapter residency, flow-control queue,
shared state, metrics, admin, health) and starts N workers (`python -m epp.workers.worker`). Each
worker serves Envoy's ext_proc streams on the EPP's port (every worker binds it with
SO_REUSEPORT: the kernel spreads Envoy's connections over them) and does the protocol work:
gRPC, the ext_proc messages, body accumulation, header maps, and the request's own parse
(epp/requestcontrol/parse.py: JSON, fields, prompt hashes). For each stream it hands the scheduling process
the request's headers, body and parsed record over a Unix socket, then the response headers
and the stream's end (extproc/ipc.py, extproc/remote.py). The scheduling process runs the same
`EppProcessor` per stream as the single process does, from its decide step, in the order the
events arrive, so N workers decide exactly what one process decides for the same arrivals
(tests/unit/test_epp_workers.py checks the picks of both paths are equal).

Supervision: a worker that exits is restarted; its socket's end releases every stream it held
(the in-flight slots, ledger entries and prefill slots return as at a stream's end). A stop
sends SIGTERM: each worker drains its streams (gRPC health NOT_SERVING, held streams released),
then the scheduling process closes.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import logging
import math
import os
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from extproc.remote import ProcessorHost
from extproc.server import StartupError, TlsFiles
from extproc.stream import ProcessorFactory
from gateway.supervise import Backoff, report_failure, spawn

log = logging.getLogger(__name__)

CGROUP_ROOT = Path("/sys/fs/cgroup")


def cgroup_cpu_quota(root: Path = CGROUP_ROOT) -> float | None:
    """The CPU quota of this process's cgroup in CPUs (cgroup v2 `cpu.max`, else v1
    `cpu/cpu.cfs_quota_us` over `cpu.cfs_period_us`); None when there is none."""
    try:
        quota, period = (root / "cpu.max").read_text().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:
        quota_us = int((root / "cpu" / "cpu.cfs_quota_us").read_text())
        period_us = int((root / "cpu" / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    return None if quota_us <= 0 or period_us <= 0 else quota_us / period_us


def usable_cpus(root: Path = CGROUP_ROOT) -> int:
    """The CPUs this process may use: its affinity mask, capped by its cgroup's CPU quota
    (rounded up) when one is set."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cpus = os.cpu_count() or 1
    quota = cgroup_cpu_quota(root)
    if quota is not None:
        cpus = min(cpus, max(1, math.ceil(quota)))
    return max(1, cpus)


def resolve_workers(value: int | str) -> int:
    """`epp.workers` / `--workers` as a count: "auto" = `usable_cpus()`."""
    if value == "auto":
        return usable_cpus()
    count = int(value)
    if count < 1:
        raise ValueError(f"workers must be at least 1 or 'auto', not {value!r}")
    return count


def parse_workers(text: str) -> int | str:
    """The CLI's `--workers`: a count or "auto"."""
    if text == "auto":
        return text
    try:
        count = int(text)
    except ValueError:
        raise ValueError(f"--workers takes a count or 'auto', not {text!r}") from None
    if count < 1:
        raise ValueError(f"--workers must be at least 1, not {count}")
    return count


RESTART_BACKOFF = Backoff(0.2, 5.0)  # a worker that dies at start is not restarted in a tight loop


def workers_argument(text: str) -> int | str:
    """`parse_workers` as an argparse type."""
    try:
        return parse_workers(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_workers_argument(parser: argparse.ArgumentParser, default_from: str) -> None:
    """`--workers N|auto` for `python -m epp` and `python -m epp.single_hop`."""
    parser.add_argument(
        "--workers",
        type=workers_argument,
        help="ext_proc worker processes: a count or 'auto' (the CPUs this process may use); "
        "more than 1 spreads the gRPC work over that many processes while this one keeps the "
        f"pool's one picture and makes every decision (default: {default_from}, else 1)",
    )


def worker_options(args: argparse.Namespace) -> dict[str, str]:
    """What a worker inherits from its EPP's command line."""
    return {"log_level": args.log_level, "event_loop": args.event_loop, "drain_s": str(args.drain_seconds)}


class WorkerProcesses:
    """Start `count` workers and keep that many running until `stop`."""

    def __init__(self, count: int, argv: Sequence[str], backoff: Backoff = RESTART_BACKOFF) -> None:
        self.count = count
        self._argv = list(argv)  # `python -m epp.workers.worker ...`, the same for each
        self._backoff = backoff
        self._procs: dict[int, asyncio.subprocess.Process | None] = dict.fromkeys(range(count))
        self._tasks: list[asyncio.Task[None]] = []
        self._stopping = False
        self.restarts = 0

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self._procs.values() if p is not None and p.returncode is None]

    def start(self) -> None:
        for slot in range(self.count):
            self._tasks.append(spawn("epp-worker", f"epp worker {slot}", functools.partial(self._keep, slot)))

    async def _keep(self, slot: int) -> None:
        """Run worker `slot`; when it exits, start another (after a backoff if it died young)."""
        failures = 0
        while not self._stopping:
            started = time.monotonic()
            # Its own session: a terminal's Ctrl-C reaches this process, which stops the workers
            # in order (and a worker restarted meanwhile would be a stray one).
            proc = await asyncio.create_subprocess_exec(*self._argv, start_new_session=True)
            self._procs[slot] = proc
            code = await proc.wait()
            if self._stopping:
                return
            self.restarts += 1
            ran_s = time.monotonic() - started
            failures = 1 if ran_s > self._backoff.max_s else failures + 1
            report_failure(
                "epp-worker",
                f"epp worker {slot} (pid {proc.pid})",
                RuntimeError(f"exited with {describe_exit(code)} after {ran_s:.1f} s; starting another"),
            )
            await asyncio.sleep(self._backoff.delay(failures) if ran_s < self._backoff.max_s else 0)

    async def stop(self, grace_s: float) -> None:
        """SIGTERM every worker (each drains for `grace_s`), SIGKILL what is left after that."""
        self._stopping = True
        live = [p for p in self._procs.values() if p is not None and p.returncode is None]
        for proc in live:
            proc.send_signal(signal.SIGTERM)
        if live:
            _, pending = await asyncio.wait(
                [asyncio.ensure_future(p.wait()) for p in live], timeout=grace_s + 5.0
            )
            for proc in live:
                if proc.returncode is None:
                    log.warning("epp worker %d did not stop in time: killing it", proc.pid)
                    proc.kill()
            if pending:
                await asyncio.wait(pending, timeout=5.0)
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


def describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"status {code}"


def worker_argv(
    socket_path: str,
    host: str,
    port: int,
    *,
    tls_args: Sequence[str] = (),
    log_level: str = "INFO",
    event_loop: str = "uvloop",
    drain_s: float = 5.0,
) -> list[str]:
    return [
        *(sys.executable, "-m", "epp.workers.worker", "--socket", socket_path),
        *("--host", host, "--port", str(port), *tls_args),
        *("--log-level", log_level, "--event-loop", event_loop, "--drain-seconds", str(drain_s)),
    ]


WORKERS_START_S = 60.0


def free_tcp_port(host: str) -> int:
    """A port the workers can all bind (the EPP's --port 0)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family) as sock:
        sock.bind((host.strip("[]"), 0))
        port: int = sock.getsockname()[1]
        return port


class WorkerFront:
    """The ext_proc port of an EPP served by `count` worker processes that ask this process
    for every decision: `factory` makes the service's processor per stream (the one its
    single-process `ExtProcServicer` uses), `settings` what each worker applies itself."""

    def __init__(
        self,
        count: int,
        factory: ProcessorFactory,
        settings: Callable[[], dict[str, Any]],
        *,
        host: str,
        port: int,
        tls: TlsFiles | None = None,
        options: dict[str, str] | None = None,
    ) -> None:
        self.count = count
        self.host_ipc = ProcessorHost(factory, settings)
        self._host, self.port, self._tls = host, port, tls
        self._options = options or {}
        self.processes: WorkerProcesses | None = None
        self._dir = ""

    async def start(self) -> None:
        """Returns once every worker is linked (the port then serves decisions)."""
        self._dir = tempfile.mkdtemp(prefix="epp-workers-")
        await self.host_ipc.start(os.path.join(self._dir, "decide.sock"))
        self.port = self.port or free_tcp_port(self._host)
        tls_args: list[str] = []
        if self._tls is not None:
            tls_args = ["--tls-cert", str(self._tls.cert), "--tls-key", str(self._tls.key)]
            if self._tls.client_ca is not None:
                tls_args += ["--tls-client-ca", str(self._tls.client_ca)]
        options = self._options
        self.processes = WorkerProcesses(
            self.count,
            worker_argv(
                self.host_ipc.path,
                self._host,
                self.port,
                tls_args=tls_args,
                log_level=options.get("log_level", "INFO"),
                event_loop=options.get("event_loop", "uvloop"),
                drain_s=float(options.get("drain_s", "5")),
            ),
        )
        self.processes.start()
        deadline = time.monotonic() + WORKERS_START_S
        while len(self.host_ipc.sessions) < self.count:
            if time.monotonic() > deadline:
                linked = len(self.host_ipc.sessions)
                await self.stop(0)
                raise StartupError(
                    f"{linked} of {self.count} ext_proc workers started in {WORKERS_START_S:.0f} s "
                    "(their errors are in this log): pass fewer --workers"
                )
            await asyncio.sleep(0.02)
        log.info("%d ext_proc workers serve port %d", self.count, self.port)

    def push_settings(self) -> None:
        self.host_ipc.push_settings()

    def debug(self) -> dict[str, Any]:
        return {
            "count": self.count,
            "restarts": self.processes.restarts if self.processes is not None else 0,
            "linked": self.host_ipc.debug(),
        }

    async def stop(self, grace_s: float) -> None:
        """Each worker drains its streams; then the links' ends release whatever is left."""
        if self.processes is not None:
            await self.processes.stop(grace_s)
        await self.host_ipc.stop()
        if self._dir:
            os.rmdir(self._dir)
            self._dir = ""


async def start_worker_front(
    count: int,
    factory: ProcessorFactory,
    settings: Callable[[], dict[str, Any]],
    subscribe: Callable[[Callable[[Any], None]], Any],
    *,
    host: str,
    port: int,
    tls: TlsFiles | None = None,
    options: dict[str, str] | None = None,
) -> WorkerFront:
    """Start an EPP's workers, re-sending their settings on every configuration change
    (`subscribe`: the config store's); returns once every worker is linked."""
    front = WorkerFront(count, factory, settings, host=host, port=port, tls=tls, options=options)
    subscribe(lambda _: front.push_settings())
    await front.start()
    return front
