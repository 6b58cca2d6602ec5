"""What the simulated engine (modelsim/engine.py) schedules: a request inside it (`Seq`), the
tokens it emits (`TokenEvent`) and one step's plan (`StepPlan`)."""

from __future__ import annotations

import asyncio
import itertools
from dataclasses import dataclass, field
from typing import Literal

Status = Literal["waiting", "running", "finished", "aborted"]
_ids = itertools.count()


@dataclass(slots=True)
class TokenEvent:
    """One sampled token (``text``) or the end of the request (``finish_reason`` set)."""

    text: str = ""
    finish_reason: str | None = None
    error: str | None = None


@dataclass(eq=False)
class Seq:
    """A request inside the engine."""

    prompt_ids: list[int]
    max_tokens: int
    adapter: str | None
    arrival: float
    request_id: int = field(default_factory=lambda: next(_ids))
    token_ids: list[int] = field(default_factory=list)
    num_computed: int = 0
    blocks: list[int] = field(default_factory=list)
    hashes: list[int] = field(default_factory=list)
    num_registered: int = 0
    status: Status = "waiting"
    first_scheduled: float | None = None
    first_token: float | None = None
    last_token: float | None = None
    finished_at: float | None = None
    num_output: int = 0
    cached_tokens: int = 0
    preemptions: int = 0
    # Disaggregated P/D (vLLM's NIXL connector): the prompt's KV came from a prefill pod (all
    # but the last token, which the decode engine recomputes), or this prefill-only request
    # keeps its blocks after finishing until a decode pod has read them.
    kv_from_remote: bool = False
    hold_kv: bool = False
    events: asyncio.Queue[TokenEvent] = field(default_factory=asyncio.Queue)

    def __post_init__(self) -> None:
        self.token_ids = list(self.prompt_ids)

    @property
    def num_prompt(self) -> int:
        return len(self.prompt_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)


@dataclass(frozen=True, slots=True)
class StepPlan:
    scheduled: list[tuple[Seq, int]]
    prefill_tokens: int
    decode_tokens: int
    decode_context: int
    adapters: frozenset[str]
