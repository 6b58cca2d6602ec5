"""The KV-memory model's view of one decision (epp/datalayer/session_memory.py): per candidate,
the tokens of this prompt the pod holds at any length, and what a placement there would evict
of the live conversations it holds. Pure reads of the model; the prediction
(epp/scheduling/ttft_prediction.py) adds them to its terms.

A pod that lacks a prefix n conversations share, held by h pods, is charged h / (h + n - 1) of
its prefill: one more pod seeded with a popular system prompt serves every conversation sent
there afterwards. A conversation's own history (held by it alone) is charged in full, so a
session stays where its history is until its queue there outweighs a full recompute.
"""

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
    # The prompt's shared part (tokens) and the share of its prefill a pod that lacks it pays:
    # pods holding it / (pods holding it + the other conversations holding it).
    shared_tokens: float
    seed_share: float

    @classmethod
    def of(
        cls, request: InferenceRequest, candidates: Sequence[EndpointState], ctx: ScoringContext
    ) -> SessionView | None:
        memory, hashes = ctx.memory, ctx.checkpoints
        if memory is None or not hashes:
            return None
        addresses = ctx.addresses if ctx.addresses is not None else [c.address for c in candidates]
        known = ctx.memory_depths
        depths = [known[a] for a in addresses] if known is not None else memory.depths(hashes, addresses)
        per = ctx.checkpoint_tokens
        held = [d * per for d in depths]
        session = request.session_key
        keys = [memory.entry_key(a, hashes, d, session) for a, d in zip(addresses, depths, strict=True)]
        depth, n, pods = memory.shared_prefix(hashes)
        share = pods / (pods + n - 1) if n >= 2 else 1.0
        return cls(memory, addresses, held, keys, ctx.thresholds.eviction_weight, depth * per, share)

    def uncached(self, i: int, prompt: float, own: float) -> float:
        """Candidate i's uncached tokens: `own` (what the prefix lookups say) capped by what it
        holds of the prompt at any length."""
        return min(own, prompt - self.held[i])

    def seeding_credit(self, i: int) -> float:
        """Tokens of a popular shared prefix candidate i lacks, less its share of them: the
        prefill a pick there invests for the conversations sent there later."""
        missing = self.shared_tokens - self.held[i]
        if missing <= 0.0 or self.seed_share >= 1.0:
            return 0.0
        return missing * (1.0 - self.seed_share)

    def eviction_tokens(self, i: int, need: float) -> float:
        """Live conversations' tokens that `need` new tokens on candidate i evict, x the weight."""
        if self.weight <= 0.0:
            return 0.0
        return self.weight * self.memory.eviction_tokens(self.addresses[i], need, self.keys[i])
