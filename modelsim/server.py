"""One simulated model-server pod: an aiohttp app in front of an ``Engine``, with fault knobs.

The pod owns its listening socket (not an aiohttp site) so it can refuse connections, or crash:
close the listener and abort every open connection mid-stream, as a killed process would. The
pod holds the engines (one per data-parallel rank), their lifecycle and the fault state; the
HTTP handlers live beside their formats (modelsim/openai_handlers.py,
modelsim/anthropic_handlers.py, modelsim/admin_handlers.py) and the P/D KV transfer in
modelsim/pd_transfer.py.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections import Counter, deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from modelsim.admin_handlers import AdminHandlers
from modelsim.anthropic_handlers import AnthropicHandlers
from modelsim.clock import SimClock
from modelsim.engine import Engine
from modelsim.extra_api import ResponseStore
from modelsim.kv_events import KVEventPublisher, KVEventsConfig
from modelsim.metrics import DIALECTS, make_registry
from modelsim.openai_api import GenerationRequest, check_context, error_body, parse_generation
from modelsim.openai_handlers import OpenAIHandlers
from modelsim.pd import ROLES, parse_transfer_params
from modelsim.pd_transfer import KVTransfer
from modelsim.profiles import GpuProfile
from modelsim.replies import POD_HEADER, json_reply
from modelsim.sequence import Seq
from modelsim.tokenizer import ApproxTokenizer, HFTokenizer, PromptTokenizer

log = logging.getLogger("modelsim")
__all__ = ["POD_HEADER", "Faults", "Pod", "PodConfig"]
# vLLM pins a request to one data-parallel rank with this header (case-insensitive).
DP_RANK_HEADER = "X-data-parallel-rank"


@dataclass
class Faults:
    """Runtime fault knobs; ``stall_s`` is in simulated seconds (wall = stall_s / time_scale)."""

    error_rate: float = 0.0
    error_status: int = 500  # the status of the requests `error_rate` fails (503: overloaded)
    stall_s: float = 0.0
    refuse: bool = False
    crashed: bool = False
    metrics_garbage: bool = False  # /metrics answers 200 with text that is not Prometheus
    metrics_delay_s: float = 0.0  # /metrics answers late (wall seconds): scrape timeouts

    def as_dict(self) -> dict[str, Any]:
        return {
            "error_rate": self.error_rate,
            "error_status": self.error_status,
            "stall_s": self.stall_s,
            "refuse": self.refuse,
            "crash": self.crashed,
            "metrics_garbage": self.metrics_garbage,
            "metrics_delay_s": self.metrics_delay_s,
        }


@dataclass
class PodConfig:
    name: str
    model: str
    profile: GpuProfile
    adapters: tuple[str, ...] = ()
    dialect: str = "vllm"
    seed: int = 0
    enable_prefix_caching: bool = True
    kv_events: KVEventsConfig | None = None  # vLLM's --kv-events-config; None = off
    # The model's own tokenizer files (prompt ids, so KV block hashes); None = approximate.
    tokenizer: HFTokenizer | None = None
    role: str = "both"  # disaggregated serving: prefill, decode, or both (aggregated)
    # vLLM's --data-parallel-size: this many engines (ranks) behind the one API server.
    data_parallel_size: int = 1
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.data_parallel_size < 1:
            raise ValueError(f"pod {self.name!r}: data_parallel_size must be >= 1")
        if self.role not in ROLES:
            raise ValueError(f"pod {self.name!r}: unknown role {self.role!r}; known: {', '.join(ROLES)}")
        if self.dialect not in DIALECTS:
            raise ValueError(
                f"pod {self.name!r}: unknown dialect {self.dialect!r}; known: {', '.join(DIALECTS)}"
            )
        if self.model in self.adapters:
            raise ValueError(f"pod {self.name!r}: adapter name equals the base model name")
        if self.tokenizer is not None and self.profile.vocab_size != self.tokenizer.vocab_size:
            # generated ids stay inside the tokenizer's vocabulary
            self.profile = self.profile.with_overrides(vocab_size=self.tokenizer.vocab_size)


class Pod:
    """A pod's engine, HTTP app, listener and fault state. ``start()`` then ``stop()``."""

    def __init__(self, config: PodConfig, clock: SimClock) -> None:
        self.config = config
        self.clock = clock
        self.faults = Faults()
        # W3C traceparent of the latest generation requests, in /sim/state: shows a test that
        # the gateway propagated the trace to the model server.
        self.recent_traceparents: deque[str] = deque(maxlen=32)
        self.responses = ResponseStore()  # /v1/responses store: this pod's responses only
        self.host = "127.0.0.1"
        self.port = 0
        self._rng = random.Random(config.seed)
        self.tokenizer: PromptTokenizer = config.tokenizer or ApproxTokenizer(config.profile.vocab_size)
        # One KV-event publisher per rank, rank r on the configured ports + r (as vLLM does).
        kv = config.kv_events
        self.kv_publishers = (
            [KVEventPublisher(kv.offset(r), data_parallel_rank=r) for r in range(config.data_parallel_size)]
            if kv
            else []
        )
        self.ranks: list[Engine] = []  # every data-parallel rank's engine; `engine` is rank 0
        self.engine = self._new_engine()
        self._runner: web.AppRunner | None = None
        self._listener: asyncio.Server | None = None
        # The pods of this process (set by run_fleet): POST /sim/probe-fleet answers for all of
        # them in one call (the benchmarks' oracle).
        self.fleet: list[Pod] = [self]
        # Every request the HTTP app routed, refused ones (404, 405) included, by (method, path):
        # `modelsim_http_requests_total` on /metrics, so a test sees whether anything reached the pod.
        self.http_requests: Counter[tuple[str, str]] = Counter()
        self.kv_transfer = KVTransfer(self)

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def address(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    @property
    def kv_publisher(self) -> KVEventPublisher | None:
        """Rank 0's KV-event publisher (None: events off)."""
        return self.kv_publishers[0] if self.kv_publishers else None

    def _new_engine(self) -> Engine:
        """Fresh engines for every rank (`ranks`); returns rank 0's."""
        c = self.config
        self.ranks = []
        for rank in range(c.data_parallel_size):
            engine = Engine(
                c.profile,
                self.clock,
                model=c.model,
                seed=c.seed + 7919 * rank,
                enable_prefix_caching=c.enable_prefix_caching,
            )
            engine.kv_connector = c.role != "both"
            if self.kv_publishers:
                engine.enable_kv_events(self.kv_publishers[rank].publish)
            self.ranks.append(engine)
        self.registry = make_registry(self.ranks, c.model, c.dialect)
        return self.ranks[0]

    def engine_for(self, headers: Any) -> Engine:
        """The rank a request runs on: the one `X-data-parallel-rank` pins, else the least
        loaded (vLLM's internal balancing: 4 x waiting + running); ValueError for a bad rank."""
        raw = headers.get(DP_RANK_HEADER) if headers is not None else None
        size = len(self.ranks)
        if raw is not None:
            try:
                rank = int(raw)
            except ValueError:
                raise ValueError(f"{DP_RANK_HEADER} {raw!r} is not an integer") from None
            if not 0 <= rank < size:
                raise ValueError(f"data_parallel_rank {rank} is out of range [0, {size})")
            return self.ranks[rank]
        if size == 1:
            return self.engine
        return min(self.ranks, key=lambda e: 4 * len(e.waiting) + len(e.running))

    # ---- lifecycle -------------------------------------------------------------------------
    async def start(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self.host = host
        app = web.Application(client_max_size=256 * 1024**2, middlewares=[self._count])
        handlers = (OpenAIHandlers(self), AnthropicHandlers(self), AdminHandlers(self), self.kv_transfer)
        app.add_routes([route for h in handlers for route in h.routes()])
        self._runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=1.0, access_log=None)
        await self._runner.setup()
        for pub in self.kv_publishers:
            await pub.start()
        for engine in self.ranks:
            engine.start()
        await self._listen(port)

    async def _listen(self, port: int) -> None:
        assert self._runner is not None and self._runner.server is not None
        loop = asyncio.get_running_loop()
        self._listener = await loop.create_server(self._runner.server, self.host, port, reuse_address=True)
        self.port = self._listener.sockets[0].getsockname()[1]

    def _close_listener(self) -> None:
        if self._listener is not None:
            self._listener.close()
            self._listener = None

    async def stop(self) -> None:
        self._close_listener()
        for engine in self.ranks:
            await engine.stop()
        for pub in self.kv_publishers:
            pub.close()
        await self.kv_transfer.close()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    @property
    def listening(self) -> bool:
        return self._listener is not None

    # ---- faults ----------------------------------------------------------------------------
    async def set_fault(
        self,
        error_rate: float | None = None,
        stall_s: float | None = None,
        refuse: bool | None = None,
        crash: bool | None = None,
        metrics_garbage: bool | None = None,
        metrics_delay_s: float | None = None,
        error_status: int | None = None,
    ) -> Faults:
        if error_status is not None:
            if not 500 <= error_status <= 599:
                raise ValueError("error_status must be a 5xx status")
            self.faults.error_status = error_status
        if metrics_garbage is not None:
            self.faults.metrics_garbage = metrics_garbage
        if metrics_delay_s is not None:
            if metrics_delay_s < 0:
                raise ValueError("metrics_delay_s must be >= 0")
            self.faults.metrics_delay_s = metrics_delay_s
        if error_rate is not None:
            if not 0.0 <= error_rate <= 1.0:
                raise ValueError("error_rate must be within [0, 1]")
            self.faults.error_rate = error_rate
        if stall_s is not None:
            if stall_s < 0:
                raise ValueError("stall_s must be >= 0")
            self.faults.stall_s = stall_s
        if crash:
            await self.crash()
        elif crash is False and self.faults.crashed:
            await self.restart()
        if refuse is not None and not self.faults.crashed:
            self.faults.refuse = refuse
            if refuse:
                self._close_listener()
            elif self._listener is None:
                await self._listen(self.port)
        return self.faults

    async def crash(self) -> None:
        """Stop listening and abort every connection mid-flight; the engine's state is lost."""
        self.crash_now()
        for engine in self.ranks:
            await engine.stop()

    def crash_now(self) -> None:
        """The synchronous part of ``crash``: after it returns no byte more leaves this pod."""
        self.faults.crashed = True
        self._close_listener()
        if self._runner is not None and self._runner.server is not None:
            for handler in self._runner.server.connections:
                if handler.transport is not None:
                    handler.transport.abort()
        for engine in self.ranks:
            engine.halt()
        for pub in self.kv_publishers:
            pub.close()

    async def restart(self) -> None:
        """Come back after a crash on the same port with an empty engine (a restarted pod)."""
        if not self.faults.crashed:
            return
        for engine in self.ranks:
            await engine.stop()
        self.engine = self._new_engine()
        for pub in self.kv_publishers:
            pub.close()
            await pub.start()  # a new process: same ports, seq from 0, empty buffer
        for engine in self.ranks:
            engine.start()
        self.faults = Faults(
            error_rate=self.faults.error_rate,
            error_status=self.faults.error_status,
            stall_s=self.faults.stall_s,
        )
        await self._listen(self.port)

    # ---- what the HTTP handlers share ------------------------------------------------------
    async def apply_faults(
        self, shape: Callable[[int, str], dict[str, Any]] = error_body
    ) -> web.Response | None:
        """A stall, or an injected error (`error_status`, 500 by default) in the error shape of the
        path's API (`shape`)."""
        if self.faults.stall_s > 0:
            await self.clock.sleep(self.faults.stall_s)
        if self.faults.error_rate > 0 and self._rng.random() < self.faults.error_rate:
            status = self.faults.error_status
            return json_reply(
                status, shape(status, f"simulated server error {status} (fault injection)"), self.name
            )
        return None

    def note_trace(self, request: web.Request) -> None:
        """Keep a generation request's W3C traceparent for /sim/state."""
        if "traceparent" in request.headers:
            self.recent_traceparents.append(request.headers["traceparent"])

    @web.middleware
    async def _count(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        self.http_requests[request.method, request.path] += 1
        return await handler(request)

    def probe(
        self, prompt_ids: list[int], adapter: str | None, hashes: list[int] | None = None
    ) -> dict[str, Any]:
        """Exact engine state plus a TTFT prediction for this request (simulated seconds);
        `hashes`: the prompt's `Engine.prefix_hashes`, when the caller has them."""
        e = self.engine
        cached = e.cached_prefix_tokens(prompt_ids, adapter, hashes)
        return {
            "pod": self.name,
            "waiting": len(e.waiting),
            "running": len(e.running),
            "kv_usage": e.kv_usage(),
            "free_blocks": e.kv.num_free,
            "cached_prefix_tokens": cached,
            "prompt_tokens": len(prompt_ids),
            "adapter_resident": None if adapter is None else e.lora.resident(adapter),
            "predicted_ttft_s": e.predict_ttft(prompt_ids, adapter, cached),
            "sim_time_s": self.clock.now(),
        }

    def admit(
        self, body: Any, kind: str, kv_from_remote: bool = False, engine: Engine | None = None
    ) -> tuple[GenerationRequest, Seq]:
        """Validate a generation body and queue it on the engine, as the HTTP handlers do (the
        virtual-time benchmark, bench/vtime/, submits through here too); raises ApiError, or
        ValueError for what the engine refuses. ``kv_from_remote``: its KV was read from a
        prefill pod (modelsim/pd.py); ``engine``: the rank (default rank 0)."""
        c = self.config
        engine = engine or self.engine
        req = parse_generation(body, kind, c.model, c.adapters, self.tokenizer)
        params = parse_transfer_params(body)
        hold = params is not None and params.do_remote_decode
        check_context(len(req.prompt_ids), req.max_tokens, engine.max_model_len)
        max_tokens = req.max_tokens
        if max_tokens is None:
            max_tokens = engine.default_max_tokens(req.prompt_ids, req.seed)
        seq = engine.submit(req.prompt_ids, max_tokens, req.adapter, kv_from_remote, hold)
        return req, seq
