"""The simulated inference engine: a step loop modelled on vLLM V1's scheduler.

Each step: running requests first (decode tokens, or the next chunk of an unfinished prefill),
then waiting requests FCFS while the token budget (``max_num_batched_tokens``), the sequence
limit (``max_num_seqs``), LoRA slots and free KV blocks allow. A request that cannot get a KV
block preempts the most recently admitted running request (recompute: blocks freed, re-queued
at the front). The step lasts ``profile.step_ms(...)`` simulated milliseconds (plus adapter load
time); tokens are emitted at the end of the step, exactly when vLLM would stream them.

Every request is uniform, as in V1: ``num_computed_tokens`` chases ``num_tokens`` (prompt plus
output so far); when it catches up, a token is sampled.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import random
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import xxhash

from modelsim.clock import SimClock
from modelsim.kv_events import block_stored
from modelsim.kvcache import KVCache, block_hash
from modelsim.lora import LoraSlots
from modelsim.profiles import GpuProfile
from modelsim.sequence import Seq, Status, StepPlan, TokenEvent
from modelsim.stats import EngineStats
from modelsim.tokenizer import filler_piece, piece_id


class Engine:
    """One simulated model server's engine; ``start()`` runs its step loop on the current loop."""

    def __init__(
        self,
        profile: GpuProfile,
        clock: SimClock,
        model: str = "model",
        seed: int = 0,
        enable_prefix_caching: bool = True,
        max_lag_wall_s: float = 0.02,
    ) -> None:
        self.profile = profile
        self.clock = clock
        self.model = model
        self.seed = seed
        self.block_size = profile.block_size
        # vLLM refuses to start when max_model_len exceeds KV capacity; the simulator caps it.
        self.max_model_len = min(profile.max_model_len, profile.num_gpu_blocks * profile.block_size)
        self.kv = KVCache(profile.num_gpu_blocks, profile.block_size, enable_prefix_caching)
        self.lora = LoraSlots(
            profile.max_loras, profile.max_cpu_loras, profile.lora_load_cpu_ms, profile.lora_load_disk_ms
        )
        self.waiting: deque[Seq] = deque()
        self.running: list[Seq] = []
        self.stats = EngineStats(max_model_len=self.max_model_len)
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._busy_until = 0.0
        self.max_lag_wall_s = max_lag_wall_s
        self.last_step_ms = 0.0
        self.max_lag_seen_s = 0.0
        self.lag_sum_s = 0.0
        self.on_step: Callable[[StepPlan, float, float], None] | None = None
        self._publish_kv: Callable[[list[dict[str, Any]]], None] | None = None
        self.kv_connector = False  # vLLM runs a KV connector (P/D pods): its metrics appear
        self.held: dict[int, Seq] = {}  # finished prefill-only requests holding KV for transfer

    def enable_kv_events(self, publish: Callable[[list[dict[str, Any]]], None]) -> None:
        """Collect vLLM KV-cache events and hand each step's batch to ``publish``."""
        self.kv.events = []
        self._publish_kv = publish

    def _flush_kv_events(self) -> None:
        events = self.kv.events
        if events and self._publish_kv is not None:
            self.kv.events = []
            self._publish_kv(events)

    def reset_prefix_cache(self) -> bool:
        """vLLM's ``reset_prefix_cache``: False (nothing done) while requests hold blocks."""
        done = self.kv.reset_prefix_cache()
        self._flush_kv_events()
        return done

    # ---- lifecycle -------------------------------------------------------------------------
    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._loop(), name=f"engine-{self.model}")

    def halt(self) -> None:
        """Stop stepping now and fail every request in flight (a killed engine)."""
        if self._task is not None:
            self._task.cancel()
        seqs = [*self.waiting, *self.running]
        self.waiting.clear()
        self.running.clear()
        for seq in seqs:
            self._finish(seq, "abort", status="aborted", error="engine stopped")
        for request_id in list(self.held):
            self.release_held(request_id)

    async def stop(self) -> None:
        self.halt()
        if self._task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    # ---- requests --------------------------------------------------------------------------
    def default_max_tokens(self, prompt_ids: Sequence[int], request_seed: int | None) -> int:
        """Seeded output length when a request gives none: lognormal, mean ~200 (ShareGPT-like)."""
        key = xxhash.xxh64_intdigest(
            repr((self.seed, request_seed, len(prompt_ids), prompt_ids[:64])).encode()
        )
        n = int(random.Random(key).lognormvariate(5.0, 0.7))
        return max(1, min(n, 2048))

    def submit(
        self,
        prompt_ids: list[int],
        max_tokens: int,
        adapter: str | None = None,
        kv_from_remote: bool = False,
        hold_kv: bool = False,
    ) -> Seq:
        """Queue a request; the caller validated lengths. ``max_tokens`` is capped by max_model_len.
        ``kv_from_remote``: the prompt's KV was transferred in; ``hold_kv``: keep it for a transfer out."""
        if not prompt_ids:
            raise ValueError("empty prompt")
        if len(prompt_ids) >= self.max_model_len:
            raise ValueError(
                f"prompt is {len(prompt_ids)} tokens; this model's maximum context length is "
                f"{self.max_model_len} tokens"
            )
        if adapter is not None and self.profile.max_loras < 1:
            raise ValueError("this server runs with max_loras=0 and cannot serve adapters")
        max_tokens = max(1, min(max_tokens, self.max_model_len - len(prompt_ids)))
        seq = Seq(prompt_ids=prompt_ids, max_tokens=max_tokens, adapter=adapter, arrival=self.clock.now())
        seq.kv_from_remote, seq.hold_kv = kv_from_remote, hold_kv
        self.waiting.append(seq)
        self._wake.set()
        return seq

    def abort(self, seq: Seq) -> None:
        """Drop a request (client went away); frees its blocks."""
        if seq.status in ("finished", "aborted"):
            return
        if seq.status == "waiting":
            with contextlib.suppress(ValueError):
                self.waiting.remove(seq)
        else:
            with contextlib.suppress(ValueError):
                self.running.remove(seq)
        self._finish(seq, "abort", status="aborted")

    def release_held(self, request_id: int) -> Seq | None:
        """Free a prefill-only request's held KV (read by the decode pod, or expired)."""
        seq = self.held.pop(request_id, None)
        if seq is not None:
            self.kv.release(seq.blocks)
            seq.blocks = []
            self._wake.set()
        return seq

    # ---- prefix cache ----------------------------------------------------------------------
    def _extra(self, seq: Seq) -> str:
        return seq.adapter or ""

    def _hashes(self, seq: Seq, upto_tokens: int) -> list[int]:
        """Extend the request's chained block hashes to cover ``upto_tokens`` tokens."""
        bs = self.block_size
        full = min(upto_tokens, seq.num_tokens) // bs
        extra = self._extra(seq)
        while len(seq.hashes) < full:
            i = len(seq.hashes)
            parent = seq.hashes[-1] if seq.hashes else 0
            seq.hashes.append(block_hash(parent, seq.token_ids[i * bs : (i + 1) * bs], extra))
        return seq.hashes

    def prefix_hashes(self, prompt_ids: list[int], adapter: str | None) -> list[int]:
        """The block hashes a new request's prefix-cache lookup uses (never its last token):
        the same on every engine with this block size, so a fleet-wide probe hashes once."""
        probe = Seq(prompt_ids=prompt_ids, max_tokens=1, adapter=adapter, arrival=0.0)
        return self._hashes(probe, len(prompt_ids) - 1)

    def cached_prefix_tokens(
        self, prompt_ids: list[int], adapter: str | None, hashes: list[int] | None = None
    ) -> int:
        """Tokens of this prompt that a new request would find in the prefix cache right now
        (`hashes`: its `prefix_hashes`, when already computed)."""
        if hashes is None:
            hashes = self.prefix_hashes(prompt_ids, adapter)
        return len(self.kv.lookup(hashes)) * self.block_size

    # ---- scheduling ------------------------------------------------------------------------
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

    def _schedule(self) -> StepPlan:
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
                    hit_blocks = self.kv.lookup(self._hashes(seq, seq.num_tokens - 1))
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

    # ---- the step loop ---------------------------------------------------------------------
    async def _loop(self) -> None:
        while True:
            if not self.waiting and not self.running:
                self._wake.clear()
                await self._wake.wait()
            plan = self._schedule()
            if not plan.scheduled:
                # Nothing fits this instant (should be rare); let time pass by one idle step.
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(
                        self._wake.wait(), self.profile.t0_ms / 1000 / self.clock.time_scale
                    )
                continue
            # Simulated timeline: back-to-back steps stay exact while the process lags by at most
            # max_lag_wall_s; a step never starts before a request in it arrived.
            now_sim = self.clock.now()
            start = max(self._busy_until, now_sim - self.max_lag_wall_s * self.clock.time_scale)
            start = max([start, *(s.arrival for s, _ in plan.scheduled if s.first_scheduled is None)])
            lag = max(0.0, now_sim - start) / self.clock.time_scale
            self.max_lag_seen_s = max(self.max_lag_seen_s, lag)
            self.lag_sum_s += lag
            end = self._start_step(plan, start)
            await self.clock.sleep_until(end)
            self.complete_step(plan, end)
            if self.on_step is not None:
                self.on_step(plan, start, end)

    def _start_step(self, plan: StepPlan, start: float) -> float:
        """Begin a planned step at simulated ``start`` (adapter loads happen now); return its end."""
        for seq, _ in plan.scheduled:
            if seq.first_scheduled is None:
                seq.first_scheduled = start
                self.stats.queue_time.observe(start - seq.arrival)
        pinned = {s.adapter for s in self.running if s.adapter}
        load_ms = self.lora.ensure(sorted(plan.adapters), pinned) if plan.adapters else 0.0
        step_ms = load_ms + self.profile.step_ms(
            plan.prefill_tokens, plan.decode_tokens, plan.decode_context, bool(plan.adapters)
        )
        self.last_step_ms = step_ms
        end = start + step_ms / 1000.0
        self._busy_until = end
        return end

    def plan_step(self, start: float) -> tuple[StepPlan, float]:
        """For offline drivers in virtual time (no step loop, no clock sleeps): schedule the next
        step to start at ``start`` and return it with its end; apply it with ``complete_step``
        at that end. An empty plan (nothing fits) ends at ``start``."""
        plan = self._schedule()
        return plan, (self._start_step(plan, start) if plan.scheduled else start)

    def complete_step(self, plan: StepPlan, end: float) -> None:
        """Apply a step at simulated time ``end``: computed and emitted tokens, KV events."""
        self._complete(plan, end)
        self._flush_kv_events()

    def _complete(self, plan: StepPlan, now: float) -> None:
        self.stats.steps += 1
        bs = self.block_size
        for seq, n in plan.scheduled:
            if seq.status != "running":
                continue  # aborted or preempted while the step ran
            seq.num_computed += n
            full = seq.num_computed // bs
            if full > seq.num_registered:
                hashes = self._hashes(seq, seq.num_computed)
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
            self._finish(seq, "length", status="finished")

    def _finish(self, seq: Seq, reason: str, status: Status, error: str | None = None) -> None:
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

    # ---- observability ---------------------------------------------------------------------
    def running_adapters(self) -> list[str]:
        return sorted({s.adapter for s in self.running if s.adapter})

    def waiting_adapters(self) -> list[str]:
        return sorted({s.adapter for s in self.waiting if s.adapter})

    def kv_usage(self) -> float:
        return self.kv.usage()

    def predict_ttft(
        self, prompt_ids: list[int], adapter: str | None, cached_tokens: int | None = None
    ) -> float:
        """Estimated TTFT (simulated s) for a request arriving now; see docs/modelsim.md.
        `cached_tokens`: its `cached_prefix_tokens`, when already computed."""
        p = self.profile
        if cached_tokens is None:
            cached_tokens = self.cached_prefix_tokens(prompt_ids, adapter)
        own = max(1, len(prompt_ids) - cached_tokens)
        ahead = sum(s.num_tokens - s.num_computed for s in self.waiting)
        ahead += sum(s.num_tokens - s.num_computed for s in self.running if s.num_output == 0)
        decodes = sum(1 for s in self.running if s.num_output > 0)
        context = sum(s.num_computed for s in self.running if s.num_output > 0)
        chunk = max(1, p.max_num_batched_tokens - min(decodes, p.max_num_batched_tokens - 1))
        remaining = ahead + own
        total_ms = max(0.0, (self._busy_until - self.clock.now()) * 1000.0)
        while remaining > 0:
            take = min(chunk, remaining)
            total_ms += p.step_ms(take, decodes, context, adapter is not None)
            remaining -= take
        if adapter is not None:
            total_ms += self.lora.load_cost_ms(adapter)
        return total_ms / 1000.0
