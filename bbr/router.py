"""BBR's per-request logic: body -> routing headers (pure apart from the random split).

Envoy routes on `X-Gateway-Model-Name`; for a LoRA adapter `X-Gateway-Base-Model-Name`
names the base model whose pool serves it. A model with weighted rewrites (a canary
split) is rewritten in the body before routing, so the pool sees the chosen name, and the
request is routed to the chosen model's pool.

Rewrites come from two places: a matching InferenceModelRewrite rule (bbr/model_rewrites.py,
followed with `--inference-model-rewrites`) wins; a model no rule matches uses its
`rewrites` in the gateway configuration. Either way a request is rewritten once (the chosen
target is not rewritten again).
"""

from __future__ import annotations

import json
import logging
import random
from collections.abc import Callable, Mapping

from bbr.model_rewrites import ModelRewrites
from extproc.body import decode_json_object
from extproc.errors import ErrorResponse, bad_request
from extproc.headers import BASE_MODEL_HEADER, MODEL_HEADER, ROUTING_HEADERS
from extproc.stream import RequestRoute
from gateway.config import GatewayConfig, ModelRoute

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
        self.model_rewrites = ModelRewrites()  # replaced whole by the resource watch
        self._unroutable: set[str] = set()  # rules already warned about (once per rule set)

    def set_model_rewrites(self, rewrites: ModelRewrites) -> None:
        self.model_rewrites = rewrites
        self._unroutable = set()

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
        chosen = self._rewrite(config, routes, model)
        route = routes.get(chosen)
        if route is None:
            return ErrorResponse(404, f"The model '{model}' does not exist", "model_not_found")
        if chosen != data.get("model"):
            data["model"] = chosen
            replaced = json.dumps(data, ensure_ascii=False, separators=(",", ":")).encode()
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

    def _rewrite(self, config: GatewayConfig, routes: Mapping[str, ModelRoute], model: str) -> str:
        """The model to send the request to: an InferenceModelRewrite rule's weighted pick, else
        the configured split, else the model itself."""
        rule = self.model_rewrites.rule_for(model, config, routes) if self.model_rewrites else None
        if rule is not None:
            # Targets were checked on arrival; one the configuration stopped routing is skipped.
            arms = [(target, weight) for target, weight in rule.targets if target in routes]
            if arms:
                return self._pick(arms)
            if rule.resource not in self._unroutable:  # once, not on every request
                self._unroutable.add(rule.resource)
                log.warning("InferenceModelRewrite %s: no target is routed now; ignored", rule.resource)
        route = routes.get(model)
        if route is None:
            return model
        for m in config.pool(route.pool).models:
            if m.name == model and m.rewrites:
                return self._pick([(rw.model, rw.weight) for rw in m.rewrites if rw.weight > 0])
        return model

    def _pick(self, arms: list[tuple[str, int]]) -> str:
        return self._rng.choices([a for a, _ in arms], weights=[w for _, w in arms])[0]
