"""The `predicted-ttft` scorer and the prediction behind it: per pod, the seconds until this
request's first token, as named terms. Pure.

    total = queue wait + own prefill + adapter terms + admission wait

- queue wait: the prompt tokens queued ahead of the request at the pod's prefill pace
  (`EndpointState.queue` requests x the pod's typical prompt x the share of it its prefix
  cache does not hold; with the pod's ledger, the page's waiting requests instead, plus this
  EPP's own picks since as the seconds until their projected prefills end, `busy_s`);
- own prefill: this prompt's uncached tokens (P less the tokens of its leading blocks the pod
  holds: precise KV events, else the approximate prefix index; at least the one token vLLM
  always recomputes) at the pod's pace, at least one engine step (tpot: a short prompt rides
  a step bound by the batch's decode);
- adapter terms: the LoRA adapter's load where it is not resident, or with `adapterPlacement`
  on a pod that reports its slots, its slot cost (epp/scheduling/adapter_slots.py);
- host memory: where the pod's KV events show more of the prompt's leading blocks in host
  memory (vLLM's CPU offload) than on the GPU, those tokens are loaded back, not recomputed:
  they cost `HOST_LOAD_FRACTION` of their prefill;
- the session's own history: with the KV-memory model (epp/datalayer/session_memory.py) a pod
  also holds the prompt's leading tokens up to the deepest checkpoint it has of it, at any
  length (the prefix index sees the first 16 KB);
- admission wait: when the pod's free KV (less vLLM's admission watermark) does not hold the
  tokens ahead, this prompt and its expected output, about tpot x expected output /
  (running + 1) until a running request ends (never on an engine that exports no KV measure:
  llama.cpp admits by free slots and shows the requests waiting for one in the queue); or,
  for a non-resident adapter on a pod whose `max_lora` slots all hold adapters of running
  requests, tpot x expected output: vLLM schedules no request of another adapter until one of
  them has no request running.

The pace is the pod's learned prefill pace (epp/datalayer/prefill_pace.py; pods that report
the same KV cache share their best), else the candidates' median, else `prefillTokensPerS`,
its difference from the median raised to `paceContrast`; tpot is the pod's observed
inter-token time, else the candidates' median, else `DEFAULT_TPOT_S`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from epp.datalayer.adapter_residency import AdapterResidency, Slot
from epp.datalayer.endpoint_records import KV_ADMIT_WATERMARK, EndpointState, Metrics
from epp.datalayer.metric_dialects import NO_KV_GAUGE
from epp.scheduling.adapter_slots import slot_cost, slot_scarcity
from epp.scheduling.kv_memory import SessionView
from epp.scheduling.request import CHARS_PER_TOKEN, InferenceRequest
from epp.scheduling.scorers import ScoringContext, adapter_resident, host_held_blocks, matched_blocks

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
# A prefix block in host memory costs this share of its prefill to load back: a Llama-3.1-8B
# token's KV is 128 KiB (32 layers x 8 KV heads x 128 x K and V x 2 bytes), so 1k tokens are
# ~130 MB, ~5 ms over PCIe 5 at ~25 GB/s, against ~50-70 ms to prefill them on an H100
# (calibration.md). Dynamo's router weighs host-memory hits apart from GPU hits the same way.
HOST_LOAD_FRACTION = 0.1


class TtftTerms(NamedTuple):
    """One pod's predicted time to this request's first token, term by term (seconds)."""

    queue_wait_s: float
    own_prefill_s: float
    adapter_s: tuple[float, ...]  # in the order they add up
    admission_wait_s: float
    # What this prompt adds to the pod's prefill work: its tokens at the pod's pace, without the
    # one-step floor (short prompts picked together share a step); the pick commits it to the
    # pod's ledger (epp/datalayer/ledger.py).
    prefill_work_s: float
    # What the placement costs the others, not this request (epp/scheduling/kv_memory.py): live
    # conversations' tokens the pod would evict to hold this one, at the pod's pace x
    # `evictionWeight` (their next turns prefill them again), less the seeding credit of a
    # popular shared prefix the pod lacks (later conversations sent there reuse it). Not part
    # of `total_s`; the scorer ranks by `cost_s`.
    placement_s: float = 0.0

    @property
    def total_s(self) -> float:
        total = self.queue_wait_s + self.own_prefill_s
        for term in self.adapter_s:
            total += term
        return total + self.admission_wait_s

    @property
    def cost_s(self) -> float:
        """This request's predicted TTFT plus what the placement costs the others."""
        return self.total_s + self.placement_s


