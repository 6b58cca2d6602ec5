"""BBR's ext_proc processor: adapts `BodyRouter` to the shared stream state machine."""

from __future__ import annotations

from collections.abc import Callable

from bbr.router import BodyRouter
from extproc.errors import ErrorResponse
from extproc.stream import RequestOnlyProcessor, RequestRoute
from gateway.config import GatewayConfig
from gateway.tracing import Attributes, Tracing

SPAN_NAME = "bbr.route"


class BbrProcessor(RequestOnlyProcessor):
    def __init__(
        self,
        router: BodyRouter,
        config_source: Callable[[], GatewayConfig],
        tracing: Tracing | None = None,
    ) -> None:
        self._router = router
        self.max_body_bytes = config_source().bbr.max_body_bytes
        self._tracing = tracing or Tracing()

    async def on_request(self, headers: dict[str, str], body: bytes) -> RequestRoute | ErrorResponse:
        span = self._tracing.begin(SPAN_NAME, headers) if body else None  # None unless tracing is on
        if span is None:
            return self._router.route(headers, body)
        note: dict[str, str | bool] = {}
        outcome = self._router.route(headers, body, note)
        # The EPP's span (and so the model server) continue from this one.
        return self._tracing.finish_route(span, outcome, lambda: span_attributes(note, outcome))


def span_attributes(note: dict[str, str | bool], outcome: RequestRoute | ErrorResponse) -> Attributes:
    """BBR's decision: the model asked for, the one routed (after a weighted rewrite), its base
    model, adapter and pool; or why the request was refused."""
    attrs: dict[str, str | bool | int] = {f"gateway.{k}": v for k, v in note.items() if k != "requested"}
    if "requested" in note:
        attrs["gen_ai.request.model"] = note["requested"]
    if isinstance(outcome, ErrorResponse):
        attrs["gateway.outcome"] = outcome.code
        attrs["http.response.status_code"] = outcome.status
        attrs["gateway.refusal_reason"] = outcome.message
    else:
        attrs["gateway.outcome"] = "routed"
    return attrs
