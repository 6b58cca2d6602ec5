"""BBR's ext_proc processor: adapts `BodyRouter` to the shared stream state machine."""

from __future__ import annotations

from collections.abc import Callable

from bbr.router import BodyRouter
from extproc.errors import ErrorResponse
from extproc.stream import RequestRoute
from gateway.config import GatewayConfig


class BbrProcessor:
    def __init__(self, router: BodyRouter, config_source: Callable[[], GatewayConfig]) -> None:
        self._router = router
        self.max_body_bytes = config_source().bbr.max_body_bytes

    async def on_request(self, headers: dict[str, str], body: bytes) -> RequestRoute | ErrorResponse:
        return self._router.route(headers, body)

    def on_response_headers(self, headers: dict[str, str]) -> dict[str, str] | None:
        return None

    def on_response_body(self, chunk: bytes, end_of_stream: bool) -> None:
        return None

    def on_close(self, completed: bool) -> None:
        return None
