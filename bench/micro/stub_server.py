"""A tiny OpenAI-compatible streaming server for tests and load-generator overhead runs.

It is not a simulator: it answers every request after a fixed first-token delay with a fixed
number of SSE chunks, so a client measuring TTFT must find exactly that delay. It also answers
what peer routers probe (`/health`, `/v1/models`, vLLM-style `/tokenize`) and returns 404 on
`/server_info` and `/model_info` so that routers do not try to download a tokenizer.
"""

from __future__ import annotations

import asyncio
import json
import socket
import ssl
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

POD_HEADER = "x-modelsim-pod"


@dataclass
class StubConfig:
    name: str = "stub-0"
    model: str = "llama3.1-8b"
    first_token_delay_s: float = 0.0
    inter_token_delay_s: float = 0.0
    tokens: int = 4
    fail_every: int = 0  # every Nth completion request gets HTTP 500 (0 = never)


@dataclass
class StubStats:
    completions: int = 0
    paths: Counter[str] = field(default_factory=Counter)
    bodies: list[dict[str, Any]] = field(default_factory=list)


def _sse(payload: dict[str, Any] | str) -> bytes:
    data = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"))
    return f"data: {data}\n\n".encode()


class StubServer:
    """One stub pod on 127.0.0.1; `await start()` binds a free port."""

    def __init__(self, config: StubConfig | None = None, keep_bodies: bool = True) -> None:
        self.config = config or StubConfig()
        self.stats = StubStats()
        self.keep_bodies = keep_bodies
        self._runner: web.AppRunner | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_get("/health", self._health)
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/tokenize", self._tokenize)
        app.router.add_post("/v1/chat/completions", self._completion)
        app.router.add_post("/v1/completions", self._completion)
        app.router.add_route("*", "/{tail:.*}", self._not_found)
        return app

    @property
    def https_url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    async def start(self, port: int = 0, ssl_context: ssl.SSLContext | None = None) -> StubServer:
        self._runner = web.AppRunner(self._app(), access_log=None, shutdown_timeout=0.5)
        await self._runner.setup()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))
        self.port = sock.getsockname()[1]
        await web.SockSite(self._runner, sock, ssl_context=ssl_context).start()
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def _count(self, request: web.Request) -> None:
        self.stats.paths[request.path] += 1

    async def _health(self, request: web.Request) -> web.Response:
        self._count(request)
        return web.Response(text="OK")

    async def _models(self, request: web.Request) -> web.Response:
        self._count(request)
        return web.json_response(
            {"object": "list", "data": [{"id": self.config.model, "object": "model", "owned_by": "stub"}]}
        )

    async def _tokenize(self, request: web.Request) -> web.Response:
        """vLLM's /tokenize shape: one fake token id per 4 characters of the prompt."""
        self._count(request)
        body = await request.json()
        text = body.get("prompt") or json.dumps(body.get("messages", ""))
        tokens = [sum(map(ord, text[i : i + 4])) % 32000 for i in range(0, len(text), 4)]
        return web.json_response({"count": len(tokens), "max_model_len": 131072, "tokens": tokens})

    async def _not_found(self, request: web.Request) -> web.Response:
        self._count(request)
        return web.json_response({"error": {"message": "not found"}}, status=404)

    async def _completion(self, request: web.Request) -> web.StreamResponse:
        self._count(request)
        body = await request.json()
        self.stats.completions += 1
        if self.keep_bodies:
            self.stats.bodies.append(body)
        cfg = self.config
        if cfg.fail_every and self.stats.completions % cfg.fail_every == 0:
            return web.json_response(
                {"error": {"message": "injected failure"}}, status=500, headers={POD_HEADER: cfg.name}
            )
        chat = request.path.endswith("/chat/completions")
        if not body.get("stream"):
            text = " tok" * cfg.tokens
            choice = {"index": 0, "finish_reason": "length"}
            choice.update({"message": {"role": "assistant", "content": text}} if chat else {"text": text})
            return web.json_response(
                {"id": "stub", "choices": [choice], "usage": {"completion_tokens": cfg.tokens}},
                headers={POD_HEADER: cfg.name},
            )
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", POD_HEADER: cfg.name})
        await resp.prepare(request)
        if chat:
            await resp.write(_sse({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}))
        await asyncio.sleep(cfg.first_token_delay_s)
        for i in range(cfg.tokens):
            if i:
                await asyncio.sleep(cfg.inter_token_delay_s)
            delta: dict[str, Any] = {"delta": {"content": " tok"}} if chat else {"text": " tok"}
            await resp.write(_sse({"id": "stub", "choices": [{"index": 0, **delta}]}))
        finish: dict[str, Any] = {"delta": {}} if chat else {"text": ""}
        await resp.write(_sse({"choices": [{"index": 0, "finish_reason": "length", **finish}]}))
        if (body.get("stream_options") or {}).get("include_usage"):
            usage = {"prompt_tokens": 1, "completion_tokens": cfg.tokens, "total_tokens": cfg.tokens + 1}
            await resp.write(_sse({"choices": [], "usage": usage}))
        await resp.write(_sse("[DONE]"))
        await resp.write_eof()
        return resp


async def start_stubs(count: int, **config: Any) -> list[StubServer]:
    """Start `count` stub pods named stub-0..stub-N-1 sharing the other settings."""
    return [await StubServer(StubConfig(name=f"stub-{i}", **config)).start() for i in range(count)]
