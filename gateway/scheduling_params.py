"""Typed parameters of the scheduling plugins, and the thresholds set that carries them.

Each filter or scorer that takes a parameter declares it here as a small pydantic model, and
the registry (epp/scheduling/registry.py) names that model beside the plugin. A profile's
`thresholds` is the union of them, so one config block (`thresholds: {queue, kvCache,
staleAfterMs, prefixMinBlocks, prefillTokensPerS, adapterLoadMs, paceContrast, adapterPlacement,
adapterSlotMs}`, pool-wide or per profile) sets every plugin's knobs, with
one spelling per field (the camelCase name above) and a bound on every value.
Defaults are GIE's published ones; `staleAfterMs`, `prefixMinBlocks` and the prediction
ones are ours.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class _Params(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class FreshParams(_Params):
    """The `fresh` filter: metrics older than this are distrusted."""

    stale_after_ms: int = Field(default=1000, gt=0, le=3_600_000, alias="staleAfterMs")

    @property
    def stale_after(self) -> float:
        """`staleAfterMs` in seconds (the unit of `EndpointState.metrics_age`)."""
        return self.stale_after_ms / 1000.0


class SaturationParams(_Params):
    """The `unsaturated` filter: a pod is saturated at this queue or this KV-cache use."""

    queue_saturated: float = Field(default=5.0, gt=0, le=1e6, alias="queue")
    # Up to 1 with `page`; with `committed` up to 4 (an overcommit: a running request holds on
    # average about half its expected output, so 1.0 held the pods at about half their KV).
    kv_saturated: float = Field(default=0.8, gt=0, le=4, alias="kvCache")
    # What `kvCache` is compared with. `page`: the scraped KV use plus what this EPP routed since
    # the page. `committed`: at least every in-flight request's prompt + expected output over the
    # pod's KV capacity (the ledger's and the other replicas' requests), so a pod whose running
    # sequences will grow into a full cache reads saturated before vLLM has to preempt them;
    # what flow control should gate on (docs/scheduling.md, "Flow control").
    kv_measure: Literal["page", "committed"] = Field(default="page", alias="kvMeasure")

    @model_validator(mode="after")
    def _overcommit_needs_committed(self) -> SaturationParams:
        if self.kv_saturated > 1 and self.kv_measure != "committed":
            raise ValueError(
                "kvCache above 1 needs kvMeasure: committed in the same block (the page's KV use never exceeds 1)"
            )
        return self


class PrefixParams(_Params):
    """The `prefix-cache` scorer: matched / max(total, this) blocks, so tiny prompts score tiny."""

    prefix_min_blocks: int = Field(default=16, ge=1, le=1_000_000, alias="prefixMinBlocks")


class PredictionParams(_Params):
    """The `predicted-ttft` scorer: the prefill pace assumed while no candidate's own pace is
    learned yet, the time a LoRA adapter takes to load on a pod that does not hold it, and how
    far to trust the pods' learned pace differences."""

    prefill_tokens_per_s: float = Field(default=10_000.0, gt=0, le=1e9, alias="prefillTokensPerS")
    adapter_load_ms: float = Field(default=200.0, ge=0, le=3_600_000, alias="adapterLoadMs")
    # How much of the pods' learned pace differences to trust: pace_i is taken as
    # median x (pace_i / median) ** this. The learned pace follows the pod's prompt mix (a pod
    # that happened to get long prompts reads faster per token on the same GPU); below 1 damps
    # that noise on a fleet of identical GPUs, and also real GPU differences on a mixed one
    # (family-skewed-fleet at 0.5: the H100's share fell from 55-59 % to 44 %), hence 1.
    pace_contrast: float = Field(default=1.0, ge=0, le=1, alias="paceContrast")
    # Adapter placement (LoRA requests on pods that report their slots): price a pod's GPU
    # slots as they are held by the adapters in flight there (epp/datalayer/adapter_residency.py
    # `slot_cost`), so each adapter stays on the few pods that run it and spills when their
    # queue outweighs `adapterSlotMs`; false: the earlier per-request load and slot-wait terms.
    adapter_placement: bool = Field(default=True, alias="adapterPlacement", strict=True)
    adapter_slot_ms: float = Field(default=500.0, ge=0, le=3_600_000, alias="adapterSlotMs")
    # The KV-memory model (epp/datalayer/session_memory.py): a second of prefill that a placement
    # makes live conversations redo (it evicts their history) counts as this many seconds of
    # the request's own TTFT; 0 prices no eviction.
    eviction_weight: float = Field(default=1.0, ge=0, le=100, alias="evictionWeight")

    @property
    def adapter_load_s(self) -> float:
        return self.adapter_load_ms / 1000.0

    @property
    def adapter_slot_s(self) -> float:
        return self.adapter_slot_ms / 1000.0


class PickParams(_Params):
    """The pickers: totals within `tieBand` x the best are near-equal, and among them the pod
    this EPP's own exact record says is least busy goes first (epp/scheduling/picker.py)."""

    # 0.02, 0.05 and 0.1 did alike on the tuning seeds of nine scenario families (virtual time,
    # TTFT P95 -5 to -6 % against no band, geometric mean); 0 turns the exact-load order off.
    tie_band: float = Field(default=0.05, ge=0, le=1, alias="tieBand")


class Thresholds(PredictionParams, FreshParams, SaturationParams, PrefixParams, PickParams):
    """Every plugin's parameters in one block (pool-wide defaults, overridden per profile)."""

    def overlaid(self, own: Thresholds) -> Thresholds:
        """These values with the fields `own` was given explicitly taking precedence."""
        if not own.model_fields_set:
            return self
        return self.model_copy(update={name: getattr(own, name) for name in own.model_fields_set})


DEFAULT_THRESHOLDS = Thresholds()
