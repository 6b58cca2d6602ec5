"""bench/micro/shared_state_bench.py measures what it says: real cycles against a real redis-server,
in which the replica reads every peer's counts and learns every peer's routing decisions."""

from __future__ import annotations

from pathlib import Path

from bench.micro.shared_state_bench import measure
from devstack.redis_server import start_redis


async def test_a_measured_cycle_publishes_reads_the_peers_and_costs_loop_cpu(tmp_path: Path) -> None:
    server = start_redis(tmp_path)
    try:
        # measure() itself fails unless every cycle succeeded, saw all 3 peers and learned
        # each peer's decision of that cycle.
        cycle = await measure(server.url, pods=16, peers=3, cycles=20, tag="t")
    finally:
        server.stop()
    assert 0 < cycle.loop_cpu_us <= cycle.process_cpu_us * 1.05 + 1
    assert cycle.wall_us > 0
