"""Scorers: `score(request, candidates, ctx) -> list[float]`, one value in [0, 1] per pod.

Higher is better. Each scorer's formula is in its docstring. Pods whose metrics were never
scraped (`metrics is None`), or whose field is unknown (`None`: missing or rejected by the
parser), get the worst score for that field, never an idle-looking one: a pod the EPP knows
nothing about must not attract a herd. Inputs are finite and non-negative by construction
(epp/datalayer/pool.py sanitises the records), so no scorer checks for NaN or infinities itself.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from epp.datalayer.adapter_residency import AdapterResidency
from epp.datalayer.endpoint_records import EndpointState, Metrics
from epp.datalayer.kv_index import KVIndex
from epp.datalayer.prefix_index import DEFAULT_BLOCK_CHARS, PrefixIndex
from epp.datalayer.session_memory import SessionMemory
from epp.scheduling.request import InferenceRequest
from gateway.scheduling_params import DEFAULT_THRESHOLDS, Thresholds


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
    # `predict_ttft`'s answer for the (request, candidates) it was asked about
    # (epp/scheduling/ttft_prediction.py): the scorer, a latency objective and the pick's
    # ledger commitment read the same prediction, made once per decision.
    ttft: list[Any] = field(default_factory=list, compare=False)
    # `matched_blocks`' answer for the (request, candidates) it was asked about: the prefix
    # scorers and predicted-ttft read the same counts, looked up once per decision.
    matched: list[Any] = field(default_factory=list, compare=False)
    # Each pod's KV memory of whole conversations (epp/datalayer/session_memory.py) and this
    # prompt's checkpoints in it, with the tokens one checkpoint stands for; () without one.
    memory: SessionMemory | None = None
    checkpoints: tuple[int, ...] = ()
    checkpoint_tokens: float = 0.0
    # Each pod's held depth of those checkpoints, when the filters already walked the memory
    # for them (epp/scheduling/weighted.py `_holders`); None: the prediction walks it.
    memory_depths: Mapping[str, int] | None = None


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
        elif adapter_resident(adapter, s.address, m, residency):
            out.append(1.0)
        elif m.max_lora <= 0 or len(m.running_adapters) + len(m.waiting_adapters) < m.max_lora:
            out.append(0.8)
        elif adapter in m.waiting_adapters:
            out.append(0.6)
        else:
            out.append(0.0)
    return out


def adapter_resident(adapter: str, address: str, m: Metrics, residency: AdapterResidency | None) -> bool:
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
    counts, block_sizes = matched_blocks(request, candidates, ctx)
    floor = ctx.thresholds.prefix_min_blocks
    approx = float(max(len(ctx.prefix_hashes), floor))
    ids = request.token_ids or ()
    return [
        n / (approx if size is None else float(max(len(ids) // size, floor)))
        for n, size in zip(counts, block_sizes, strict=True)
    ]


def matched_blocks(
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


def host_held_blocks(
    request: InferenceRequest, candidates: Sequence[EndpointState], ctx: ScoringContext
) -> list[int] | None:
    """Per pod, the request's leading blocks it holds in GPU or host memory, by the precise
    index (0 for a pod the index cannot look up exactly); None when no pod reported a block in
    host memory (the common case: then nothing differs from `matched_blocks`, and no walk)."""
    ids, index = request.token_ids, ctx.kv_index
    if ids is None or index is None or not index.has_host_blocks():
        return None
    addresses = ctx.addresses if ctx.addresses is not None else [s.address for s in candidates]
    model = request.target_model
    depths = index.lookup_held(ids, model, request.adapter)
    return [depths.get(a, 0) if index.precise_block_size(a, model) else 0 for a in addresses]


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
