"""One simulated model-server pod: an aiohttp app in front of an ``Engine``, with fault knobs.

The pod owns its listening socket (not an aiohttp site) so it can refuse connections, or crash:
close the listener and abort every open connection mid-stream, as a killed process would.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
from collections import Counter, deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web

from modelsim import anthropic_api
from modelsim.clock import SimClock
from modelsim.engine import Engine
from modelsim.extra_api import (
    ResponseStore,
    embedding_response,
    parse_embedding,
    parse_responses,
    responses_response,
)
from modelsim.kv_events import KVEventPublisher, KVEventsConfig
from modelsim.metrics import DIALECTS, make_registry, render
from modelsim.openai_api import (
    ApiError,
    GenerationRequest,
    check_context,
    chunk,
    error_body,
    full_response,
    new_id,
    now_s,
    parse_generation,
    parse_json,
    prompt_ids_of,
    resolve_model,
    usage,
    usage_chunk,
)
from modelsim.pd import HOLD_TIMEOUT_S, ROLES, TransferParams, parse_transfer_params, prefill_answer
from modelsim.profiles import GpuProfile
from modelsim.sequence import Seq
from modelsim.tokenizer import ApproxTokenizer, HFTokenizer, PromptTokenizer

log = logging.getLogger("modelsim")
POD_HEADER = "x-modelsim-pod"
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


def _json(status: int, body: Any, pod: str) -> web.Response:
    return web.Response(
        status=status, text=json.dumps(body), content_type="application/json", headers={POD_HEADER: pod}
    )


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
        self._kv_client: aiohttp.ClientSession | None = None  # reads KV from prefill pods

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
        app.add_routes(
            [
                web.post("/v1/chat/completions", self._chat),
                web.post("/v1/completions", self._completions),
                web.post("/v1/embeddings", self._embeddings),
                web.post("/v1/responses", self._responses),
                web.post("/v1/messages", self._messages),
                web.post("/v1/messages/count_tokens", self._count_tokens),
                web.get("/v1/models", self._models),
                web.get("/health", self._health),
                web.get("/metrics", self._metrics),
                web.post("/tokenize", self._tokenize),
                web.post("/sim/probe", self._probe),
                web.post("/sim/probe-fleet", self._probe_fleet),
                web.post("/sim/fault", self._fault),
                web.get("/sim/fault", self._fault_get),
                web.get("/sim/state", self._state),
                web.post("/reset_prefix_cache", self._reset_prefix_cache),
                web.post("/sim/kv-transfer", self._kv_transfer),
            ]
        )
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
        if self._kv_client is not None:
            await self._kv_client.close()
            self._kv_client = None
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

    async def _apply_faults(
        self, shape: Callable[[int, str], dict[str, Any]] = error_body
    ) -> web.Response | None:
        """A stall, or an injected error (`error_status`, 500 by default) in the error shape of the
        path's API (`shape`)."""
        if self.faults.stall_s > 0:
            await self.clock.sleep(self.faults.stall_s)
        if self.faults.error_rate > 0 and self._rng.random() < self.faults.error_rate:
            status = self.faults.error_status
            return _json(
                status, shape(status, f"simulated server error {status} (fault injection)"), self.name
            )
        return None

    # ---- handlers --------------------------------------------------------------------------
    @web.middleware
    async def _count(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        self.http_requests[request.method, request.path] += 1
        return await handler(request)

    def _http_requests_text(self) -> bytes:
        lines = [
            "# HELP modelsim_http_requests_total Requests the pod's HTTP app routed (any status).\n",
            "# TYPE modelsim_http_requests_total counter\n",
        ]
        for (method, path), n in sorted(self.http_requests.items()):
            label = path.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")
            lines.append(f'modelsim_http_requests_total{{method="{method}",path="{label}"}} {n}\n')
        return "".join(lines).encode()

    async def _health(self, _: web.Request) -> web.Response:
        if self.faults.stall_s > 0:
            await self.clock.sleep(self.faults.stall_s)
        return web.Response(status=200, headers={POD_HEADER: self.name})

    async def _metrics(self, _: web.Request) -> web.Response:
        if self.faults.metrics_delay_s > 0:
            await asyncio.sleep(self.faults.metrics_delay_s)
        if self.faults.metrics_garbage:
            return web.Response(text="<html>upstream proxy error</html>\n", headers={POD_HEADER: self.name})
        return web.Response(
            body=render(self.registry) + self._http_requests_text(),
            headers={POD_HEADER: self.name, "Content-Type": "text/plain; version=0.0.4"},
        )

    async def _models(self, _: web.Request) -> web.Response:
        c = self.config
        created = now_s()
        base = {
            "object": "model",
            "created": created,
            "owned_by": "vllm",
            "max_model_len": self.engine.max_model_len,
        }
        data = [{**base, "id": c.model, "root": c.model, "parent": None}]
        data += [{**base, "id": a, "root": f"/adapters/{a}", "parent": c.model} for a in c.adapters]
        return _json(200, {"object": "list", "data": data}, self.name)

    async def _tokenize(self, request: web.Request) -> web.Response:
        try:
            body = parse_json(await request.read())
            resolve_model(body, self.config.model, self.config.adapters)
            kind = "chat" if "messages" in body else "completion"
            ids = prompt_ids_of(body, kind, self.tokenizer)
        except ApiError as exc:
            return _json(exc.status, exc.body(), self.name)
        out = {
            "count": len(ids),
            "max_model_len": self.engine.max_model_len,
            "tokens": ids,
            "token_strs": None,
        }
        return _json(200, out, self.name)

    async def _fault(self, request: web.Request) -> web.Response:
        try:
            body = parse_json(await request.read())
            kwargs: dict[str, Any] = {}
            for key, typ in (
                ("error_rate", (int, float)),
                ("error_status", int),
                ("stall_s", (int, float)),
                ("refuse", bool),
                ("crash", bool),
                ("metrics_garbage", bool),
                ("metrics_delay_s", (int, float)),
            ):
                if key in body:
                    v = body[key]
                    if not isinstance(v, typ) or (typ is not bool and isinstance(v, bool)):
                        raise ApiError(400, f"'{key}' has the wrong type")
                    kwargs[key] = v
            unknown = set(body) - {
                "error_rate",
                "error_status",
                "stall_s",
                "refuse",
                "crash",
                "metrics_garbage",
                "metrics_delay_s",
            }
            if unknown:
                raise ApiError(400, f"unknown fault fields {sorted(unknown)}")
            if kwargs.get("crash"):
                # Answer first, then crash: the caller learns the knob took effect.
                asyncio.get_running_loop().call_later(0.01, self.crash_now)
                self.faults.crashed = True
                return _json(200, self.faults.as_dict(), self.name)
            faults = await self.set_fault(**kwargs)
        except ApiError as exc:
            return _json(exc.status, exc.body(), self.name)
        except ValueError as exc:
            return _json(400, error_body(400, str(exc)), self.name)
        return _json(200, faults.as_dict(), self.name)

    async def _state(self, _: web.Request) -> web.Response:
        """Engine counters in simulated seconds, plus how far the process lagged (wall seconds)."""
        e, s = self.engine, self.engine.stats
        body = {
            "pod": self.name,
            "role": self.config.role,
            "held_kv_requests": len(e.held),
            "sim_time_s": self.clock.now(),
            "time_scale": self.clock.time_scale,
            "steps": s.steps,
            "waiting": len(e.waiting),
            "running": len(e.running),
            "kv_usage": e.kv_usage(),
            "num_preemptions": s.num_preemptions,
            "generation_tokens": s.generation_tokens,
            "ttft_sum_s": s.ttft.sum,
            "ttft_count": s.ttft.count,
            "itl_sum_s": s.itl.sum,
            "itl_count": s.itl.count,
            "max_lag_wall_s": e.max_lag_seen_s,
            "lag_sum_wall_s": e.lag_sum_s,
            "lora_gpu": e.lora.gpu_adapters(),
            "recent_traceparents": list(self.recent_traceparents),
        }
        if len(self.ranks) > 1:  # the pod-level figures above are rank 0's
            body["ranks"] = [
                {
                    "rank": r,
                    "waiting": len(x.waiting),
                    "running": len(x.running),
                    "kv_usage": x.kv_usage(),
                    "ttft_count": x.stats.ttft.count,
                }
                for r, x in enumerate(self.ranks)
            ]
        return _json(200, body, self.name)

    async def _reset_prefix_cache(self, _: web.Request) -> web.Response:
        """vLLM's dev-mode endpoint: 200 when reset, 400 while requests hold blocks."""
        if self.engine.reset_prefix_cache():
            return web.Response(status=200, headers={POD_HEADER: self.name})
        return _json(400, error_body(400, "cannot reset the prefix cache while requests run"), self.name)

    async def _fault_get(self, _: web.Request) -> web.Response:
        return _json(200, self.faults.as_dict(), self.name)

    async def _probe(self, request: web.Request) -> web.Response:
        try:
            body = parse_json(await request.read())
            _, adapter = resolve_model(body, self.config.model, self.config.adapters)
            kind = "chat" if "messages" in body else "completion"
            ids = prompt_ids_of(body, kind, self.tokenizer)
        except ApiError as exc:
            return _json(exc.status, exc.body(), self.name)
        return _json(200, self.probe(ids, adapter), self.name)

    async def _probe_fleet(self, request: web.Request) -> web.Response:
        """`/sim/probe` of every listening pod of this process that serves the request's model,
        keyed by address: one HTTP call and one tokenization per tokenizer instead of one of
        each per pod (the oracle's per-pod probes doubled the fleet's step lag)."""
        try:
            body = parse_json(await request.read())
        except ApiError as exc:
            return _json(exc.status, exc.body(), self.name)
        kind = "chat" if "messages" in body else "completion"
        out: dict[str, dict[str, Any]] = {}
        unserved: ApiError | None = None
        try:
            # A malformed prompt is a 400, as on /sim/probe; the ids serve every pod sharing it.
            ids_by_tokenizer = {id(self.tokenizer): prompt_ids_of(body, kind, self.tokenizer)}
            for pod in self.fleet:
                if not pod.listening:
                    continue
                try:
                    _, adapter = resolve_model(body, pod.config.model, pod.config.adapters)
                except ApiError as exc:
                    unserved = exc  # not this pod's model (or adapter): not a candidate
                    continue
                key = id(pod.tokenizer)
                ids = ids_by_tokenizer.get(key)
                if ids is None:
                    ids = ids_by_tokenizer[key] = prompt_ids_of(body, kind, pod.tokenizer)
                out[pod.address] = pod.probe(ids, adapter)
        except ApiError as exc:
            return _json(exc.status, exc.body(), self.name)
        if not out and unserved is not None:  # no live pod serves the model: /sim/probe's 404
            return _json(unserved.status, unserved.body(), self.name)
        return _json(200, {"pods": out}, self.name)

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

    async def _embeddings(self, request: web.Request) -> web.Response:
        """Each input is prefilled (one output token, not returned): the engine's timing and load."""
        faulted = await self._apply_faults()
        if faulted is not None:
            return faulted
        c = self.config
        try:
            req = parse_embedding(parse_json(await request.read()), c.model, c.adapters, self.tokenizer)
            for ids in req.inputs:
                check_context(len(ids), 1, self.engine.max_model_len)
            seqs = [self.engine.submit(ids, 1, req.adapter) for ids in req.inputs]
        except ApiError as exc:
            return _json(exc.status, exc.body(), self.name)
        except ValueError as exc:
            return _json(400, error_body(400, str(exc)), self.name)
        try:
            for seq in seqs:
                while (ev := await seq.events.get()).finish_reason is None:
                    pass
                if ev.error is not None:
                    return _json(500, error_body(500, ev.error), self.name)
        finally:
            for seq in seqs:
                self.engine.abort(seq)
        return _json(200, embedding_response(req), self.name)

    async def _responses(self, request: web.Request) -> web.Response:
        faulted = await self._apply_faults()
        if faulted is not None:
            return faulted
        c = self.config
        try:
            body = parse_json(await request.read())
            req = parse_responses(body, c.model, c.adapters, self.tokenizer, self.responses)
            check_context(len(req.prompt_ids), req.max_tokens, self.engine.max_model_len)
            max_tokens = req.max_tokens or self.engine.default_max_tokens(req.prompt_ids, None)
            seq = self.engine.submit(req.prompt_ids, max_tokens, req.adapter)
        except ApiError as exc:
            return _json(exc.status, exc.body(), self.name)
        except ValueError as exc:
            return _json(400, error_body(400, str(exc)), self.name)
        try:
            parts: list[str] = []
            while (ev := await seq.events.get()).finish_reason is None:
                parts.append(ev.text)
            if ev.error is not None:
                return _json(500, error_body(500, ev.error), self.name)
        finally:
            self.engine.abort(seq)
        text = "".join(parts)
        if req.store:
            self.responses.put(req.response_id, [*req.messages, {"role": "assistant", "content": text}])
        out = responses_response(
            req, text, seq.num_prompt, seq.num_output, seq.cached_tokens, ev.finish_reason
        )
        return _json(200, out, self.name)

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, "chat")

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, "completion")

    async def _generate(self, request: web.Request, kind: str) -> web.StreamResponse:
        if "traceparent" in request.headers:
            self.recent_traceparents.append(request.headers["traceparent"])
        faulted = await self._apply_faults()
        if faulted is not None:
            return faulted
        try:
            body = parse_json(await request.read())
            params = parse_transfer_params(body)
            if params is not None and params.do_remote_decode and body.get("stream"):
                raise ApiError(400, "a prefill-only request (do_remote_decode) must not stream")
            kv_from_remote = False
            if params is not None and params.do_remote_prefill:
                # validate the request before reading its KV
                parse_generation(body, kind, self.config.model, self.config.adapters, self.tokenizer)
                kv_from_remote = await self._read_remote_kv(params)
            engine = self.engine_for(request.headers)
            req, seq = self.admit(body, kind, kv_from_remote, engine)
        except ApiError as exc:
            return _json(exc.status, exc.body(), self.name)
        except ValueError as exc:
            return _json(400, error_body(400, str(exc)), self.name)
        try:
            if req.stream:
                return await self._stream(request, req, seq)
            return await self._unary(req, seq, engine)
        finally:
            engine.abort(seq)

    async def _messages(self, request: web.Request) -> web.StreamResponse:
        """Anthropic's Messages API: served as the chat completion it converts to (vLLM's way),
        answered in Anthropic's shapes (modelsim/anthropic_api.py)."""
        if "traceparent" in request.headers:
            self.recent_traceparents.append(request.headers["traceparent"])
        faulted = await self._apply_faults(anthropic_api.error_body)
        if faulted is not None:
            return faulted
        try:
            body = anthropic_api.chat_body(parse_json(await request.read()))
            engine = self.engine_for(request.headers)
            req, seq = self.admit(body, "chat", engine=engine)
        except ApiError as exc:
            return _json(exc.status, anthropic_api.error_body(exc.status, exc.message), self.name)
        except ValueError as exc:
            return _json(400, anthropic_api.error_body(400, str(exc)), self.name)
        try:
            if req.stream:
                return await self._messages_stream(request, req, seq)
            parts: list[str] = []
            while (ev := await seq.events.get()).finish_reason is None:
                parts.append(ev.text)
            if ev.error is not None:
                return _json(500, anthropic_api.error_body(500, ev.error), self.name)
            answer = anthropic_api.message(
                anthropic_api.new_message_id(),
                req.served_model,
                "".join(parts),
                ev.finish_reason,
                seq.num_prompt,
                seq.num_output,
            )
            return _json(200, answer, self.name)
        finally:
            engine.abort(seq)

    async def _messages_stream(
        self, request: web.Request, req: GenerationRequest, seq: Seq
    ) -> web.StreamResponse:
        resp = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache", POD_HEADER: self.name}
        )
        await resp.prepare(request)
        rid = anthropic_api.new_message_id()
        with contextlib.suppress(ConnectionError):  # a vanished client ends the stream quietly
            for event in anthropic_api.stream_start(rid, req.served_model, seq.num_prompt):
                await resp.write(anthropic_api.sse(event))
            while True:
                ev = await seq.events.get()
                if ev.error is not None:
                    if self.faults.crashed:
                        return resp
                    await resp.write(anthropic_api.sse(anthropic_api.error_body(500, ev.error)))
                    break
                if ev.finish_reason is not None:
                    for event in anthropic_api.stream_end(ev.finish_reason, seq.num_output):
                        await resp.write(anthropic_api.sse(event))
                    break
                await resp.write(anthropic_api.sse(anthropic_api.text_delta(ev.text)))
            await resp.write_eof()
        return resp

    async def _count_tokens(self, request: web.Request) -> web.Response:
        """`/v1/messages/count_tokens`: the prompt's token count; nothing runs on the engine."""
        faulted = await self._apply_faults(anthropic_api.error_body)
        if faulted is not None:
            return faulted
        c = self.config
        try:
            body = anthropic_api.chat_body(parse_json(await request.read()), count_only=True)
            resolve_model(body, c.model, c.adapters)
            ids = prompt_ids_of(body, "chat", self.tokenizer)
        except ApiError as exc:
            return _json(exc.status, anthropic_api.error_body(exc.status, exc.message), self.name)
        return _json(200, {"input_tokens": len(ids)}, self.name)

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

    # ---- disaggregated prefill/decode (modelsim/pd.py) ----------------------------------------
    async def _read_remote_kv(self, params: TransferParams) -> bool:
        """Read a prompt's KV from the prefill pod; False (recompute here) when that fails."""
        stats = self.engine.stats
        if self._kv_client is None:
            self._kv_client = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30))
        host = f"[{params.remote_host}]" if ":" in (params.remote_host or "") else params.remote_host
        url = f"http://{host}:{params.remote_port}/sim/kv-transfer"
        try:
            async with self._kv_client.post(url, json={"remote_request_id": params.remote_request_id}) as r:
                answer = await r.json() if r.status == 200 else None
        except (aiohttp.ClientError, TimeoutError, ValueError):
            answer = None
        if not isinstance(answer, dict) or not isinstance(answer.get("bytes"), int):
            stats.nixl_failed_transfers += 1
            return False
        stats.nixl_bytes.observe(answer["bytes"])
        stats.nixl_xfer_time.observe(float(answer.get("transfer_s", 0.0)))
        return True

    async def _kv_transfer(self, request: web.Request) -> web.Response:
        """A decode pod reads a held prefill's KV: answers after the link time, then frees it."""
        try:
            body = parse_json(await request.read())
            rid = body.get("remote_request_id")
            if not isinstance(rid, str) or not rid.isdigit():
                raise ApiError(400, "'remote_request_id' must be a request id string")
        except ApiError as exc:
            return _json(exc.status, exc.body(), self.name)
        engine = next((e for e in self.ranks if int(rid) in e.held), self.engine)
        seq = engine.held.get(int(rid))
        if seq is None:
            return _json(404, error_body(404, f"no KV held for request {rid} (read or expired)"), self.name)
        tokens = seq.num_prompt
        seconds = engine.profile.kv_transfer_s(tokens)
        await self.clock.sleep(seconds)
        if engine.release_held(seq.request_id) is None:
            return _json(
                404, error_body(404, f"the KV of request {rid} expired during the transfer"), self.name
            )
        nbytes = tokens * engine.profile.kv_bytes_per_token
        return _json(200, {"tokens": tokens, "bytes": nbytes, "transfer_s": seconds}, self.name)

    def _hold_for_transfer(self, seq: Seq, engine: Engine) -> dict[str, Any]:
        """Keep a finished prefill-only request's KV (freed on read or after the timeout)."""

        def expire() -> None:
            if engine.release_held(seq.request_id) is not None:
                engine.stats.nixl_expired_reqs += 1

        asyncio.get_running_loop().call_later(HOLD_TIMEOUT_S / self.clock.time_scale, expire)
        return prefill_answer(self.name, self.host, self.port, seq.request_id, list(seq.blocks))

    async def _unary(self, req: GenerationRequest, seq: Seq, engine: Engine) -> web.Response:
        parts: list[str] = []
        while True:
            ev = await seq.events.get()
            if ev.finish_reason is not None:
                break
            parts.append(ev.text)
        if ev.error is not None:
            return _json(500, error_body(500, ev.error), self.name)
        use = usage(seq.num_prompt, seq.num_output, seq.cached_tokens)
        body = full_response(
            req.kind, new_id(req.kind), now_s(), req.served_model, "".join(parts), ev.finish_reason, use
        )
        if seq.hold_kv and seq.request_id in engine.held:
            body["kv_transfer_params"] = self._hold_for_transfer(seq, engine)
        return _json(200, body, self.name)

    async def _stream(self, request: web.Request, req: GenerationRequest, seq: Seq) -> web.StreamResponse:
        resp = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache", POD_HEADER: self.name}
        )
        await resp.prepare(request)
        rid, created, model = new_id(req.kind), now_s(), req.served_model

        async def send(obj: Any) -> None:
            await resp.write(b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n")

        # A vanished client (or a crashed pod's aborted transport) ends the stream quietly.
        with contextlib.suppress(ConnectionError):
            if req.kind == "chat":
                await send(chunk(req.kind, rid, created, model, None, None))
            while True:
                ev = await seq.events.get()
                if ev.error is not None:
                    if self.faults.crashed:
                        return resp
                    await send(error_body(500, ev.error))
                    break
                if ev.finish_reason is not None:
                    await send(chunk(req.kind, rid, created, model, "", ev.finish_reason))
                    if req.include_usage:
                        use = usage(seq.num_prompt, seq.num_output, seq.cached_tokens)
                        await send(usage_chunk(req.kind, rid, created, model, use))
                    break
                await send(chunk(req.kind, rid, created, model, ev.text, None))
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
        return resp
