"""A simulated pod's operational endpoints: ``/health`` and ``/metrics`` as a model server has
them, vLLM's ``/reset_prefix_cache``, and the simulator's own ``/sim/*``: fault knobs, engine
state, and the exact-state probes the benchmarks' oracle reads (``/sim/probe``,
``/sim/probe-fleet``)."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from aiohttp import web

from modelsim.metrics import render
from modelsim.openai_api import ApiError, error_body, parse_json, prompt_ids_of, resolve_model
from modelsim.replies import POD_HEADER, json_reply, refusal

if TYPE_CHECKING:
    from modelsim.server import Pod

# POST /sim/fault's fields and their JSON types (a bool is not a number here).
FAULT_FIELDS: tuple[tuple[str, type | tuple[type, ...]], ...] = (
    ("error_rate", (int, float)),
    ("error_status", int),
    ("stall_s", (int, float)),
    ("refuse", bool),
    ("crash", bool),
    ("metrics_garbage", bool),
    ("metrics_delay_s", (int, float)),
)


class AdminHandlers:
    """The operational and ``/sim/*`` routes of one pod."""

    def __init__(self, pod: Pod) -> None:
        self.pod = pod

    def routes(self) -> list[web.RouteDef]:
        return [
            web.get("/health", self.health),
            web.get("/metrics", self.metrics),
            web.post("/sim/probe", self.probe),
            web.post("/sim/probe-fleet", self.probe_fleet),
            web.post("/sim/fault", self.fault),
            web.get("/sim/fault", self.fault_get),
            web.get("/sim/state", self.state),
            web.post("/reset_prefix_cache", self.reset_prefix_cache),
        ]

    async def health(self, _: web.Request) -> web.Response:
        pod = self.pod
        if pod.faults.stall_s > 0:
            await pod.clock.sleep(pod.faults.stall_s)
        return web.Response(status=200, headers={POD_HEADER: pod.name})

    async def metrics(self, _: web.Request) -> web.Response:
        pod = self.pod
        if pod.faults.metrics_delay_s > 0:
            await asyncio.sleep(pod.faults.metrics_delay_s)
        if pod.faults.metrics_garbage:
            return web.Response(text="<html>upstream proxy error</html>\n", headers={POD_HEADER: pod.name})
        return web.Response(
            body=render(pod.registry) + self._http_requests_text(),
            headers={POD_HEADER: pod.name, "Content-Type": "text/plain; version=0.0.4"},
        )

    def _http_requests_text(self) -> bytes:
        lines = [
            "# HELP modelsim_http_requests_total Requests the pod's HTTP app routed (any status).\n",
            "# TYPE modelsim_http_requests_total counter\n",
        ]
        for (method, path), n in sorted(self.pod.http_requests.items()):
            label = path.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")
            lines.append(f'modelsim_http_requests_total{{method="{method}",path="{label}"}} {n}\n')
        return "".join(lines).encode()

    async def fault(self, request: web.Request) -> web.Response:
        pod = self.pod
        try:
            body = parse_json(await request.read())
            kwargs: dict[str, Any] = {}
            for key, typ in FAULT_FIELDS:
                if key in body:
                    v = body[key]
                    if not isinstance(v, typ) or (typ is not bool and isinstance(v, bool)):
                        raise ApiError(400, f"'{key}' has the wrong type")
                    kwargs[key] = v
            unknown = set(body) - {key for key, _ in FAULT_FIELDS}
            if unknown:
                raise ApiError(400, f"unknown fault fields {sorted(unknown)}")
            if kwargs.get("crash"):
                # Answer first, then crash: the caller learns the knob took effect.
                asyncio.get_running_loop().call_later(0.01, pod.crash_now)
                pod.faults.crashed = True
                return json_reply(200, pod.faults.as_dict(), pod.name)
            faults = await pod.set_fault(**kwargs)
        except (ApiError, ValueError) as exc:
            return refusal(exc, pod.name)
        return json_reply(200, faults.as_dict(), pod.name)

    async def fault_get(self, _: web.Request) -> web.Response:
        return json_reply(200, self.pod.faults.as_dict(), self.pod.name)

    async def state(self, _: web.Request) -> web.Response:
        """Engine counters in simulated seconds, plus how far the process lagged (wall seconds)."""
        pod = self.pod
        e, s = pod.engine, pod.engine.stats
        body = {
            "pod": pod.name,
            "role": pod.config.role,
            "held_kv_requests": len(e.held),
            "sim_time_s": pod.clock.now(),
            "time_scale": pod.clock.time_scale,
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
            "recent_traceparents": list(pod.recent_traceparents),
        }
        if len(pod.ranks) > 1:  # the pod-level figures above are rank 0's
            body["ranks"] = [
                {
                    "rank": r,
                    "waiting": len(x.waiting),
                    "running": len(x.running),
                    "kv_usage": x.kv_usage(),
                    "ttft_count": x.stats.ttft.count,
                }
                for r, x in enumerate(pod.ranks)
            ]
        return json_reply(200, body, pod.name)

    async def reset_prefix_cache(self, _: web.Request) -> web.Response:
        """vLLM's dev-mode endpoint: 200 when reset, 400 while requests hold blocks."""
        pod = self.pod
        if pod.engine.reset_prefix_cache():
            return web.Response(status=200, headers={POD_HEADER: pod.name})
        return json_reply(400, error_body(400, "cannot reset the prefix cache while requests run"), pod.name)

    async def probe(self, request: web.Request) -> web.Response:
        pod = self.pod
        try:
            body = parse_json(await request.read())
            _, adapter = resolve_model(body, pod.config.model, pod.config.adapters)
            kind = "chat" if "messages" in body else "completion"
            ids = prompt_ids_of(body, kind, pod.tokenizer)
        except ApiError as exc:
            return json_reply(exc.status, exc.body(), pod.name)
        return json_reply(200, pod.probe(ids, adapter), pod.name)

    async def probe_fleet(self, request: web.Request) -> web.Response:
        """`/sim/probe` of every listening pod of this process that serves the request's model,
        keyed by address: one HTTP call and one tokenization per tokenizer instead of one of
        each per pod (the oracle's per-pod probes doubled the fleet's step lag)."""
        me = self.pod
        try:
            body = parse_json(await request.read())
        except ApiError as exc:
            return json_reply(exc.status, exc.body(), me.name)
        kind = "chat" if "messages" in body else "completion"
        out: dict[str, dict[str, Any]] = {}
        unserved: ApiError | None = None
        try:
            # A malformed prompt is a 400, as on /sim/probe; the ids serve every pod sharing it.
            ids_by_tokenizer = {id(me.tokenizer): prompt_ids_of(body, kind, me.tokenizer)}
            for pod in me.fleet:
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
            return json_reply(exc.status, exc.body(), me.name)
        if not out and unserved is not None:  # no live pod serves the model: /sim/probe's 404
            return json_reply(unserved.status, unserved.body(), me.name)
        return json_reply(200, {"pods": out}, me.name)
