"""The small HTTP side port every service exposes: /metrics, /healthz and JSON debug views."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from extproc.server import StartupError, listen_error

JsonView = Callable[[], Mapping[str, Any]]


async def start_admin_http(
    host: str,
    port: int,
    *,
    metrics: Callable[[], bytes],
    views: Mapping[str, JsonView],
    port_flag: str = "--metrics-port",
) -> tuple[web.AppRunner, int]:
    """Serve until `runner.cleanup()`; returns the runner and the bound port (port 0 = any).
    A port that cannot be listened on is a StartupError naming `port_flag`."""

    async def metrics_page(_: web.Request) -> web.Response:
        return web.Response(body=metrics(), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    def view(render: JsonView) -> Callable[[web.Request], Any]:
        async def handler(_: web.Request) -> web.Response:
            return web.json_response(dict(render()))

        return handler

    app = web.Application()
    app.router.add_get("/metrics", metrics_page)
    app.router.add_get("/healthz", healthz)
    for path, render in views.items():
        app.router.add_get(path, view(render))
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    try:
        await site.start()
    except OSError as exc:
        await runner.cleanup()
        raise StartupError(listen_error(host, port, port_flag, exc)) from None
    bound = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, int(bound)
