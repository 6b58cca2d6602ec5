"""The sidecar's HTTP proxy: every request goes to the local decode engine; a generation request
that names a prefill pod runs its prefill there first (``kv_transfer_params.do_remote_decode``,
one output token, not streamed), then goes to the decode engine carrying the
``kv_transfer_params`` the prefill answered with (vLLM's NIXL connector protocol).

Failures are OpenAI-shaped JSON errors: 400 for a malformed prefiller header, 403 for a host
outside the pool, 502 when the prefill or decode pod fails or answers nonsense, 504 on a
timeout. Nothing is retried: the EPP chose these pods, and a silent aggregated fallback would
hide a broken prefill pool behind slow TTFTs.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

import httpx
from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from pdsidecar.allowlist import AllowList, PrefillerError, prefiller_base_url

log = logging.getLogger("pdsidecar")
HOST_PORT_HEADER = "x-prefiller-host-port"
URL_HEADER = "x-prefiller-url"
GENERATION_PATHS = ("/v1/chat/completions", "/v1/completions")
# Not forwarded: hop-by-hop headers, and what httpx/aiohttp set for the new message themselves.
_DROP = frozenset(
    {"host", "content-length", "transfer-encoding", "connection", "keep-alive", "upgrade", "te",
     "proxy-connection", HOST_PORT_HEADER, URL_HEADER}
)  # fmt: skip
# The body is passed on as it came (aiter_raw): its content-encoding header stays with it.
_DROP_BACK = frozenset({"content-length", "transfer-encoding", "connection", "keep-alive"})


@dataclass(frozen=True)
class SidecarConfig:
    decoder_url: str  # the local decode engine, e.g. http://127.0.0.1:8200
    allow: AllowList
    prefill_timeout_s: float = 300.0
    connect_timeout_s: float = 5.0


def _error(status: int, message: str) -> web.Response:
    kind = {400: "BadRequestError", 403: "PermissionDeniedError", 504: "GatewayTimeout"}
    body = {"error": {"message": message, "type": kind.get(status, "BadGatewayError"), "param": None,
                      "code": status}}  # fmt: skip
    return web.json_response(body, status=status)


def prefill_body(body: dict[str, Any]) -> dict[str, Any]:
    """The prefill pod's copy: one token, not streamed, KV kept for a remote decode."""
    out = {k: v for k, v in body.items() if k not in ("stream", "stream_options")}
    out["max_tokens"] = 1
    if "max_completion_tokens" in out:
        out["max_completion_tokens"] = 1
    out["kv_transfer_params"] = {
        "do_remote_decode": True,
        "do_remote_prefill": False,
        "remote_engine_id": None,
        "remote_block_ids": None,
        "remote_host": None,
        "remote_port": None,
    }
    return out


