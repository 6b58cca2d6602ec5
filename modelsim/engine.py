"""The simulated inference engine: a step loop modelled on vLLM V1's scheduler.

Each step: running requests first (decode tokens, or the next chunk of an unfinished prefill),
then waiting requests FCFS while the token budget (``max_num_batched_tokens``), the sequence
limit (``max_num_seqs``), LoRA slots and free KV blocks allow. A request that cannot get a KV
block preempts the most recently admitted running request (recompute: blocks freed, re-queued
at the front). The step lasts ``profile.step_ms(...)`` simulated milliseconds (plus adapter load
time); tokens are emitted at the end of the step, exactly when vLLM would stream them.

Every request is uniform, as in V1: ``num_computed_tokens`` chases ``num_tokens`` (prompt plus
output so far); when it catches up, a token is sampled.

This module owns time: the step loop, each step's start (lag-bounded) and duration, and the
requests' entry and exit; what a step runs and what it produced is modelsim/scheduler.py's.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Callable, Sequence
from typing import Any

import xxhash

from modelsim.clock import SimClock
from modelsim.kvcache import KVCache
from modelsim.lora import LoraSlots
from modelsim.profiles import GpuProfile
from modelsim.scheduler import Scheduler
from modelsim.sequence import Seq, StepPlan
from modelsim.stats import EngineStats


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
        self.stats = EngineStats(max_model_len=self.max_model_len)
        # The batch planning and per-request bookkeeping; its queues are the engine's.
        self.scheduler = Scheduler(profile, self.kv, self.stats, clock)
        self.waiting = self.scheduler.waiting
        self.running = self.scheduler.running
        self.held = self.scheduler.held  # finished prefill-only requests holding KV for transfer
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
            self.scheduler.finish(seq, "abort", status="aborted", error="engine stopped")
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
        self.scheduler.finish(seq, "abort", status="aborted")

    def release_held(self, request_id: int) -> Seq | None:
        """Free a prefill-only request's held KV (read by the decode pod, or expired)."""
        seq = self.held.pop(request_id, None)
        if seq is not None:
            self.kv.release(seq.blocks)
            seq.blocks = []
            self._wake.set()
        return seq

    # ---- prefix cache ----------------------------------------------------------------------
    def prefix_hashes(self, prompt_ids: list[int], adapter: str | None) -> list[int]:
        """The block hashes a new request's prefix-cache lookup uses (never its last token):
        the same on every engine with this block size, so a fleet-wide probe hashes once."""
        probe = Seq(prompt_ids=prompt_ids, max_tokens=1, adapter=adapter, arrival=0.0)
        return self.scheduler.block_hashes(probe, len(prompt_ids) - 1)

    def cached_prefix_tokens(
        self, prompt_ids: list[int], adapter: str | None, hashes: list[int] | None = None
    ) -> int:
        """Tokens of this prompt that a new request would find in the prefix cache right now
        (`hashes`: its `prefix_hashes`, when already computed)."""
        if hashes is None:
            hashes = self.prefix_hashes(prompt_ids, adapter)
        return len(self.kv.lookup(hashes)) * self.block_size

    # ---- the step loop ---------------------------------------------------------------------
    async def _loop(self) -> None:
        while True:
            if not self.waiting and not self.running:
                self._wake.clear()
                await self._wake.wait()
            plan = self.scheduler.schedule()
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
        plan = self.scheduler.schedule()
        return plan, (self._start_step(plan, start) if plan.scheduled else start)

    def complete_step(self, plan: StepPlan, end: float) -> None:
        """Apply a step at simulated time ``end``: computed and emitted tokens, KV events."""
        self.scheduler.update_from_output(plan, end)
        self._flush_kv_events()

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
