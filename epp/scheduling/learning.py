"""What every routed request teaches the scheduler's shared indexes, whatever its profile: the
two learners `WeightedScheduler` hooks before its plugins (epp/scheduling/plugins/base.py).

- `PrefixLearning`: the request's prefix blocks on the pod it was sent to (the approximate
  prefix index that `prefix-cache`, `precise-prefix-cache` and `predicted-ttft` read). The
  prompt is hashed at most once per request: `pick` remembers its hashes (or, when the profile
  did not need them, its block size), `on_routed` reuses them, so what is learned is what later
  picks look up. Hashes are keyed by (base model, adapter): a hit needs the same adapter.
- `AdapterLearning`: the request's adapter pinned on the pod from routed to finished (the
  residency model the LoRA scorers, the adapter-slots filter and `predicted-ttft` read).
- `MemoryLearning`: the conversation on the pod it was sent to, at any length (the KV-memory
  model `predicted-ttft` reads, epp/datalayer/session_memory.py); the prompt's checkpoints are
  computed once per request, as its prefix hashes are.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from epp.datalayer.adapter_residency import AdapterResidency
from epp.datalayer.endpoint_records import EndpointState
from epp.datalayer.prefix_index import PrefixIndex
from epp.datalayer.session_memory import SessionMemory, checkpoints
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


class MemoryLearning(LifecycleHooks):
    def __init__(self, memory: SessionMemory) -> None:
        self.memory = memory
        # request_id -> (the prompt object picked, its checkpoints, tokens per checkpoint)
        self._recent: OrderedDict[str, tuple[str, tuple[int, ...], float]] = OrderedDict()

    def checkpoints(self, request: InferenceRequest) -> tuple[tuple[int, ...], float]:
        """The prompt's checkpoints and the tokens one stands for (the request's own token
        density), remembered for `on_routed`."""
        cps, _ = checkpoints(request.target_model, request.adapter, request.prompt, self.memory.stride)
        per = self.memory.stride * request.prompt_tokens / max(1, len(request.prompt))
        recent = self._recent
        recent[request.request_id] = (request.prompt, cps, per)
        if len(recent) > _RECENT_HASHES:
            recent.popitem(last=False)
        return cps, per

    def bound(self, candidates: Sequence[EndpointState], addresses: Sequence[str]) -> None:
        """Each candidate's KV capacity in tokens, from its reported blocks."""
        for state, address in zip(candidates, addresses, strict=True):
            m = state.metrics
            if m is not None and m.num_gpu_blocks and m.block_size:
                self.memory.set_capacity(address, float(m.num_gpu_blocks * m.block_size))

    def on_routed(self, request: InferenceRequest, address: str) -> None:
        recent = self._recent.pop(request.request_id, None)
        if recent is not None and recent[0] is request.prompt:
            _, cps, per = recent
        else:
            cps, per = self.checkpoints(request)
            self._recent.pop(request.request_id, None)
        self.memory.routed(
            address, cps, per, request.prompt_tokens, request.expected_output_tokens, request.session_key
        )