class Sidecar:
    """The aiohttp app and its httpx client; ``app()`` then ``close()``."""

    def __init__(self, config: SidecarConfig) -> None:
        self.config = config
        timeout = httpx.Timeout(config.prefill_timeout_s, connect=config.connect_timeout_s)
        self.client = httpx.AsyncClient(timeout=timeout, follow_redirects=False, trust_env=False)
        self.registry = CollectorRegistry(auto_describe=True)
        self.inflight = Gauge(
            "pdsidecar_inflight_requests", "Requests the sidecar is serving.", registry=self.registry
        )
        self.outcomes = Counter(
            "pdsidecar_requests",
            "Generation requests by path taken and outcome.",
            ["mode", "outcome"],
            registry=self.registry,
        )

    def app(self) -> web.Application:
        app = web.Application(client_max_size=256 * 1024**2)
        app.router.add_get("/sidecar/metrics", self._metrics)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        return app

    async def close(self) -> None:
        await self.client.aclose()

    async def _metrics(self, _: web.Request) -> web.Response:
        return web.Response(body=generate_latest(self.registry), content_type="text/plain")

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        self.inflight.inc()
        try:
            return await self._route(request)
        finally:
            self.inflight.dec()

    async def _route(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        host_port, url = request.headers.get(HOST_PORT_HEADER), request.headers.get(URL_HEADER)
        if request.method != "POST" or request.path not in GENERATION_PATHS or not (host_port or url):
            return await self._to_decoder(request, raw, "aggregated")
        try:
            base, host, port = prefiller_base_url(host_port, url)
            self.config.allow.check(host, port)
            body = json.loads(raw)
            if not isinstance(body, dict):
                raise ValueError("not an object")
        except PrefillerError as exc:
            self.outcomes.labels("disaggregated", "refused").inc()
            log.warning("refused prefiller: %s", exc)
            return _error(exc.status, str(exc))
        except (ValueError, UnicodeDecodeError):
            self.outcomes.labels("disaggregated", "bad_request").inc()
            return _error(400, "request body is not a JSON object")
        params = await self._prefill(request, base, body)
        if isinstance(params, web.Response):
            self.outcomes.labels("disaggregated", "prefill_failed").inc()
            return params
        decode = json.dumps({**body, "kv_transfer_params": params}).encode()
        return await self._to_decoder(request, decode, "disaggregated")

    async def _prefill(
        self, request: web.Request, base: str, body: dict[str, Any]
    ) -> dict[str, Any] | web.Response:
        """The prefill pod's ``kv_transfer_params``, or the error response to send."""
        target = base + request.path
        try:
            r = await self.client.post(target, json=prefill_body(body), headers=_forward(request.headers))
        except httpx.TimeoutException:
            return _error(504, f"prefill pod {base} did not answer in time")
        except httpx.HTTPError as exc:
            return _error(502, f"prefill pod {base} unreachable: {type(exc).__name__}")
        if r.status_code != 200:
            if 400 <= r.status_code < 500:  # the request itself is bad: the client's error, passed on
                return web.Response(body=r.content, status=r.status_code, content_type="application/json")
            return _error(502, f"prefill pod {base} answered {r.status_code}: {_message(r.content)}")
        try:
            params = r.json().get("kv_transfer_params")
        except (ValueError, AttributeError):
            params = None
        if not isinstance(params, dict):
            return _error(502, f"prefill pod {base} returned no kv_transfer_params (is its KV connector on?)")
        return params

    async def _to_decoder(self, request: web.Request, body: bytes, mode: str) -> web.StreamResponse:
        """Stream the local decode engine's answer back as it comes."""
        url = self.config.decoder_url + request.rel_url.path_qs
        upstream = self.client.build_request(
            request.method, url, content=body, headers=_forward(request.headers)
        )
        try:
            r = await self.client.send(upstream, stream=True)
        except httpx.TimeoutException:
            self.outcomes.labels(mode, "decode_failed").inc()
            return _error(504, "decode engine did not answer in time")
        except httpx.HTTPError as exc:
            self.outcomes.labels(mode, "decode_failed").inc()
            return _error(502, f"decode engine unreachable: {type(exc).__name__}")
        try:
            headers = {k: v for k, v in r.headers.items() if k.lower() not in _DROP_BACK}
            resp = web.StreamResponse(status=r.status_code, headers=headers)
            await resp.prepare(request)
            try:
                async for piece in r.aiter_raw():
                    await resp.write(piece)
            except httpx.HTTPError:
                # The engine went away mid-answer: cut the client's connection too, so a cut
                # body never looks complete (the status line has already gone out).
                self.outcomes.labels(mode, "decode_failed").inc()
                if request.transport is not None:
                    request.transport.abort()
                return resp
            await resp.write_eof()
            self.outcomes.labels(
                mode, "ok" if r.status_code < 400 else f"status_{r.status_code // 100}xx"
            ).inc()
            return resp
        finally:
            await r.aclose()


def _forward(headers: Any) -> dict[str, str]:
    return {k: v for k, v in headers.items() if k.lower() not in _DROP}


def _message(content: bytes) -> str:
    try:
        return str(json.loads(content)["error"]["message"])[:200]
    except (ValueError, KeyError, TypeError):
        return content[:200].decode("utf-8", "replace")
