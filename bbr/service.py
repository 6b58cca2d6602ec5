"""BBR's ext_proc processor: adapts `BodyRouter` to the shared stream state machine."""

from __future__ import annotations

from collections.abc import Callable

from bbr.router import BodyRouter
from extproc.errors import ErrorResponse
from extproc.stream import RequestOnlyProcessor, RequestRoute
from gateway.config import GatewayConfig


class BbrProcessor(RequestOnlyProcessor):
    def __init__(self, router: BodyRouter, config_source: Callable[[], GatewayConfig]) -> None:
        self._router = router
        self.max_body_bytes = config_source().bbr.max_body_bytes

    async def on_request(self, headers: dict[str, str], body: bytes) -> RequestRoute | ErrorResponse:
        return self._router.route(headers, body)
