"""BBR's per-request logic: body -> routing headers (pure apart from the random split).

Envoy routes on `X-Gateway-Model-Name`; for a LoRA adapter `X-Gateway-Base-Model-Name`
names the base model whose pool serves it. Which model that is (weighted rewrites included) is
`gateway.model_routing`, shared with the single-hop EPP; this module adapts it to headers.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from extproc.body import decode_json_object
from extproc.errors import ErrorResponse
from extproc.headers import ROUTING_HEADERS
from extproc.stream import RequestRoute
from gateway.config import GatewayConfig
from gateway.model_rewrites import ModelRewrites
from gateway.model_routing import ModelRouter, encode_body

# Headers that steer routing: only the gateway may set them. Other x-gateway-* headers
# (inference objective, decision explain) are client requests and pass through.


def client_routing_headers(headers: dict[str, str]) -> tuple[str, ...]:
    """Routing headers a client sent: never trusted, always removed."""
    return tuple(name for name in headers if name in ROUTING_HEADERS)


class BodyRouter:
    def __init__(self, config_source: Callable[[], GatewayConfig], rng: random.Random | None = None) -> None:
        self._config = config_source
        self._models = ModelRouter(rng)

    @property
    def model_rewrites(self) -> ModelRewrites:
        return self._models.model_rewrites

    def set_model_rewrites(self, rewrites: ModelRewrites) -> None:
        self._models.set_model_rewrites(rewrites)

    def route(
        self, headers: dict[str, str], body: bytes, note: dict[str, str | bool] | None = None
    ) -> RequestRoute | ErrorResponse:
        """`note`, when given (tracing on), receives the decision: requested and routed model,
        base model, adapter, pool, whether the body was rewritten."""
        remove = client_routing_headers(headers)
        if not body:
            # No body (GET /v1/models, health checks): nothing to route on.
            # Always re-route: Envoy picked the route before the strip filter removed a forged
            # model header, and that stale route would reach a pool without an EPP decision.
            return RequestRoute(remove_headers=remove, clear_route_cache=True)
        data = decode_json_object(body)
        if isinstance(data, ErrorResponse):
            return data
        routed = self._models.resolve(self._config(), data)
        if isinstance(routed, ErrorResponse):
            return routed
        if note is not None:
            note.update(routed.note())
        set_headers = routed.headers()
        return RequestRoute(
            set_headers=set_headers,
            remove_headers=tuple(h for h in remove if h not in set_headers),
            clear_route_cache=True,
            body=encode_body(data) if routed.body_changed else None,
        )
