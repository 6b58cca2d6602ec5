"""The KV-memory model's view of one decision (epp/datalayer/session_memory.py): per candidate,
the tokens of this prompt the pod holds at any length, and what a placement there would evict
of the live conversations it holds. Pure reads of the model; the prediction
(epp/scheduling/ttft_prediction.py) adds them to its terms."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from epp.datalayer.endpoint_records import EndpointState
from epp.datalayer.session_memory import SessionMemory
from epp.scheduling.request import InferenceRequest
from epp.scheduling.scorers import ScoringContext


@dataclass(frozen=True, slots=True)
class SessionView:
    memory: SessionMemory
    addresses: Sequence[str]
    held: list[float]  # per candidate, tokens of the prompt the pod holds (checkpoint grain)
    keys: list[int | None]  # per candidate, the entry this prompt continues there
    weight: float  # `evictionWeight`

    @classmethod
    def of(
        cls, request: InferenceRequest, candidates: Sequence[EndpointState], ctx: ScoringContext
    ) -> SessionView | None:
        memory, hashes = ctx.memory, ctx.checkpoints
        if memory is None or not hashes:
            return None
        addresses = ctx.addresses if ctx.addresses is not None else [c.address for c in candidates]
        depths = memory.depths(hashes, addresses)
        per = ctx.checkpoint_tokens
        held = [d * per for d in depths]
        keys = [memory.entry_key(a, hashes, d) for a, d in zip(addresses, depths, strict=True)]
        return cls(memory, addresses, held, keys, ctx.thresholds.eviction_weight)

    def eviction_tokens(self, i: int, need: float) -> float:
        """Live conversations' tokens that `need` new tokens on candidate i evict, x the weight."""
        if self.weight <= 0.0:
            return 0.0
        return self.weight * self.memory.eviction_tokens(self.addresses[i], need, self.keys[i])
