"""Shared-state variants of the default, for attributing what EPP replicas lose
(`python -m bench sim --policy-module bench.vtime.replica_policies --replicas N`;
docs/benchmarks/replicas-virtual-notes.md, 2026-12-06).

- `epp-fastsync`: every replica publishes its counts every 5 ms (the floor) instead of 20 ms.
- `epp-noscrapeshare`: replicas do not hand each other their scrape pages (`shareScrapes` off):
  each reads the pods only through its own scrapes.
"""

from __future__ import annotations

from typing import Any

from bench.vtime.epp import VIRTUAL_REDIS

VIRTUAL_POLICIES: dict[str, dict[str, Any]] = {
    "epp-fastsync": {
        "sharedState": {"redis": VIRTUAL_REDIS, "publishIntervalMs": 5, "idleIntervalMs": 5, "ttlMs": 1000}
    },
    "epp-noscrapeshare": {"sharedState": {"redis": VIRTUAL_REDIS, "shareScrapes": False}},
}