def predicted_ttft(
    request: InferenceRequest, candidates: Sequence[EndpointState], ctx: ScoringContext
) -> list[float]:
    """min(pred) / pred_i, pred_i = q_i x L_i x u_i / pace_i + max(tpot_i, max(1, P - C_i) / pace_i) + A_i + K_i + E_i.

    pred_i is `predict_ttft`'s total for pod i: the queue ahead of the request at the pod's
    prefill pace, its own uncached prefill (at least one engine step), its adapter's load or
    slot cost (A_i), the wait for KV room or an adapter slot (K_i) and, with the KV-memory
    model, the live conversations' tokens it would evict there at its pace (E_i, x
    `evictionWeight`: what the pick costs the others); the module docstring
    (epp/scheduling/ttft_prediction.py) says where each comes from. Proportional, so a pod
    predicted twice as slow scores 0.5 and the score blends with others. A pod whose metrics
    or waiting count are unknown scores 0, as in every scorer here.
    """
    preds = [None if t is None else t.cost_s for t in predict_ttft(request, candidates, ctx)]
    known = [p for p in preds if p is not None]
    if not known:
        return [0.0] * len(candidates)
    best = min(known)
    if not best < math.inf:  # every prediction overflowed: nothing to prefer
        return [0.0] * len(candidates)
    return [0.0 if p is None else (best / p if p > 0.0 else 1.0) for p in preds]


def predict_ttft(
    request: InferenceRequest, candidates: Sequence[EndpointState], ctx: ScoringContext
) -> list[TtftTerms | None]:
    """Per candidate, its `TtftTerms` (None: metrics or waiting count unknown). Made once per
    (request, candidates) and kept in `ctx.ttft`: the callers only read it."""
    memo = ctx.ttft
    if memo and memo[0] is request and memo[1] is candidates:
        out: list[TtftTerms | None] = memo[2]
        return out
    fleet = _Fleet.of(request, candidates, ctx)
    counts, block_sizes = matched_blocks(request, candidates, ctx)
    session = SessionView.of(request, candidates, ctx)
    host = host_held_blocks(request, candidates, ctx)
    out = [
        _pod_terms(s, n, size, pod_slots, request, fleet, session, i, host[i] if host else 0)
        for i, (s, n, size, pod_slots) in enumerate(
            zip(candidates, counts, block_sizes, fleet.slots, strict=True)
        )
    ]
    memo[:] = [request, candidates, out]
    return out


@dataclass(frozen=True, slots=True)
class _Fleet:
    """What every candidate's prediction shares: the request's figures, the fallbacks, the
    adapter's slots per pod."""

    prompt: float
    output: float
    approx_block_tokens: float
    class_pace: dict[tuple[int | None, int | None], float]
    pace_fallback: float
    pace_contrast: float
    tpot_fallback: float
    residency: AdapterResidency | None
    load_s: float
    slot_s: float
    now: float
    peak: int  # the most requests of this adapter in flight on one candidate
    slots: list[list[Slot] | None]

    @classmethod
    def of(
        cls, request: InferenceRequest, candidates: Sequence[EndpointState], ctx: ScoringContext
    ) -> _Fleet:
        th, residency, adapter = ctx.thresholds, ctx.residency, request.adapter
        peak = 0
        slot_s = th.adapter_slot_s
        slots: list[list[Slot] | None] = [None] * len(candidates)
        if adapter is not None and th.adapter_placement and residency is not None:
            addresses = ctx.addresses if ctx.addresses is not None else [c.address for c in candidates]
            peak = max((residency.in_flight(a).get(adapter, 0) for a in addresses), default=0)
            for i, c in enumerate(candidates):
                cm = c.metrics
                if cm is not None and cm.max_lora > 0:
                    slots[i] = residency.slots(c.address, cm.running_adapters, cm.scraped_at)
            slot_s *= slot_scarcity(candidates, slots)
        return cls(
            prompt=float(request.prompt_tokens),
            output=float(request.expected_output_tokens),
            approx_block_tokens=ctx.block_chars / CHARS_PER_TOKEN,
            class_pace=_class_paces(candidates),
            pace_fallback=_median([c.prefill_tps for c in candidates], th.prefill_tokens_per_s),
            pace_contrast=th.pace_contrast,
            tpot_fallback=_median([c.tpot_ewma for c in candidates], DEFAULT_TPOT_S),
            residency=residency,
            load_s=th.adapter_load_s,
            slot_s=slot_s,
            now=residency.clock() if residency is not None else 0.0,
            peak=peak,
            slots=slots,
        )

    def pace(self, s: EndpointState, m: Metrics) -> float:
        """The pod's prefill pace, tokens/s: its hardware class's best, else its own, else the
        median; contrasted against the median by `paceContrast`."""
        pace = (
            self.class_pace.get((m.num_gpu_blocks, m.block_size), s.prefill_tps)
            if m.num_gpu_blocks
            else s.prefill_tps
        )
        if pace is None:
            return self.pace_fallback
        if self.pace_contrast != 1.0:
            return self.pace_fallback * (pace / self.pace_fallback) ** self.pace_contrast
        return pace


