"""What one engine step runs, and what it did: the batch planning and the per-request
bookkeeping of the simulated engine (modelsim/engine.py), as vLLM V1's ``Scheduler`` splits
``schedule`` from ``update_from_output``. The engine owns time (the step loop, each step's
duration); the scheduler owns the queues and each request's KV blocks."""

from __future__ import annotations

import math
from collections import deque

from modelsim.clock import SimClock
from modelsim.kv_events import block_stored
from modelsim.kvcache import KVCache, block_hash
from modelsim.profiles import GpuProfile
from modelsim.sequence import Seq, Status, StepPlan, TokenEvent
from modelsim.stats import EngineStats
from modelsim.tokenizer import filler_piece, piece_id


class Scheduler:
    """One engine's waiting and running queues, its finished prefills holding KV for a transfer
    (``held``), and the steps planned over them."""

    def __init__(self, profile: GpuProfile, kv: KVCache, stats: EngineStats, clock: SimClock) -> None:
        self.profile = profile
        self.kv = kv
        self.stats = stats
        self.clock = clock
        self.block_size = profile.block_size
        self.waiting: deque[Seq] = deque()
        self.running: list[Seq] = []
        self.held: dict[int, Seq] = {}  # finished prefill-only requests holding KV for transfer

    # ---- prefix cache ----------------------------------------------------------------------
    def _extra(self, seq: Seq) -> str:
        return seq.adapter or ""

    def block_hashes(self, seq: Seq, upto_tokens: int) -> list[int]:
        """Extend the request's chained block hashes to cover ``upto_tokens`` tokens."""
        bs = self.block_size
        full = min(upto_tokens, seq.num_tokens) // bs
        extra = self._extra(seq)
        while len(seq.hashes) < full:
            i = len(seq.hashes)
            parent = seq.hashes[-1] if seq.hashes else 0
            seq.hashes.append(block_hash(parent, seq.token_ids[i * bs : (i + 1) * bs], extra))
        return seq.hashes

    # ---- planning --------------------------------------------------------------------------
    def _grow(self, seq: Seq, total_tokens: int) -> bool:
        need = math.ceil(total_tokens / self.block_size) - len(seq.blocks)
        if need <= 0:
            return True
        got = self.kv.allocate(need)
        if got is None:
            return False
        seq.blocks.extend(got)
        return True

    def _preempt(self, seq: Seq) -> None:
        self.kv.release(seq.blocks)
        seq.blocks = []
        seq.num_computed = 0
        seq.num_registered = 0
        seq.status = "waiting"
        seq.preemptions += 1
        self.waiting.appendleft(seq)
        self.stats.num_preemptions += 1

    def schedule(self) -> StepPlan:
        """The next step's batch: running requests first, then waiting ones FCFS (see the
        engine's module docstring); preempts when KV blocks run out."""
        p = self.profile
        budget = p.max_num_batched_tokens
        scheduled: list[tuple[Seq, int]] = []
        preempted = False
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            n = min(seq.num_tokens - seq.num_computed, budget)
            while not self._grow(seq, seq.num_computed + n):
                victim = self.running.pop()
                self._preempt(victim)
                preempted = True
                if victim is seq:
                    break
            if seq.status != "running":
                break
            scheduled.append((seq, n))
            budget -= n
            i += 1

        if not preempted:
            loras = {s.adapter for s in self.running if s.adapter}
            skipped: list[Seq] = []
            while self.waiting and budget > 0 and len(self.running) < p.max_num_seqs:
                seq = self.waiting[0]
                if seq.adapter and seq.adapter not in loras and len(loras) >= p.max_loras:
                    skipped.append(self.waiting.popleft())
                    continue
                hit_blocks: list[int] = []
                if not seq.blocks:
                    # Always recompute at least the last token, so cap the hit below num_tokens.
                    hit_blocks = self.kv.lookup(self.block_hashes(seq, seq.num_tokens - 1))
                    self.kv.touch(hit_blocks)
                    seq.blocks = list(hit_blocks)
                    seq.num_registered, seq.num_computed = len(hit_blocks), len(hit_blocks) * self.block_size
                hits = seq.num_computed
                if seq.kv_from_remote and seq.first_scheduled is None:
                    # The transferred KV lands in newly allocated blocks; the last prompt token
                    # is recomputed here for its logits, as vLLM's decode side does.
                    if not self._grow(seq, seq.num_tokens - 1):
                        self.kv.release(seq.blocks)
                        seq.blocks, seq.num_computed, seq.num_registered = [], 0, 0
                        break
                    seq.num_computed = max(seq.num_computed, seq.num_tokens - 1)
                n = min(seq.num_tokens - seq.num_computed, budget)
                if not self._grow(seq, seq.num_computed + n):
                    self.kv.release(seq.blocks)
                    seq.blocks, seq.num_computed, seq.num_registered = [], 0, 0
                    break
                self.waiting.popleft()
                self.stats.prefix_cache_queries += seq.num_tokens
                self.stats.prefix_cache_hits += hits
                if seq.first_scheduled is None:
                    seq.cached_tokens = hits
                    if seq.kv_from_remote:
                        self.stats.external_prefix_cache_queries += seq.num_tokens - hits
                        self.stats.external_prefix_cache_hits += seq.num_computed - hits
                seq.status = "running"
                self.running.append(seq)
                if seq.adapter:
                    loras.add(seq.adapter)
                scheduled.append((seq, n))
                budget -= n
            self.waiting.extendleft(reversed(skipped))

        prefill = decode = context = 0
        for seq, n in scheduled:
            if n == 1 and seq.num_output > 0 and seq.num_computed == seq.num_tokens - 1:
                decode += 1
                context += seq.num_computed
            else:
                prefill += n
        adapters = frozenset(s.adapter for s, _ in scheduled if s.adapter)
        return StepPlan(scheduled, prefill, decode, context, adapters)

    # ---- a step's results ------------------------------------------------------------------
    def update_from_output(self, plan: StepPlan, now: float) -> None:
        """Apply a finished step at simulated ``now``: computed tokens, newly full blocks
        cached (``BlockStored`` events), tokens emitted, requests finished."""
        self.stats.steps += 1
        bs = self.block_size
        for seq, n in plan.scheduled:
            if seq.status != "running":
                continue  # aborted or preempted while the step ran
            seq.num_computed += n
            full = seq.num_computed // bs
            if full > seq.num_registered:
                hashes = self.block_hashes(seq, seq.num_computed)
                run = seq.num_registered  # first block of the current run of newly cached ones
                for j in range(seq.num_registered, full):
                    if not self.kv.register(seq.blocks[j], hashes[j]):
                        self._stored(seq, run, j)
                        run = j + 1
                self._stored(seq, run, full)
                seq.num_registered = full
            if seq.num_computed < seq.num_tokens:
                continue  # prefill chunk, no token yet
            self._emit(seq, now)

    def _stored(self, seq: Seq, first: int, end: int) -> None:
        """One ``BlockStored`` for blocks ``first..end-1`` of ``seq`` (KV events on only)."""
        if self.kv.events is None or end <= first:
            return
        bs = self.block_size
        parent = seq.hashes[first - 1] if first > 0 else None
        self.kv.events.append(
            block_stored(seq.hashes[first:end], parent, seq.token_ids[first * bs : end * bs], bs, seq.adapter)
        )

    def _emit(self, seq: Seq, now: float) -> None:
        word = filler_piece(seq.num_output)
        seq.token_ids.append(piece_id(word, self.profile.vocab_size))
        seq.num_output += 1
        self.stats.generation_tokens += 1
        if seq.first_token is None:
            seq.first_token = now
            self.stats.ttft.observe(now - seq.arrival)
            self.stats.prompt_tokens += seq.num_prompt
        elif seq.last_token is not None:
            self.stats.itl.observe(now - seq.last_token)
        seq.last_token = now
        text = word if seq.num_output == 1 else " " + word
        seq.events.put_nowait(TokenEvent(text=text))
        if seq.num_output >= seq.max_tokens:
            self.running.remove(seq)
            self.finish(seq, "length", status="finished")

    def finish(self, seq: Seq, reason: str, status: Status, error: str | None = None) -> None:
        """End a request: free its blocks (or hold them for a P/D transfer), count it, tell the
        handler."""
        if seq.hold_kv and status == "finished":
            self.held[seq.request_id] = seq
        else:
            self.kv.release(seq.blocks)
            seq.blocks = []
        seq.status = status
        seq.finished_at = self.clock.now() if status != "finished" else seq.last_token
        if status == "finished":
            self.stats.request_success[reason] += 1
            self.stats.e2e.observe((seq.finished_at or 0.0) - seq.arrival)
            prefill = None
            if seq.first_token is not None and seq.first_scheduled is not None:
                prefill = seq.first_token - seq.first_scheduled
            self.stats.finished(seq.num_prompt, seq.cached_tokens, prefill)
        seq.events.put_nowait(TokenEvent(finish_reason=reason, error=error))
