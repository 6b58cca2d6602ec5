"""`WeightedScheduler`: filter, score with a profile's weights, pick. Pure and synchronous.

pick(): the catalogue's filters in its order (serving -> healthy -> fresh (stale) -> unsaturated
(or all, flagged) -> adapter-slots) -> each weighted scorer once over all candidates ->
total = sum(weight x score) -> picker.
The prompt is hashed at most once per request, with one block size chosen in `pick` from the
candidates' reported KV block size; `on_routed` reuses those hashes, or that block size when
the profile did not need them (a prefix weight of 0), so what is learned is what later picks
look up. Hashes are keyed by (base model, adapter): a hit needs the same adapter.
"""

from __future__ import annotations

import random
from collections import OrderedDict
from collections.abc import Mapping, Sequence

from epp.datalayer.adapter_residency import AdapterResidency
from epp.datalayer.endpoint_records import EndpointState, PoolSnapshot
from epp.datalayer.kv_index import KVIndex
from epp.datalayer.prefix_index import DEFAULT_BLOCK_CHARS, PrefixIndex
from epp.datalayer.session_memory import SessionMemory, checkpoints
from epp.scheduling.decision import Decision, ScoreTable
from epp.scheduling.filters import Filter, FilterContext
from epp.scheduling.picker import exact_load
from epp.scheduling.registry import FILTERS, PICKERS, SCORERS
from epp.scheduling.request import CHARS_PER_TOKEN, InferenceRequest
from epp.scheduling.scorers import ScoringContext
from epp.scheduling.slo import slo_order
from epp.scheduling.ttft_prediction import predict_ttft
from gateway.profiles import BUILTIN_PROFILES, Profile

# Block size and hashes of recently picked requests kept for `on_routed` (bounded: a request
# that is picked but never routed must not leak).
_RECENT_HASHES = 4096


def block_chars_for(candidates: Sequence[EndpointState], default: int = DEFAULT_BLOCK_CHARS) -> int:
    """block_size x 4 characters when every candidate that reports a block size agrees."""
    sizes = {s.metrics.block_size for s in candidates if s.metrics is not None and s.metrics.block_size}
    if len(sizes) == 1:
        return int(sizes.pop()) * CHARS_PER_TOKEN
    return default


