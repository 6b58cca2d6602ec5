"""Fixtures shared across the test folders."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, settings

from devstack.redis_server import RedisServer, start_redis

# Property tests check behaviour, not speed: on a loaded two-core machine one example of a cheap
# property took 286 ms against Hypothesis' default 200 ms deadline and failed the suite (a CPU
# burner beside `make test`, docs/reliability.md). No deadline, and no health check on slow
# generation; the examples and their number stay Hypothesis' own.
settings.register_profile("loaded-machine", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("loaded-machine")


@pytest.fixture(scope="module")
def redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """A private Valkey per test module (the EPP replicas' shared store, as deploy/ runs it)."""
    server = start_redis(tmp_path_factory.mktemp("redis"))
    try:
        yield server
    finally:
        server.stop()
