"""`WeightedScheduler`: filter, score with a profile's weights, pick. Pure and synchronous.

pick(): the profile's filters (by default the catalogue's, in its order: serving -> healthy ->
fresh (stale) -> unsaturated (or all, flagged) -> adapter-slots) -> `prepare` of the profile's
plugins that have one -> each weighted scorer once over all candidates ->
total = sum(weight x score) -> picker -> the latency objective's order (epp/scheduling/slo.py)
for a request that has one. That is one ranking (`rank`); `pick` is the pool's handler over
rankings: one, or P/D's decode and prefill rankings (epp/scheduling/disaggregation.py). The plugins are objects (epp/scheduling/plugins/base.py),
one per catalogue row, owning their state; the request control's lifecycle hooks (`on_routed`,
`on_first_token`, `on_finished`, `on_aborted`) reach every plugin of the profiles that has one.
The prompt is hashed at most once per request, with one block size chosen in `rank` from the
candidates' reported KV block size, which the prefix learner (epp/scheduling/learning.py)
reuses at `on_routed`. The lifecycle hooks go to the two learners of the shared indexes, then
to the plugins that override them.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from epp.datalayer.adapter_residency import AdapterResidency
from epp.datalayer.endpoint_records import EndpointState, PoolSnapshot
from epp.datalayer.kv_index import KVIndex
from epp.datalayer.prefix_index import DEFAULT_BLOCK_CHARS, PrefixIndex
from epp.datalayer.session_memory import SessionMemory
from epp.scheduling.decision import Decision, PredictedTtft, ScoreTable
from epp.scheduling.disaggregation import Disaggregated, Handler, SinglePick
from epp.scheduling.filters import FilterContext
from epp.scheduling.learning import AdapterLearning, MemoryLearning, PrefixLearning
from epp.scheduling.picker import exact_load
from epp.scheduling.plugins.base import (
    HOOKS,
    FilterPlugin,
    LifecycleHooks,
    PickerPlugin,
    Plugin,
    ScorerPlugin,
)
from epp.scheduling.registry import FILTERS, SCORERS, Plugins
from epp.scheduling.request import CHARS_PER_TOKEN, InferenceRequest
from epp.scheduling.saturation import is_saturated
from epp.scheduling.scorers import ScoringContext
from epp.scheduling.slo import LatencyObjective
from epp.scheduling.ttft_prediction import predict_ttft
from gateway.config import GatewayConfig
from gateway.profiles import BUILTIN_PROFILES, Profile


def block_chars_for(candidates: Sequence[EndpointState], default: int = DEFAULT_BLOCK_CHARS) -> int:
    """block_size x 4 characters when every candidate that reports a block size agrees."""
    sizes = {s.metrics.block_size for s in candidates if s.metrics is not None and s.metrics.block_size}
    if len(sizes) == 1:
        return int(sizes.pop()) * CHARS_PER_TOKEN
    return default


# Scorers that predict a pod's wait (queue, KV admission) against a recompute elsewhere.
WAIT_PRICING_SCORERS = frozenset({"predicted-ttft"})
# A pod holding this share of the prompt (the KV memory's checkpoints) is the request's home.
HOLDER_SHARE = 0.5


@dataclass(frozen=True, slots=True)
class _Plan:
    """One profile's plugins, resolved once: what `pick` runs for it."""

    profile: Profile
    filters: tuple[FilterPlugin, ...]
    scorers: tuple[tuple[str, float, ScorerPlugin], ...]  # weighted above 0, in the profile's order
    picker: PickerPlugin
    prepare: tuple[Plugin, ...]  # those with a `prepare`
    uses_prefix: bool
    uses_tokens: bool
    # A scorer that prices a pod's wait against a recompute elsewhere: saturated pods holding
    # most of the prompt stay candidates (`FilterContext.holders`) and it weighs their wait.
    prices_wait: bool = False

    @classmethod
    def of(cls, profile: Profile, plugins: Plugins) -> _Plan:
        filters = tuple(FILTERS if profile.filters is None else profile.filters)
        scorers = [(name, w) for name, w in profile.weights.items() if w > 0]
        resolved = tuple((name, w, plugins.scorer(name)) for name, w in scorers)
        chain = tuple(plugins.filter(name) for name in filters)
        picker = plugins.picker(profile.picker)
        everything: tuple[Plugin, ...] = (*chain, *(p for _, _, p in resolved), picker)
        return cls(
            profile=profile,
            filters=chain,
            scorers=resolved,
            picker=picker,
            prepare=tuple(p for p in everything if p.prepares()),
            uses_prefix=any(SCORERS[name].uses_prefix for name, _ in scorers),
            uses_tokens=any(SCORERS[name].uses_tokens for name, _ in scorers),
            prices_wait=any(name in WAIT_PRICING_SCORERS for name, _ in scorers),
        )


