"""Data-parallel ranks inside one pod: which rank the EPP pins (`X-data-parallel-rank`).

A vLLM server started with `--data-parallel-size N` serves N engines behind one port; each
rank has its own queue and its own prefix cache, and vLLM balances unpinned requests by queue
length only (4 x waiting + running), blind to which rank caches the prompt. After the
scheduler picks the pod (the pod-level metrics sum the ranks' counts), the EPP picks the rank:
the one whose cache most likely holds the prompt's leading blocks (an index of what this EPP
routed to each rank), unless that rank has `BALANCE_ABS` more of this EPP's requests in flight
than the least busy rank, which then wins. A prompt no rank caches goes to the least busy rank,
ties taken in turn (so new prompts spread over the ranks' caches). A pod's rank count
comes from discovery (`dataParallelSize` on a static endpoint, the
`gateway.inference.dev/data-parallel-size` pod annotation).
"""

from __future__ import annotations

from collections import Counter

from epp.datalayer.prefix_index import PrefixIndex
from epp.scheduling.request import InferenceRequest

RANK_HEADER = "x-data-parallel-rank"  # vLLM reads it case-insensitively
BALANCE_ABS = 8


def rank_key(address: str, rank: int) -> str:
    return f"{address}#dp{rank}"


class RankRouter:
    """Per-rank state of every data-parallel pod: routed prefixes and in-flight counts."""

    def __init__(self, index: PrefixIndex | None = None) -> None:
        self.index = index if index is not None else PrefixIndex()
        self.inflight: Counter[str] = Counter()
        self._turn: Counter[str] = Counter()  # per pod: where the next tie among idle ranks starts

    def pick(self, request: InferenceRequest, address: str, size: int) -> tuple[int, tuple[int, ...]]:
        """The rank for `request` on the pod at `address` with `size` ranks, and the prompt's
        block hashes (for `on_routed`)."""
        hashes = self.index.hashes(
            request.target_model, request.prompt, adapter=request.adapter, known=request.prefix
        )
        keys = [rank_key(address, r) for r in range(size)]
        matched = self.index.match_counts(hashes, keys) if hashes else [0] * size
        busy = [self.inflight[k] for k in keys]
        start = self._turn[address] % size
        least = min(range(size), key=lambda r: (busy[r], (r - start) % size))
        best = max(range(size), key=lambda r: (matched[r], -busy[r], -r))
        if matched[best] == 0 or busy[best] - busy[least] > BALANCE_ABS:
            self._turn[address] = least + 1
            return least, hashes
        return best, hashes

    def on_routed(self, address: str, rank: int, hashes: tuple[int, ...]) -> None:
        key = rank_key(address, rank)
        self.inflight[key] += 1
        if hashes:
            self.index.add(key, hashes)

    def on_finished(self, address: str, rank: int) -> None:
        key = rank_key(address, rank)
        if self.inflight[key] <= 1:
            del self.inflight[key]
        else:
            self.inflight[key] -= 1

    def retain(self, sizes: dict[str, int]) -> None:
        """Keep only the ranks of the pool's data-parallel pods (address -> rank count)."""
        self.index.retain(rank_key(a, r) for a, n in sizes.items() for r in range(n))
        for address in [a for a in self._turn if a not in sizes]:
            del self._turn[address]
