"""Fixtures for the global tier: a private Valkey, and two member clusters behind routers."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from devstack.redis_server import start_redis


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A throw-away Valkey on a free loopback port (no persistence), the store deploy/ runs."""
    server = start_redis(tmp_path_factory.mktemp("redis"))
    try:
        yield server.url
    finally:
        server.stop()
