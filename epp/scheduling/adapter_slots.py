"""What a pod's GPU adapter slots cost a LoRA request: the placement rules over the slots
`AdapterResidency.slots` (epp/datalayer/adapter_residency.py) reports. Pure.

`slot_cost` prices each pod for a request (read by `predicted-ttft`); `slot_runs` is the
`adapter_slots` filter's test; `slot_scarcity` scales the price of a free slot by how many
adapters may still need one.
"""

from __future__ import annotations

from collections.abc import Sequence

from epp.datalayer.adapter_residency import Slot
from epp.datalayer.endpoint_records import EndpointState


def slot_runs(adapter: str, slots: list[Slot], max_lora: int) -> bool:
    """The adapter holds one of the pod's `max_lora` slots, or a slot is free for it (else its
    requests there wait until a holder's requests all end)."""
    pos = next((i for i, s in enumerate(slots) if s.adapter == adapter), len(slots))
    return pos < max_lora


def slot_scarcity(candidates: Sequence[EndpointState], slots: Sequence[list[Slot] | None]) -> float:
    """How scarce the candidates' free adapter slots are for the adapters that hold none:
    1 - free slots / those adapters, within [0, 1] (1 with no free slot; 0 when every adapter
    they serve holds a slot, or the free ones outnumber those without). Unknown adapters (a pod
    that loads any): 1, the full price.

    A slot is worth its price only to an adapter that may need one; with 16 pods x 4 slots for
    24 adapters (lora at 4x its pods) about half the slots stay free, and the full price
    kept each adapter on one pod where spreading it cost nothing: TTFT P95 +6 ms against
    the per-request terms (tuning seeds 100-102, 60 s), none with this factor."""
    known: set[str] = set()
    holding: set[str] = set()
    free = 0
    for c, pod_slots in zip(candidates, slots, strict=True):
        m = c.metrics
        if pod_slots is None or m is None:
            continue
        if not c.endpoint.adapters:
            return 1.0
        known |= c.endpoint.adapters
        holders = pod_slots[: m.max_lora]
        holding.update(s.adapter for s in holders)
        free += m.max_lora - len(holders)
    need = len(known - holding)
    if free <= 0:
        return 1.0
    if need <= free:
        return 0.0
    return 1.0 - free / need


def slot_cost(
    adapter: str,
    slots: list[Slot],
    max_lora: int,
    *,
    now: float,
    tpot_s: float,
    output_tokens: int,
    load_s: float,
    slot_s: float,
    peak: int = 0,
    resident: bool = False,
) -> float:
    """Seconds a request of `adapter` adds on a pod whose GPU slots are `slots`
    (`AdapterResidency.slots`, `max_lora` > 0), beyond its queue and prefill:

    - the adapter holds a slot there: 0 on its main pod (the most of this EPP's requests of it
      in flight: `peak`) or where only another client's requests hold it, slot_s x (1 - its
      requests there / peak) on another, so an adapter that spilled goes back to one pod as
      its demand falls and the other's slot drains;
    - a slot is free: `load_s` (its load) plus slot_s, the price of taking a slot that other
      adapters may need: an adapter spills to another pod only when its queue on its own pods
      outweighs that; 0 when it is `resident` there (idle in a slot it held last);
    - every slot is held by another adapter (or the adapter already waits there): `load_s`,
      slot_s, and the wait until a holder drains: the soonest-ending holder's newest request
      (its projected end, at least half its decode while still in flight; another client's
      adapter: this request's decode), the next one for each adapter waiting ahead of it.

    vLLM runs at most `max_lora` adapters per batch: a request whose adapter has no slot waits
    while the holders' requests run, and every request of a holder sent there meanwhile keeps
    that slot held."""
    decode = tpot_s * output_tokens
    if decode < tpot_s:
        decode = tpot_s
    pos = next((i for i, s in enumerate(slots) if s.adapter == adapter), None)
    if pos is not None and pos < max_lora:
        own = slots[pos]
        if own.last_routed is None or peak <= own.requests:
            return 0.0  # its main pod, or held by another client's requests anyway
        return slot_s * (1.0 - own.requests / peak)
    ahead = (pos if pos is not None else len(slots)) - max_lora
    if ahead < 0:
        return load_s if resident else load_s + slot_s
    drains = sorted(_drain(s, now, tpot_s, decode) for s in slots[:max_lora])
    return load_s + slot_s + drains[min(ahead, len(drains) - 1)] * (1 + ahead // max_lora)


def _drain(slot: Slot, now: float, tpot_s: float, decode: float) -> float:
    """Seconds until a slot holder's requests have all ended if it gets no more (see
    `slot_cost`)."""
    if slot.last_routed is None:
        return decode
    own = slot.last_output_tokens * tpot_s
    return max(tpot_s, slot.last_routed + own - now, own / 2.0)
