"""Fixtures for the global tier: a private redis-server, and two member clusters behind routers."""

from __future__ import annotations

import shutil
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from devstack.launch import free_port, wait_until


def _redis_up(port: int) -> bool:
    with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
        s.sendall(b"PING\r\n")
        return s.recv(16).startswith(b"+PONG")


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A throw-away redis-server on a free loopback port (no persistence)."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise RuntimeError("redis-server not found: apt-get install redis-server (see .ci/run)")
    port = free_port()
    workdir: Path = tmp_path_factory.mktemp("redis")
    proc = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
         "--dir", str(workdir)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        wait_until(lambda: _redis_up(port), 10, "redis-server", proc)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.terminate()
        proc.wait(5)