def _pod_terms(
    s: EndpointState,
    matched: int,
    block_size: int | None,
    pod_slots: list[Slot] | None,
    request: InferenceRequest,
    fleet: _Fleet,
    session: SessionView | None = None,
    index: int = 0,
    host_blocks: int = 0,
) -> TtftTerms | None:
    m, q = s.metrics, s.queue
    if m is None or q is None:
        return None
    typical = s.mean_prompt_tokens if s.mean_prompt_tokens is not None else fleet.prompt
    if s.pending_requests is not None:
        # The page's waiting requests (others', and this EPP's it shows waiting) at the
        # typical prompt; this EPP's picks since, exactly, in `busy_s`.
        q = s.foreign_waiting + s.stuck_requests
    ahead = q * typical * (s.uncached_fraction if s.uncached_fraction is not None else 1.0)
    own = fleet.prompt - matched * (fleet.approx_block_tokens if block_size is None else block_size)
    if session is not None:
        own = session.uncached(index, fleet.prompt, own)
    if host_blocks and block_size:  # loaded back from host memory, not recomputed
        on_host = min(own, host_blocks * block_size - (fleet.prompt - own))
        if on_host > 0.0:
            own -= on_host * (1.0 - HOST_LOAD_FRACTION)
    if own < 1.0:
        own = 1.0
    pace = fleet.pace(s, m)
    tpot = s.tpot_ewma if s.tpot_ewma is not None else fleet.tpot_fallback
    work_s = own / pace
    own_s = tpot if work_s < tpot else work_s  # at least one engine step
    queue_s = ahead / pace + s.busy_s
    ahead += s.busy_s * pace  # in tokens, for the KV check
    adapter_s, slot_wait = _adapter_terms(s, m, pod_slots, request, fleet, tpot)
    if slot_wait:  # every slot pinned: wait until one adapter's requests all end
        admission_s = tpot * fleet.output
    elif s.endpoint.engine not in NO_KV_GAUGE and not _kv_holds(m, ahead + own + fleet.output):
        admission_s = tpot * fleet.output / ((m.running or 0.0) + 1.0)
    else:
        admission_s = 0.0
    placement_s = 0.0
    if session is not None:
        credit = min(session.seeding_credit(index), own)  # never more than its own prefill
        placement_s = (session.eviction_tokens(index, own + fleet.output) - credit) / pace
    return TtftTerms(queue_s, own_s, adapter_s, admission_s, work_s, placement_s)


def _adapter_terms(
    s: EndpointState,
    m: Metrics,
    pod_slots: list[Slot] | None,
    request: InferenceRequest,
    fleet: _Fleet,
    tpot: float,
) -> tuple[tuple[float, ...], bool]:
    """The adapter's seconds on this pod, and whether every slot is pinned by others."""
    adapter, residency, load_s = request.adapter, fleet.residency, fleet.load_s
    if adapter is None:
        return (), False
    if pod_slots is not None and residency is not None:
        resident = adapter_resident(adapter, s.address, m, residency)
        load = 0.0
        if not resident:
            load = load_s
            if adapter in residency.adapters(s.address, CPU_CACHE_SLOTS * m.max_lora):
                load = load_s * CPU_LOAD_FRACTION  # evicted from a slot lately: still in CPU memory
            if _slots_full(s.address, m, residency):
                load += load_s  # it evicts a resident adapter, whose next request loads it again
        cost = slot_cost(
            adapter,
            pod_slots,
            m.max_lora,
            now=fleet.now,
            tpot_s=tpot,
            output_tokens=request.expected_output_tokens,
            load_s=load,
            slot_s=fleet.slot_s,
            peak=fleet.peak,
            resident=resident,
        )
        return (cost,), False
    if adapter_resident(adapter, s.address, m, residency):
        return (), False
    # A full set of slots: it evicts a resident adapter, whose next request loads it again.
    terms = (load_s, load_s) if _slots_full(s.address, m, residency) else (load_s,)
    return terms, 0 < m.max_lora <= len(m.running_adapters)


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
