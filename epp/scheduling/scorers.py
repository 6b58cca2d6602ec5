"""Scorers: `score(request, candidates, ctx) -> list[float]`, one value in [0, 1] per pod.

Higher is better. Each scorer's formula is in its docstring. Pods whose metrics were never
scraped (`metrics is None`), or whose field is unknown (`None`: missing or rejected by the
parser), get the worst score for that field, never an idle-looking one: a pod the EPP knows
nothing about must not attract a herd. Inputs are finite and non-negative by construction
(epp/datalayer/pool.py sanitises the records), so no scorer checks for NaN or infinities itself.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from epp.datalayer.adapter_residency import AdapterResidency, Slot
from epp.datalayer.kv_index import KVIndex
from epp.datalayer.metric_dialects import NO_KV_GAUGE
from epp.datalayer.pool import KV_ADMIT_WATERMARK, EndpointState, Metrics
from epp.datalayer.prefix_index import DEFAULT_BLOCK_CHARS, PrefixIndex
from epp.scheduling.adapter_slots import slot_cost, slot_scarcity
from epp.scheduling.request import CHARS_PER_TOKEN, InferenceRequest
from gateway.scheduling_params import DEFAULT_THRESHOLDS, Thresholds

# Decode time per token `predicted-ttft` assumes while no candidate's is observed (50 tokens/s).
DEFAULT_TPOT_S = 0.02
# Adapter placement: an adapter among a pod's CPU_CACHE_SLOTS x max_lora most recently used,
# but out of its GPU slots, is taken as still in the pod's CPU memory (vLLM's max_cpu_loras is
# at least max_loras; modelsim's profiles hold 8 for 4 slots), loading at this fraction of
# adapterLoadMs (a copy, not a disk read: modelsim 10 vs 500 ms). Tuning seeds 100-102 of lora
# gave the same TTFT P95 for fractions 0.05-0.5 and a lower spread than without (2.0 vs 2.5
# pods per adapter).
CPU_CACHE_SLOTS = 2
CPU_LOAD_FRACTION = 0.25


@dataclass(frozen=True, slots=True)
class ScoringContext:
    """Per-request inputs shared by all scorers (computed once per request, not per pod)."""

    thresholds: Thresholds = DEFAULT_THRESHOLDS
    prefix_hashes: tuple[int, ...] = ()
    prefix_index: PrefixIndex | None = None
    addresses: Sequence[str] | None = None  # of the candidates, in order, when the caller has them
    residency: AdapterResidency | None = None  # each pod's modelled GPU adapter slots
    kv_index: KVIndex | None = None  # the pods' own KV events (epp/datalayer/kv_index.py)
    block_chars: int = DEFAULT_BLOCK_CHARS  # characters per block of `prefix_hashes`
    # Filled by `predicted-ttft`: per candidate, the seconds this request's own prefill takes
    # there (at least one engine step), which the pick commits to the pod's ledger (epp/datalayer/ledger.py).
    prefill_s: list[float] = field(default_factory=list)
    # Filled by `predicted-ttft`: per candidate, the predicted seconds to this request's first
    # token there (None: unknown), which a request's latency objective is held against.
    predicted_s: list[float | None] = field(default_factory=list)
    # `_matched_blocks`' answer for the (request, candidates) it was asked about: the prefix
    # scorers and predicted-ttft read the same counts, looked up once per decision.
    matched: list[Any] = field(default_factory=list, compare=False)


Scorer = Callable[[InferenceRequest, Sequence[EndpointState], ScoringContext], list[float]]


def _min_max_inverse(values: Sequence[float | None]) -> list[float]:
    """(max - x) / (max - min) over known values, 1 when all equal; unknown (None) -> 0."""
    known = [v for v in values if v is not None]
    if not known:
        return [0.0] * len(values)
    lo, hi = min(known), max(known)
    if hi == lo:
        return [0.0 if v is None else 1.0 for v in values]
    span = hi - lo
    return [0.0 if v is None else (hi - v) / span for v in values]


def queue(request: InferenceRequest, candidates: Sequence[EndpointState], ctx: ScoringContext) -> list[float]:
    """GIE's queue scorer: (maxQ - q) / (maxQ - minQ) over candidates, 1 if all equal.

    q = `EndpointState.queue`: scraped waiting + in-flight requests the scrape has not seen
    yet. Between two scrapes the scraped queue is frozen, so a burst would all land on the pod
    that looked emptiest; the unseen term spreads it without double counting.
    """
    return _min_max_inverse([s.queue for s in candidates])


def kv_cache(
    request: InferenceRequest, candidates: Sequence[EndpointState], ctx: ScoringContext
) -> list[float]:
    """1 - KV-cache usage (a 0..1 fraction by construction); unknown -> 0."""
    out: list[float] = []
    for s in candidates:
        kv = s.metrics.kv_usage if s.metrics is not None else None
        out.append(0.0 if kv is None else 1.0 - kv)
    return out


def running_requests(
    request: InferenceRequest, candidates: Sequence[EndpointState], ctx: ScoringContext
) -> list[float]:
    """(maxR - r) / (maxR - minR) over candidates with r = running requests, 1 if all equal."""
    return _min_max_inverse([s.metrics.running if s.metrics is not None else None for s in candidates])


def lora_affinity(
    request: InferenceRequest, candidates: Sequence[EndpointState], ctx: ScoringContext
) -> list[float]:
    """1.0 adapter resident (running, or among the pod's max_lora most recently used as the EPP
    models it); 0.8 room to load it (active + waiting < max_lora, or the pod does not report
    LoRA state); 0.6 adapter waiting; else 0. A base-model request scores 1 everywhere;
    unknown metrics -> 0.

    GIE's scorer, with residency: vLLM keeps idle adapters in their GPU slots until a newer one
    evicts them, and its metrics name only the adapters of running and waiting requests, so
    a pod that served the adapter a moment ago would look no better than one that must load
    it. The residency model (epp/datalayer/adapter_residency.py) is fed by the EPP's routing, the scrapes'
    running adapters and the pods' KV events (BlockStored LoRA names / ids).
    """
    adapter = request.adapter
    if adapter is None:
        return [1.0] * len(candidates)
    residency = ctx.residency
    out: list[float] = []
    for s in candidates:
        m = s.metrics
        if m is None:
            out.append(0.0)
        elif _adapter_resident(adapter, s.address, m, residency):
            out.append(1.0)
        elif m.max_lora <= 0 or len(m.running_adapters) + len(m.waiting_adapters) < m.max_lora:
            out.append(0.8)
        elif adapter in m.waiting_adapters:
            out.append(0.6)
        else:
            out.append(0.0)
    return out


def _adapter_resident(adapter: str, address: str, m: Metrics, residency: AdapterResidency | None) -> bool:
    """Running on the pod, or among its max_lora most recently used adapters (the model)."""
    return adapter in m.running_adapters or (
        residency is not None and residency.resident(address, adapter, m.max_lora)
    )


def prefix_cache(
    request: InferenceRequest, candidates: Sequence[EndpointState], ctx: ScoringContext
) -> list[float]:
    """matched leading blocks / max(total blocks, prefixMinBlocks).

    GIE divides by the prompt's own block count, so a 2-block prompt that matches scores
    1.0, as much as a 10k-token document hit, and outranks real load differences. Dividing
    by at least `prefix_min_blocks` (16 blocks ~ 256 tokens by default) makes the score
    proportional to the prefill a hit actually saves.
    """
    hashes, index = ctx.prefix_hashes, ctx.prefix_index
    if not hashes or index is None:
        return [0.0] * len(candidates)
    denom = float(max(len(hashes), ctx.thresholds.prefix_min_blocks))
    addresses = ctx.addresses if ctx.addresses is not None else [s.address for s in candidates]
    return [n / denom for n in index.match_counts(hashes, addresses)]


def precise_prefix_cache(
    request: InferenceRequest, candidates: Sequence[EndpointState], ctx: ScoringContext
) -> list[float]:
    """matched leading KV blocks / max(prompt blocks, prefixMinBlocks), from the pod's own KV
    events; a pod without a complete event stream, or a model without a tokenizer: prefix-cache.

    The request's token ids (the model's tokenizer and chat template, epp/datalayer/tokenizer.py) are
    cut into the pod's KV block size and chained as the precise index keys the pod's
    BlockStored events (epp/datalayer/kv_index.py: per model and LoRA adapter); the score counts the
    leading blocks the pod reported holding and not removed since. Per pod it falls back to
    the approximate `prefix-cache` score (what this EPP routed there) while the pod's event
    stream is missing or not yet complete (no events port, a gap being resynced), or when the
    request has no token ids; /debug/pool's `prefix_scoring` says which pods use which.
    """
    counts, block_sizes = _matched_blocks(request, candidates, ctx)
    floor = ctx.thresholds.prefix_min_blocks
    approx = float(max(len(ctx.prefix_hashes), floor))
    ids = request.token_ids or ()
    return [
        n / (approx if size is None else float(max(len(ids) // size, floor)))
        for n, size in zip(counts, block_sizes, strict=True)
    ]


def _matched_blocks(
    request: InferenceRequest, candidates: Sequence[EndpointState], ctx: ScoringContext
) -> tuple[list[int], list[int | None]]:
    """Per pod, the request's leading blocks it holds, and the precise index's block size in
    tokens when the count comes from the pod's own KV events (None: from the approximate index,
    blocks of `ctx.block_chars` characters; 0 blocks without hashes). Looked up once per
    (request, candidates): the callers only read it."""
    memo = ctx.matched
    if memo and memo[0] is request and memo[1] is candidates:
        return memo[2]
    out = _lookup_blocks(request, candidates, ctx)
    memo[:] = [request, candidates, out]
    return out


def _lookup_blocks(
    request: InferenceRequest, candidates: Sequence[EndpointState], ctx: ScoringContext
) -> tuple[list[int], list[int | None]]:
    hashes, approx = ctx.prefix_hashes, ctx.prefix_index
    addresses = ctx.addresses if ctx.addresses is not None else [s.address for s in candidates]
    if hashes and approx is not None:
        counts = approx.match_counts(hashes, addresses)
    else:
        counts = [0] * len(candidates)
    block_sizes: list[int | None] = [None] * len(candidates)
    ids, index = request.token_ids, ctx.kv_index
    if ids is None or index is None:
        return counts, block_sizes
    depths: dict[str, int] | None = None
    model = request.target_model
    for i, address in enumerate(addresses):
        block_size = index.precise_block_size(address, model)
        if block_size is None:
            continue
        if depths is None:  # one walk of the request's blocks for every precise pod
            depths = index.lookup(ids, model, request.adapter)
        counts[i] = depths.get(address, 0)
        block_sizes[i] = block_size
    return counts, block_sizes


def inflight(
    request: InferenceRequest, candidates: Sequence[EndpointState], ctx: ScoringContext
) -> list[float]:
    """1 - (r / max r + t / max t) / 2 over the EPP's own in-flight requests r and tokens t.

    Proportional rather than min-max: 10 vs 11 in-flight should be nearly a tie, not 1 vs 0.
    Needs no scrape, so it is current to the last request and works before the first scrape.
    """
    max_r = max((s.inflight_requests for s in candidates), default=0)
    max_t = max((s.inflight_tokens for s in candidates), default=0)
    out: list[float] = []
    for s in candidates:
        load = (s.inflight_requests / max_r if max_r else 0.0) + (s.inflight_tokens / max_t if max_t else 0.0)
        out.append(1.0 - load / 2.0)
    return out


def observed_speed(
    request: InferenceRequest, candidates: Sequence[EndpointState], ctx: ScoringContext
) -> list[float]:
    """min(wait) / wait_i with predicted wait_i = (n_i + 1) x t_i, for heterogeneous GPUs.

    t_i = ttft_ewma + tpot_ewma x expected output tokens: the observed time per request on
    this pod; n_i = max(in-flight, scraped waiting + running): the requests ahead of this one.
    A pod 5x slower at equal load scores 0.2. Pods without observations yet take the median
    t of those with (neither favoured nor starved); if none has any, only load counts.
    """
    out_tokens = request.expected_output_tokens
    times: list[float | None] = []
    for s in candidates:
        if s.ttft_ewma is None and s.tpot_ewma is None:
            times.append(None)
        else:
            times.append((s.ttft_ewma or 0.0) + (s.tpot_ewma or 0.0) * out_tokens)
    known = sorted(t for t in times if t is not None)
    fallback = known[len(known) // 2] if known else 1.0
    waits: list[float] = []
    for s, t in zip(candidates, times, strict=True):
        m = s.metrics
        seen = ((m.waiting or 0.0) + (m.running or 0.0)) if m is not None else 0.0
        ahead = s.inflight_requests if s.inflight_requests > seen else seen
        per_request = fallback if t is None else t
        waits.append((ahead + 1.0) * (per_request if per_request > 1e-6 else 1e-6))
    best = min(waits, default=1.0)
    return [best / w for w in waits]


def queue_speed(
    request: InferenceRequest, candidates: Sequence[EndpointState], ctx: ScoringContext
) -> list[float]:
    """min(wait) / wait_i with wait_i = (q_i + 1) x tpot_i: TTFT on heterogeneous GPUs.

    A continuously batching server starts a new request once the requests *queued* ahead of
    it are admitted; running requests share the batch and do not serialise in front of it
    (`observed-speed` counts them as if they did, which sends traffic from a busy fast GPU
    to an idle slow one and costs TTFT). q_i = scraped waiting + in-flight requests the
    scrape has not seen yet; tpot_i = observed inter-token time (the pod's pace at its
    current batch). Pods without observations take the median tpot of those with.
    """
    known = sorted(s.tpot_ewma for s in candidates if s.tpot_ewma is not None)
    fallback = known[len(known) // 2] if known else 1.0
    waits: list[float] = []
    for s in candidates:
        q = s.queue if s.queue is not None else float(s.inflight_requests)
        pace = fallback if s.tpot_ewma is None else s.tpot_ewma
        waits.append((q + 1.0) * (pace if pace > 1e-6 else 1e-6))
    best = min(waits, default=1.0)
    return [best / w for w in waits]


def predicted_ttft(
    request: InferenceRequest, candidates: Sequence[EndpointState], ctx: ScoringContext
) -> list[float]:
    """min(pred) / pred_i, pred_i = q_i x L_i x u_i / pace_i + max(tpot_i, max(1, P - C_i) / pace_i) + A_i + K_i.

    The time until this request's first token on pod i: the prompt tokens queued ahead of it
    (q_i = `EndpointState.queue`, scraped waiting + routed-but-unseen, times L_i, the pod's
    typical prompt, times u_i, the share of it the pod's prefix cache does not hold: both
    learned from its histograms, else this prompt's P and 1; with the pod's ledger, this EPP's
    own picks since the page count exactly instead, as the seconds until their projected prefills
    end, `busy_s`, and q_i is the page's waiting requests), plus this prompt's own uncached
    tokens (P less C_i, the tokens of its leading blocks the pod holds: precise KV events,
    else the approximate prefix index; at least the one token vLLM always recomputes), over
    the pod's prefill pace pace_i (tokens/s learned from `vllm:request_prefill_time_seconds`
    and the prompt-token histograms, epp/datalayer/prefill_pace.py; else the candidates' median, else
    `prefillTokensPerS`), its difference from the candidates' median raised to `paceContrast`
    (1 by default: a pace learned from a pod's recent prompt mix is noisy, identical GPUs read
    up to 1.4x apart, but damping it also damps real GPU differences); pods that report the same
    KV cache (blocks and block size: one hardware class) share their best pace. This prompt's own
    prefill takes at least one engine step, tpot_i (the pod's observed inter-token time, else
    the candidates' median, else 20 ms): a short prompt rides a step bound by the batch's
    decode, and a pod busy with a long prefill has long steps. Plus A_i =
    `adapterLoadMs` when the request's LoRA adapter is not resident there (as in
    lora-affinity); plus K_i when the pod's free KV (less vLLM's admission watermark) does
    not hold the tokens ahead, this prompt and its expected output: it admits nothing until a
    running request ends, about tpot_i x expected output / (running + 1) (the soonest of the
    running requests' remaining decodes; never on an engine that exports no KV measure,
    llama.cpp, which admits by free slots and shows the requests waiting for one in q_i); or,
    for a non-resident adapter on a pod whose `max_lora` slots all hold adapters of running
    requests, tpot_i x expected output: vLLM schedules no request of another adapter until one
    of them has no request running.
    With `adapterPlacement` (the default) on a pod that reports its slots, the adapter terms
    are its slot cost instead (epp/datalayer/adapter_residency.py `slot_cost`, from the adapters this EPP
    has in flight on each pod and the page's running ones): 0 on the pod that runs most of
    its requests, a share of `adapterSlotMs` on another that runs it, load + `adapterSlotMs`
    for a free slot (0 where it sits idle in one), and on a pod whose slots other adapters
    hold, also the wait until the soonest of them drains; `adapterSlotMs` scaled by how scarce
    the free slots are for the adapters holding none (adapter_slots.py `slot_scarcity`).
    Proportional, so a pod predicted twice as slow scores 0.5 and the score blends with
    others. A pod whose metrics or waiting count are unknown scores 0, as in every scorer here.
    """
    th = ctx.thresholds
    pace_fallback: float | None = None  # the medians, computed when a pod first needs one
    class_pace: dict[tuple[int | None, int | None], float] = {}
    tpot_fallback: float | None = None
    counts, block_sizes = _matched_blocks(request, candidates, ctx)
    approx_block_tokens = ctx.block_chars / CHARS_PER_TOKEN
    prompt = float(request.prompt_tokens)
    output = float(request.expected_output_tokens)
    adapter, residency, load_s = request.adapter, ctx.residency, th.adapter_load_s
    contrast = th.pace_contrast
    placement, slot_s = th.adapter_placement, th.adapter_slot_s
    now = residency.clock() if residency is not None else 0.0
    peak = 0  # the most requests of this adapter in flight on one candidate
    slots: list[list[Slot] | None] = [None] * len(candidates)
    if adapter is not None and placement and residency is not None:
        addresses = ctx.addresses if ctx.addresses is not None else [c.address for c in candidates]
        peak = max((residency.in_flight(a).get(adapter, 0) for a in addresses), default=0)
        for i, c in enumerate(candidates):
            cm = c.metrics
            if cm is not None and cm.max_lora > 0:
                slots[i] = residency.slots(c.address, cm.running_adapters, cm.scraped_at)
        slot_s *= slot_scarcity(candidates, slots)
    preds = ctx.predicted_s
    preds.clear()
    prefill_s = ctx.prefill_s
    prefill_s.clear()
    for s, n, size, pod_slots in zip(candidates, counts, block_sizes, slots, strict=True):
        m, q = s.metrics, s.queue
        if m is None or q is None:
            preds.append(None)
            prefill_s.append(0.0)
            continue
        typical = s.mean_prompt_tokens if s.mean_prompt_tokens is not None else prompt
        if s.pending_requests is not None:
            # The page's waiting requests (others', and this EPP's it shows waiting) at the
            # typical prompt; this EPP's picks since, exactly, in `busy_s`.
            q = s.foreign_waiting + s.stuck_requests
        ahead = q * typical * (s.uncached_fraction if s.uncached_fraction is not None else 1.0)
        own = prompt - n * (approx_block_tokens if size is None else size)
        if own < 1.0:
            own = 1.0
        if pace_fallback is None:
            class_pace = _class_paces(candidates)
            pace_fallback = _median([c.prefill_tps for c in candidates], th.prefill_tokens_per_s)
        pace = (
            class_pace.get((m.num_gpu_blocks, m.block_size), s.prefill_tps)
            if m.num_gpu_blocks
            else s.prefill_tps
        )
        if pace is None:
            pace = pace_fallback
        elif contrast != 1.0:
            pace = pace_fallback * (pace / pace_fallback) ** contrast
        tpot = s.tpot_ewma
        if tpot is None:
            if tpot_fallback is None:
                tpot_fallback = _median([c.tpot_ewma for c in candidates], DEFAULT_TPOT_S)
            tpot = tpot_fallback
        own_s = own / pace
        # What this prompt adds to the pod's prefill work: its tokens at the pod's pace. Short
        # prompts picked together share an engine step, so the one-step floor is this
        # request's own wait, not work it queues ahead of the next pick.
        prefill_s.append(own_s)
        if own_s < tpot:
            own_s = tpot  # at least one engine step
        pred = ahead / pace + s.busy_s + own_s
        ahead += s.busy_s * pace  # in tokens, for the KV check below
        slot_wait = False
        if adapter is not None and pod_slots is not None and residency is not None:
            resident = _adapter_resident(adapter, s.address, m, residency)
            load = 0.0
            if not resident:
                load = load_s
                if adapter in residency.adapters(s.address, CPU_CACHE_SLOTS * m.max_lora):
                    load = load_s * CPU_LOAD_FRACTION  # evicted from a slot lately: still in CPU memory
                if _slots_full(s.address, m, residency):
                    load += load_s  # it evicts a resident adapter, whose next request loads it again
            pred += slot_cost(
                adapter,
                pod_slots,
                m.max_lora,
                now=now,
                tpot_s=tpot,
                output_tokens=request.expected_output_tokens,
                load_s=load,
                slot_s=slot_s,
                peak=peak,
                resident=resident,
            )
        elif adapter is not None and not _adapter_resident(adapter, s.address, m, residency):
            pred += load_s
            if _slots_full(s.address, m, residency):
                pred += load_s  # it evicts a resident adapter, whose next request loads it again
            slot_wait = 0 < m.max_lora <= len(m.running_adapters)
        if slot_wait or (s.endpoint.engine not in NO_KV_GAUGE and not _kv_holds(m, ahead + own + output)):
            if slot_wait:  # every slot pinned: wait until one adapter's requests all end
                pred += tpot * output
            else:
                pred += tpot * output / ((m.running or 0.0) + 1.0)
        preds.append(pred)
    known = [p for p in preds if p is not None]
    if not known:
        return [0.0] * len(candidates)
    best = min(known)
    if not best < math.inf:  # every prediction overflowed: nothing to prefer
        return [0.0] * len(candidates)
    return [0.0 if p is None else (best / p if p > 0.0 else 1.0) for p in preds]


def _slots_full(address: str, m: Metrics, residency: AdapterResidency | None) -> bool:
    """Every one of the pod's `max_lora` GPU slots holds an adapter (running, or resident as the
    EPP models it): loading another evicts one."""
    if m.max_lora <= 0:
        return False
    if len(m.running_adapters) >= m.max_lora:
        return True
    return residency is not None and len(residency.adapters(address, m.max_lora)) >= m.max_lora


def _class_paces(candidates: Sequence[EndpointState]) -> dict[tuple[int | None, int | None], float]:
    """The best learned pace per hardware class, pods reporting the same KV cache (blocks and
    block size: the same GPU, model and engine settings).

    A pod's pace is a lower bound on its GPU's (short prompts take a whole step whatever their
    length), raised only by the long prompts it happens to get; a pod of the class that had
    none would read several times slower than its twins and get no long prompt to learn from.
    """
    best: dict[tuple[int | None, int | None], float] = {}
    for c in candidates:
        m, pace = c.metrics, c.prefill_tps
        if m is None or pace is None or not m.num_gpu_blocks:
            continue
        key = (m.num_gpu_blocks, m.block_size)
        if pace > best.get(key, 0.0):
            best[key] = pace
    return best


def _median(values: Sequence[float | None], default: float) -> float:
    """The (upper) median of the known values; `default` when none is known."""
    known = sorted(v for v in values if v is not None)
    return known[len(known) // 2] if known else default


def _kv_holds(m: Metrics, tokens: float) -> bool:
    """The pod's free KV cache (less vLLM's admission watermark) holds `tokens` more; False
    when unknown. Without the block counts, only a cache at the watermark counts as full."""
    kv = m.kv_usage
    if kv is None:
        return False
    free = 1.0 - KV_ADMIT_WATERMARK - kv
    blocks, block_size = m.num_gpu_blocks, m.block_size
    if not blocks or block_size is None:
        return free > 0.0
    return free * blocks * block_size >= tokens
