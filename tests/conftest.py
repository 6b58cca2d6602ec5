"""Fixtures shared across the test folders."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from devstack.redis_server import RedisServer, start_redis


@pytest.fixture(scope="module")
def redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """A private redis-server per test module (the EPP replicas' shared store)."""
    server = start_redis(tmp_path_factory.mktemp("redis"))
    try:
        yield server
    finally:
        server.stop()