class WeightedScheduler:
    def __init__(
        self,
        profiles: Mapping[str, Profile] = BUILTIN_PROFILES,
        default_profile: str = "default",
        rng: random.Random | None = None,
        prefix_index: PrefixIndex | None = None,
        residency: AdapterResidency | None = None,
        kv_index: KVIndex | None = None,
        plugins: Plugins | None = None,
        handler: Handler | None = None,
        memory: SessionMemory | None = None,
    ) -> None:
        """`plugins`: the plugin objects of a scheduler this one replaces (a configuration
        reload), whose state carries over; None: new ones. `handler`: how a decision uses
        rankings (epp/scheduling/disaggregation.py; None: `SinglePick`)."""
        if default_profile not in profiles:
            raise ValueError(f"default profile {default_profile!r} is not among {sorted(profiles)}")
        self.default_profile = default_profile
        self.rng = rng or random.Random()
        self.prefix_index = prefix_index if prefix_index is not None else PrefixIndex()
        self.residency = residency if residency is not None else AdapterResidency()
        self.plugins = plugins if plugins is not None else Plugins()
        self._prefix = PrefixLearning(self.prefix_index)
        self.memory = memory if memory is not None else SessionMemory()  # whole conversations per pod
        self._memory = MemoryLearning(self.memory)
        self._learners: tuple[LifecycleHooks, ...] = (
            AdapterLearning(self.residency),
            self._prefix,
            self._memory,
        )
        self.handler = handler if handler is not None else SinglePick()
        self.objective = LatencyObjective()
        self.profiles = profiles
        self.kv_index = kv_index  # the pods' own KV events; None: precise-prefix-cache = prefix-cache

    @property
    def profiles(self) -> dict[str, Profile]:
        return self._profiles

    @profiles.setter
    def profiles(self, profiles: Mapping[str, Profile]) -> None:
        """Each profile's plugins resolved once, and which plugins hear which lifecycle hook."""
        self._profiles = dict(profiles)
        self._plans = {name: _Plan.of(p, self.plugins) for name, p in self._profiles.items()}
        used: dict[int, LifecycleHooks] = {id(p): p for p in self._learners}
        for plan in self._plans.values():
            for plugin in (*plan.filters, *(p for _, _, p in plan.scorers), plan.picker):
                used[id(plugin)] = plugin
        self._hooked = {hook: tuple(p for p in used.values() if hook in p.hooks()) for hook in HOOKS}

    def profile_for(self, request: InferenceRequest) -> Profile:
        return self._plan_for(request).profile

    def _plan_for(self, request: InferenceRequest) -> _Plan:
        objective = request.objective
        if objective is not None and objective in self._plans:
            return self._plans[objective]
        return self._plans[self.default_profile]

    def wants_tokens(self, request: InferenceRequest) -> bool:
        """True when the request's profile weighs a scorer that reads token ids."""
        return self._plan_for(request).uses_tokens

    def pick(self, request: InferenceRequest, snapshot: PoolSnapshot) -> Decision:
        """The pool's handler over this scheduler's rankings (one, or P/D's two)."""
        return self.handler.decide(self.rank, request, snapshot)

    def rank(self, request: InferenceRequest, snapshot: PoolSnapshot) -> Decision:
        """One ranking of the request's profile over `snapshot`."""
        plan = self._plan_for(request)
        profile = plan.profile
        th = profile.thresholds
        filtered = FilterContext(th, self.residency)
        candidates: Sequence[EndpointState] = snapshot.endpoints
        cps: tuple[int, ...] = ()
        per_cp = 0.0
        depths: dict[str, int] | None = None
        if plan.uses_prefix:
            cps, per_cp = self._memory.checkpoints(request)
            if plan.prices_wait and cps:
                filtered.holders, depths = self._holders(request, candidates, cps, per_cp)
        for keep in plan.filters:  # the profile's filters (by default the catalogue's), in order
            candidates = keep.filter(request, candidates, filtered)
            if not candidates:  # only `serving` refuses: the others keep all rather than none
                what = f"adapter {request.adapter!r} of " if request.adapter else ""
                reason = f"no endpoint serves {what}model {request.target_model!r}"
                return Decision((), profile=profile.name, reason=reason)
        all_saturated = filtered.saturated

        block_chars = block_chars_for(candidates, self.prefix_index.block_chars)
        hashes: tuple[int, ...] | None = None
        addresses = [s.endpoint.address for s in candidates]
        if plan.uses_prefix:
            hashes = self._prefix.hashes(request, block_chars)
            self._memory.bound(candidates, addresses)
        self._prefix.remember(request, block_chars, hashes)
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
            memory_depths=depths,
        )

        for plugin in plan.prepare:
            plugin.prepare(request, candidates, ctx)
        totals = [0.0] * len(candidates)
        columns: list[tuple[str, list[float]]] = []
        for name, weight, scorer in plan.scorers:
            values = scorer.score(request, candidates, ctx)
            columns.append((name, values))
            # clamped to [0, 1], NaN -> 0
            totals = [
                t + weight * ((v if v <= 1.0 else 1.0) if v >= 0.0 else 0.0)
                for t, v in zip(totals, values, strict=True)
            ]

        loads = (lambda i: exact_load(candidates[i])) if th.tie_band > 0.0 else None
        order = plan.picker.pick(totals, self.rng, loads, th.tie_band)
        order, slo_met = self.objective.order(request, order, candidates, ctx)
        prefill_s = 0.0
        if order:  # the pod most likely routed to: bound its prefix LRU by its KV cache
            self._bound_prefix_lru(candidates[order[0]], block_chars)
            if ctx.ttft:  # predicted: the pick commits its prefill work to the pod's ledger
                terms = predict_ttft(request, candidates, ctx)[order[0]]
                prefill_s = 0.0 if terms is None else terms.prefill_work_s
        hold = bool(order) and bool(filtered.holders) and is_saturated(candidates[order[0]], th)
        return Decision(
            ranked=tuple([addresses[i] for i in order]),
            scores=ScoreTable(addresses, columns, totals, order[0] if order else 0),
            profile=profile.name,
            saturated=all_saturated,
            hold=hold,
            prefill_s=prefill_s,
            slo_met=slo_met,
            predicted=PredictedTtft(addresses, ctx.ttft[2]) if ctx.ttft else None,
        )

    def _holders(
        self,
        request: InferenceRequest,
        candidates: Sequence[EndpointState],
        cps: Sequence[int],
        per_cp: float,
    ) -> tuple[frozenset[str], dict[str, int] | None]:
        """The pods the KV memory says hold at least `HOLDER_SHARE` of the prompt: where a
        conversation's history is. A saturated one stays a candidate, since the saturation
        filter is blind to what leaving costs: measured on agentic-coding (tuning seeds), a
        home pod over the KV threshold dropped, its 90k-token session recomputed elsewhere in
        3.5 s, and the queues that built behind such misses pushed more sessions off their pods
        (TTFT P95 11.5 s); kept, the prediction weighs the wait there against the recompute.
        Also each pod's held depth, which the prediction reads rather than walk the memory again."""
        need = HOLDER_SHARE * request.prompt_tokens
        if len(cps) * per_cp < need:
            return frozenset(), None
        addresses = [s.endpoint.address for s in candidates]
        depths = dict(zip(addresses, self.memory.depths(cps, addresses), strict=True))
        return frozenset(a for a, d in depths.items() if d * per_cp >= need), depths

    def retain(self, addresses: Sequence[str]) -> None:
        """Forget the pods that left the pool in every model of them this scheduler keeps."""
        self.prefix_index.retain(addresses)
        self.residency.retain(addresses)
        self.memory.retain(addresses)

    def on_routed(self, request: InferenceRequest, address: str) -> None:
        """The request was sent to `address`: its prefix and adapter there, and the plugins'."""
        for plugin in self._hooked["on_routed"]:
            plugin.on_routed(request, address)

    def on_first_token(self, request: InferenceRequest, address: str) -> None:
        """The pod at `address` began the request's response."""
        for plugin in self._hooked["on_first_token"]:
            plugin.on_first_token(request, address)

    def on_finished(self, request: InferenceRequest, address: str) -> None:
        """The request routed to `address` ended there (once per `on_routed`)."""
        for plugin in self._hooked["on_finished"]:
            plugin.on_finished(request, address)

    def on_aborted(self, request: InferenceRequest, address: str) -> None:
        """As `on_finished`, for a request that ended without a response (plugins may tell)."""
        for plugin in self._hooked["on_aborted"]:
            plugin.on_aborted(request, address)

    def _bound_prefix_lru(self, state: EndpointState, block_chars: int) -> None:
        """The pod's KV cache in index blocks (its reported blocks x block size, in characters
        at CHARS_PER_TOKEN) bounds what the approximate index believes it caches."""
        m = state.metrics
        if m is None or not m.num_gpu_blocks or not m.block_size:
            return
        tokens = m.num_gpu_blocks * m.block_size
        self.prefix_index.set_capacity(state.endpoint.address, tokens * CHARS_PER_TOKEN // block_chars)


def build_scheduler(
    config: GatewayConfig,
    previous: WeightedScheduler | None = None,
    kv_index: KVIndex | None = None,
    pool_name: str | None = None,
) -> WeightedScheduler:
    """The scheduler of `config` for pool `pool_name` (None: an aggregated pool), taking over
    what `previous` learned."""
    pd = config.pool(pool_name).disaggregation if pool_name is not None else None
    return WeightedScheduler(
        config.scheduler_profiles(),
        default_profile=config.default_profile,
        prefix_index=previous.prefix_index if previous is not None else None,
        residency=previous.residency if previous is not None else None,
        kv_index=kv_index if kv_index is not None else previous.kv_index if previous is not None else None,
        plugins=previous.plugins if previous is not None else None,
        handler=Disaggregated(pd) if pd is not None else None,
        memory=previous.memory if previous is not None else None,
    )
