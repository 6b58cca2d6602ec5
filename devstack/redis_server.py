"""A throw-away `redis-server` on a free loopback port (no persistence): the store the global
tier's rate limits and the EPP replicas' shared state use, for tests and benchmarks."""

from __future__ import annotations

import shutil
import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path

from devstack.launch import free_port, wait_until


def redis_up(port: int) -> bool:
    with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
        s.sendall(b"PING\r\n")
        return s.recv(16).startswith(b"+PONG")


@dataclass
class RedisServer:
    port: int
    popen: subprocess.Popen[bytes]
    workdir: Path

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.terminate()
            self.popen.wait(5)

    def restart(self) -> None:
        """Start again on the same port (after `stop`), empty."""
        self.stop()
        fresh = start_redis(self.workdir, self.port)
        self.popen = fresh.popen


def start_redis(workdir: Path, port: int | None = None, timeout_s: float = 10.0) -> RedisServer:
    binary = shutil.which("redis-server")
    if binary is None:
        raise RuntimeError("redis-server not found: apt-get install redis-server (make system-deps)")
    port = port or free_port()
    workdir.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
         "--dir", str(workdir)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        wait_until(lambda: redis_up(port), timeout_s, "redis-server", proc)
    except BaseException:
        proc.kill()
        proc.wait(5)
        raise
    return RedisServer(port, proc, workdir)
