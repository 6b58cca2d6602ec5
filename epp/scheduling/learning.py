"""What every routed request teaches the scheduler's shared indexes, whatever its profile: the
two learners `WeightedScheduler` hooks before its plugins (epp/scheduling/plugins/base.py).

- `PrefixLearning`: the request's prefix blocks on the pod it was sent to (the approximate
  prefix index that `prefix-cache`, `precise-prefix-cache` and `predicted-ttft` read). The
  prompt is hashed at most once per request: `pick` remembers its hashes (or, when the profile
  did not need them, its block size), `on_routed` reuses them, so what is learned is what later
  picks look up. Hashes are keyed by (base model, adapter): a hit needs the same adapter.
- `AdapterLearning`: the request's adapter pinned on the pod from routed to finished (the
  residency model the LoRA scorers, the adapter-slots filter and `predicted-ttft` read).
"""

from __future__ import annotations

from collections import OrderedDict

from epp.datalayer.adapter_residency import AdapterResidency
from epp.datalayer.prefix_index import PrefixIndex
from epp.scheduling.plugins.base import LifecycleHooks
from epp.scheduling.request import InferenceRequest

# Block size and hashes of recently picked requests kept for `on_routed` (bounded: a request
# that is picked but never routed must not leak).
_RECENT_HASHES = 4096


class PrefixLearning(LifecycleHooks):
    def __init__(self, index: PrefixIndex) -> None:
        self.index = index
        # request_id -> (the prompt object picked, its block size in characters, its hashes
        # if the profile computed them); the identity check guards against two requests that
        # share a client-chosen id.
        self._recent: OrderedDict[str, tuple[str, int, tuple[int, ...] | None]] = OrderedDict()

    def hashes(self, request: InferenceRequest, block_chars: int) -> tuple[int, ...]:
        return self.index.hashes(
            request.target_model, request.prompt, block_chars, request.adapter, request.prefix
        )

    def remember(self, request: InferenceRequest, block_chars: int, hashes: tuple[int, ...] | None) -> None:
        """What `pick` chose for the request, for its `on_routed`."""
        recent = self._recent
        recent[request.request_id] = (request.prompt, block_chars, hashes)
        if len(recent) > _RECENT_HASHES:
            recent.popitem(last=False)

    def on_routed(self, request: InferenceRequest, address: str) -> None:
        block_chars, hashes = self.index.block_chars, None
        cached = self._recent.pop(request.request_id, None)
        if cached is not None and cached[0] is request.prompt:
            _, block_chars, hashes = cached
        if hashes is None:
            hashes = self.hashes(request, block_chars)
        if hashes:
            self.index.add(address, hashes)


class AdapterLearning(LifecycleHooks):
    def __init__(self, residency: AdapterResidency) -> None:
        self.residency = residency

    def on_routed(self, request: InferenceRequest, address: str) -> None:
        if request.adapter is not None:
            self.residency.on_routed(address, request.adapter, request.expected_output_tokens)

    def on_finished(self, request: InferenceRequest, address: str) -> None:
        """Its adapter's slot on the pod is one request less pinned (aborted alike)."""
        if request.adapter is not None:
            self.residency.on_finished(address, request.adapter)
