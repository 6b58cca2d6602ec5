"""What a replica tells its peers with its next shared-state round trip
(epp/datalayer/shared_state.py), queued as it happens: its routing decisions (prefix hashes,
KV-memory routings), its latest scrape per pod and, with `pushPicks`, its picks; each taken
out, encoded, when the round trip's payload is built (what was taken is lost if the call fails:
the index is a guess anyway, the next scrape replaces a scrape, the next round trip's counts
carry the picks)."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import msgpack

from epp.datalayer.endpoint_records import Metrics
from epp.datalayer.shared_state_wire import encode_scrape, memory_decision

# Pods per script call: Lua's unpack takes at most a few thousand values.
MAX_PODS_PER_CALL = 2000
# Routing decisions waiting for the next call, at most (the oldest dropped beyond).
MAX_OUTBOX = 5000


def count_lines(
    local: Mapping[str, tuple[int, int]],
    busy: Mapping[str, int] | None,
    lora: Mapping[str, Mapping[str, int]] | None,
) -> bytes:
    """This replica's counts as the script reads them: "pod requests,tokens", "busy:pod ms" and
    "lora:pod/adapter n" lines."""
    lines = [f"{pod} {r},{t}" for pod, (r, t) in list(local.items())[:MAX_PODS_PER_CALL]]
    lines += [f"busy:{pod} {ms}" for pod, ms in list((busy or {}).items())[:MAX_PODS_PER_CALL]]
    lines += [
        f"lora:{pod}/{adapter} {n}"
        for pod, adapters in list((lora or {}).items())[:MAX_PODS_PER_CALL]
        for adapter, n in adapters.items()
        if " " not in adapter and "\n" not in adapter
    ]
    return "\n".join(lines).encode()


class Outbox:
    """This replica's news since its last round trip. Picks are queued only while there are
    peers to tell (`has_peers`), and each wakes the loop (`wake`) to push it at once."""

    def __init__(self, has_peers: Callable[[], bool], wake: Callable[[], None]) -> None:
        # Routing decisions to publish: prefix hashes, or a KV-memory routing (`memory_decision`).
        self.decisions: deque[tuple[str, Sequence[int] | dict[str, Any]]] = deque(maxlen=MAX_OUTBOX)
        self.scrapes: dict[str, tuple[Metrics, float]] = {}  # this replica's, latest per pod
        self.picks: list[tuple[str, int, int]] = []  # (pod, predicted prefill ms, tokens)
        self.adapter_picks: list[tuple[str, str, int]] = []  # (pod, adapter, output tokens)
        self._has_peers = has_peers
        self._wake = wake

    def add_decision(self, address: str, hashes: Sequence[int]) -> None:
        """A routing decision of the prefix index (PrefixIndex.on_add)."""
        self.decisions.append((address, hashes))

    def add_memory_routing(self, address: str, *routing: Any) -> None:
        """A routing of the KV memory (SessionMemory.on_routed)."""
        self.decisions.append((address, memory_decision(*routing)))

    def add_pick(self, address: str, prefill_s: float, tokens: int) -> None:
        """A pick of this replica (Pool.pick_hook)."""
        if not self._has_peers():
            return
        self.picks.append((address, int(prefill_s * 1000.0 + 0.5), tokens))
        self._wake()

    def add_adapter_pick(self, address: str, adapter: str, output_tokens: int) -> None:
        """A LoRA pick of this replica (AdapterResidency.routed_hook): pushed with its pick."""
        if self._has_peers():
            self.adapter_picks.append((address, adapter, output_tokens))

    def has_picks(self) -> bool:
        return bool(self.picks) or bool(self.adapter_picks)

    def pending(self) -> bool:
        return bool(self.decisions) or bool(self.scrapes) or self.has_picks()

    def take_decisions(self) -> bytes:
        """The queued decisions, msgpack (b"": none)."""
        if not self.decisions:
            return b""
        out = msgpack.packb([[a, h if isinstance(h, dict) else list(h)] for a, h in self.decisions])
        self.decisions.clear()
        return out

    def take_scrapes(self, wall_clock: Callable[[], float], mono_clock: Callable[[], float]) -> bytes:
        """The queued scrapes, their times carried on the wall clock (b"": none)."""
        if not self.scrapes:
            return b""
        wall, mono = wall_clock(), mono_clock()
        out = msgpack.packb([encode_scrape(a, m, t, wall, mono) for a, (m, t) in self.scrapes.items()])
        self.scrapes.clear()
        return out

    def take_picks(self, replica_id: str) -> bytes:
        """The queued picks as the channel message [sender, picks(, adapter picks)] (b"": none)."""
        if not self.picks and not self.adapter_picks:
            return b""
        message: list[Any] = [replica_id, self.picks]
        if self.adapter_picks:  # only then: a peer of an older version reads [sender, picks]
            message.append(self.adapter_picks)
        out = msgpack.packb(message)
        self.picks, self.adapter_picks = [], []
        return out
