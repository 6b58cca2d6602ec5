"""BBR's per-request logic: body -> routing headers (pure apart from the random split).

Envoy routes on `X-Gateway-Model-Name`; for a LoRA adapter `X-Gateway-Base-Model-Name`
names the base model whose pool serves it. A model with weighted rewrites (a canary
split) is rewritten in the body before routing, so the pool sees the chosen name.
"""

from __future__ import annotations

import json
import logging
import random
from collections.abc import Callable

from extproc.body import decode_json_object
from extproc.errors import ErrorResponse, bad_request
from extproc.headers import BASE_MODEL_HEADER, MODEL_HEADER, ROUTING_HEADERS
from extproc.stream import RequestRoute
from gateway.config import GatewayConfig

log = logging.getLogger(__name__)

# Headers that steer routing: only the gateway may set them. Other x-gateway-* headers
# (inference objective, decision explain) are client requests and pass through.


def client_routing_headers(headers: dict[str, str]) -> tuple[str, ...]:
    """Routing headers a client sent: never trusted, always removed."""
    return tuple(name for name in headers if name in ROUTING_HEADERS)


class BodyRouter:
    def __init__(self, config_source: Callable[[], GatewayConfig], rng: random.Random | None = None) -> None:
        self._config = config_source
        self._rng = rng or random.Random()

    def route(
        self, headers: dict[str, str], body: bytes, note: dict[str, str | bool] | None = None
    ) -> RequestRoute | ErrorResponse:
        """`note`, when given (tracing on), receives the decision: requested and routed model,
        base model, adapter, pool, whether the body was rewritten."""
        config = self._config()
        remove = client_routing_headers(headers)
        if not body:
            # No body (GET /v1/models, health checks): nothing to route on.
            # Always re-route: Envoy picked the route before the strip filter removed a forged
            # model header, and that stale route would reach a pool without an EPP decision.
            return RequestRoute(remove_headers=remove, clear_route_cache=True)
        data = decode_json_object(body)
        if isinstance(data, ErrorResponse):
            return data
        model = data.get("model")
        replaced: bytes | None = None
        if model is None or model == "":
            if config.bbr.default_model is None:
                return bad_request("the request must name a 'model'", "model_required")
            model = config.bbr.default_model
        elif not isinstance(model, str):
            return bad_request("'model' must be a string", "invalid_model")
        routes = config.routes()
        route = routes.get(model)
        if route is None:
            return ErrorResponse(404, f"The model '{model}' does not exist", "model_not_found")
        chosen = self._split(config, route.pool, model)
        if chosen != data.get("model"):
            data["model"] = chosen
            replaced = json.dumps(data, ensure_ascii=False, separators=(",", ":")).encode()
            route = routes[chosen]
        if note is not None:
            note.update(requested=model, model=chosen, base_model=route.base_model, pool=route.pool)
            note.update(rewritten=chosen != model, **({"adapter": route.adapter} if route.adapter else {}))
        set_headers = {MODEL_HEADER: chosen}
        if route.adapter is not None:
            set_headers[BASE_MODEL_HEADER] = route.base_model
        return RequestRoute(
            set_headers=set_headers,
            remove_headers=tuple(h for h in remove if h not in set_headers),
            clear_route_cache=True,
            body=replaced,
        )

    def _split(self, config: GatewayConfig, pool_name: str, model: str) -> str:
        for m in config.pool(pool_name).models:
            if m.name == model and m.rewrites:
                arms = [rw for rw in m.rewrites if rw.weight > 0]
                return self._rng.choices([rw.model for rw in arms], weights=[rw.weight for rw in arms])[0]
        return model