class WeightedScheduler:
    def __init__(
        self,
        profiles: Mapping[str, Profile] = BUILTIN_PROFILES,
        default_profile: str = "default",
        rng: random.Random | None = None,
        prefix_index: PrefixIndex | None = None,
        residency: AdapterResidency | None = None,
        kv_index: KVIndex | None = None,
        memory: SessionMemory | None = None,
    ) -> None:
        if default_profile not in profiles:
            raise ValueError(f"default profile {default_profile!r} is not among {sorted(profiles)}")
        self.profiles = dict(profiles)
        self.default_profile = default_profile
        self.rng = rng or random.Random()
        self.prefix_index = prefix_index if prefix_index is not None else PrefixIndex()
        self.residency = residency if residency is not None else AdapterResidency()
        self._filters: tuple[Filter, ...] = tuple(entry.fn for entry in FILTERS.values())
        self.kv_index = kv_index  # the pods' own KV events; None: precise-prefix-cache = prefix-cache
        self.memory = memory if memory is not None else SessionMemory()  # whole conversations per pod
        # request_id -> (the prompt object picked, its checkpoints, tokens per checkpoint)
        self._recent_checkpoints: OrderedDict[str, tuple[str, tuple[int, ...], float]] = OrderedDict()
        # request_id -> (the prompt object picked, its block size in characters, its hashes
        # if the profile computed them); the identity check guards against two requests that
        # share a client-chosen id.
        self._recent: OrderedDict[str, tuple[str, int, tuple[int, ...] | None]] = OrderedDict()

    def profile_for(self, request: InferenceRequest) -> Profile:
        objective = request.objective
        if objective is not None and objective in self.profiles:
            return self.profiles[objective]
        return self.profiles[self.default_profile]

    def wants_tokens(self, request: InferenceRequest) -> bool:
        """True when the request's profile weighs a scorer that reads token ids."""
        weights = self.profile_for(request).weights
        return any(SCORERS[name].uses_tokens for name, w in weights.items() if w > 0)

    def pick(self, request: InferenceRequest, snapshot: PoolSnapshot) -> Decision:
        profile = self.profile_for(request)
        th = profile.thresholds
        filtered = FilterContext(th, self.residency)
        candidates: Sequence[EndpointState] = snapshot.endpoints
        for keep in self._filters:  # the catalogue's filters, in its order
            candidates = keep(request, candidates, filtered)
            if not candidates:  # only `serving` refuses: the others keep all rather than none
                what = f"adapter {request.adapter!r} of " if request.adapter else ""
                reason = f"no endpoint serves {what}model {request.target_model!r}"
                return Decision((), profile=profile.name, reason=reason)
        all_saturated = filtered.saturated

        block_chars = block_chars_for(candidates, self.prefix_index.block_chars)
        hashes: tuple[int, ...] | None = None
        cps: tuple[int, ...] = ()
        per_cp = 0.0
        addresses = [s.endpoint.address for s in candidates]
        if any(SCORERS[name].uses_prefix for name, w in profile.weights.items() if w > 0):
            hashes = self._hashes(request, block_chars)
            cps, per_cp = self._checkpoints(request)
            self._bound_memory(candidates, addresses)
        self._remember(request, block_chars, hashes)
        ctx = ScoringContext(
            thresholds=th,
            prefix_hashes=hashes or (),
            prefix_index=self.prefix_index,
            addresses=addresses,
            residency=self.residency,
            kv_index=self.kv_index,
            block_chars=block_chars,
            memory=self.memory if cps else None,
            checkpoints=cps,
            checkpoint_tokens=per_cp,
        )

        totals = [0.0] * len(candidates)
        columns: list[tuple[str, list[float]]] = []
        for name, weight in profile.weights.items():
            if weight <= 0:
                continue
            values = SCORERS[name].score(request, candidates, ctx)
            columns.append((name, values))
            # clamped to [0, 1], NaN -> 0
            totals = [
                t + weight * ((v if v <= 1.0 else 1.0) if v >= 0.0 else 0.0)
                for t, v in zip(totals, values, strict=True)
            ]

        loads = (lambda i: exact_load(candidates[i])) if th.tie_band > 0.0 else None
        order = PICKERS[profile.picker].fn(totals, self.rng, loads, th.tie_band)
        slo_met: bool | None = None
        if request.slo_ttft_s is not None and order:  # predicted whether the profile weighs it or not
            predicted = [None if t is None else t.total_s for t in predict_ttft(request, candidates, ctx)]
            order, slo_met = slo_order(order, predicted, request.slo_ttft_s)
        prefill_s = 0.0
        if order:  # the pod most likely routed to: bound its prefix LRU by its KV cache
            self._bound_prefix_lru(candidates[order[0]], block_chars)
            if ctx.ttft:  # predicted: the pick commits its prefill work to the pod's ledger
                terms = predict_ttft(request, candidates, ctx)[order[0]]
                prefill_s = 0.0 if terms is None else terms.prefill_work_s
        return Decision(
            ranked=tuple([addresses[i] for i in order]),
            scores=ScoreTable(addresses, columns, totals, order[0] if order else 0),
            profile=profile.name,
            saturated=all_saturated,
            prefill_s=prefill_s,
            slo_met=slo_met,
        )

    def on_routed(self, request: InferenceRequest, address: str) -> None:
        """Remember the request's prefix blocks, and its adapter, on the pod it was sent to."""
        if request.adapter is not None:
            self.residency.on_routed(address, request.adapter, request.expected_output_tokens)
        block_chars, hashes = self.prefix_index.block_chars, None
        cached = self._recent.pop(request.request_id, None)
        if cached is not None and cached[0] is request.prompt:
            _, block_chars, hashes = cached
        if hashes is None:
            hashes = self._hashes(request, block_chars)
        if hashes:
            self.prefix_index.add(address, hashes)
        recent = self._recent_checkpoints.pop(request.request_id, None)
        if recent is not None and recent[0] is request.prompt:
            _, cps, per_cp = recent
        else:
            cps, per_cp = self._checkpoints(request)
        self.memory.routed(address, cps, per_cp, request.prompt_tokens, request.expected_output_tokens)

    def on_finished(self, request: InferenceRequest, address: str) -> None:
        """The request routed to `address` ended there (once per `on_routed`): its adapter's
        slot there is one request less pinned."""
        if request.adapter is not None:
            self.residency.on_finished(address, request.adapter)

    def _bound_prefix_lru(self, state: EndpointState, block_chars: int) -> None:
        """The pod's KV cache in index blocks (its reported blocks x block size, in characters
        at CHARS_PER_TOKEN) bounds what the approximate index believes it caches."""
        m = state.metrics
        if m is None or not m.num_gpu_blocks or not m.block_size:
            return
        tokens = m.num_gpu_blocks * m.block_size
        self.prefix_index.set_capacity(state.endpoint.address, tokens * CHARS_PER_TOKEN // block_chars)

    def _checkpoints(self, request: InferenceRequest) -> tuple[tuple[int, ...], float]:
        """The prompt's KV-memory checkpoints and the tokens one stands for (the request's
        own token density), remembered for `on_routed`."""
        cps, _ = checkpoints(request.target_model, request.adapter, request.prompt, self.memory.stride)
        per_cp = self.memory.stride * request.prompt_tokens / max(1, len(request.prompt))
        recent = self._recent_checkpoints
        recent[request.request_id] = (request.prompt, cps, per_cp)
        if len(recent) > _RECENT_HASHES:
            recent.popitem(last=False)
        return cps, per_cp

    def _bound_memory(self, candidates: Sequence[EndpointState], addresses: Sequence[str]) -> None:
        """Each candidate's KV capacity in tokens, from its reported blocks."""
        for state, address in zip(candidates, addresses, strict=True):
            m = state.metrics
            if m is not None and m.num_gpu_blocks and m.block_size:
                self.memory.set_capacity(address, float(m.num_gpu_blocks * m.block_size))

    def _hashes(self, request: InferenceRequest, block_chars: int) -> tuple[int, ...]:
        return self.prefix_index.hashes(
            request.target_model, request.prompt, block_chars, request.adapter, request.prefix
        )

    def _remember(self, request: InferenceRequest, block_chars: int, hashes: tuple[int, ...] | None) -> None:
        recent = self._recent
        recent[request.request_id] = (request.prompt, block_chars, hashes)
        if len(recent) > _RECENT_HASHES:
            recent.popitem(last=False)
