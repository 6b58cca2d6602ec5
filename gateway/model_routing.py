"""Which model, and so which pool, a decoded request body goes to (pure apart from the split).

One piece of code for both shapes of the request path: BBR (`bbr/router.py`) turns the answer
into routing headers for Envoy to pick the pool's route, and the single-hop EPP
(`epp/single_hop.py`) dispatches to that pool's scheduler in the same stream.

A model with weighted rewrites (a canary split) is rewritten before routing, so the pool sees
the chosen name. Rewrites come from two places: a matching InferenceModelRewrite rule
(gateway/model_rewrites.py) wins; a model no rule matches uses its `rewrites` in the gateway
configuration. Either way a request is rewritten once (the chosen target is not rewritten again).
"""

from __future__ import annotations

import json
import logging
import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from extproc.errors import ErrorResponse, bad_request
from extproc.headers import BASE_MODEL_HEADER, MODEL_HEADER
from gateway.config import GatewayConfig, ModelRoute
from gateway.model_rewrites import ModelRewrites

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class RoutedModel:
    requested: str  # what the client asked for (or the configured default model)
    model: str  # what the request is sent as, after any rewrite
    route: ModelRoute  # the chosen model's pool, base model and adapter
    body_changed: bool  # `data["model"]` was written (a rewrite or the default model)

    @property
    def rewritten(self) -> bool:
        return self.model != self.requested

    def headers(self) -> dict[str, str]:
        """The routing headers Envoy's pool routes match on."""
        out = {MODEL_HEADER: self.model}
        if self.route.adapter is not None:
            out[BASE_MODEL_HEADER] = self.route.base_model
        return out

    def note(self) -> dict[str, str | bool]:
        """The decision as tracing attributes (without the `gateway.` prefix)."""
        route = self.route
        out: dict[str, str | bool] = {
            "requested": self.requested,
            "model": self.model,
            "base_model": route.base_model,
            "pool": route.pool,
            "rewritten": self.rewritten,
        }
        if route.adapter:
            out["adapter"] = route.adapter
        return out


def encode_body(data: Mapping[str, Any]) -> bytes:
    """The body re-serialised, compactly: only ever after a rewrite changed the model."""
    return json.dumps(data, ensure_ascii=False, separators=(",", ":")).encode()


class ModelRouter:
    """Model -> pool resolution with the rewrite rules in force (replaced whole by a watch)."""

    def __init__(self, rng: random.Random | None = None) -> None:
        self._rng = rng or random.Random()
        self.model_rewrites = ModelRewrites()
        self._unroutable: set[str] = set()  # rules already warned about (once per rule set)

    def set_model_rewrites(self, rewrites: ModelRewrites) -> None:
        self.model_rewrites = rewrites
        self._unroutable = set()

    def resolve(self, config: GatewayConfig, data: dict[str, Any]) -> RoutedModel | ErrorResponse:
        """Validate `model`, apply the rewrites, find the route. A rewrite is written into
        `data["model"]`, so the caller re-serialises only when `body_changed`."""
        routed = self.resolve_model(config, data.get("model"))
        if isinstance(routed, RoutedModel) and routed.body_changed:
            data["model"] = routed.model
        return routed

    def resolve_model(self, config: GatewayConfig, model: Any) -> RoutedModel | ErrorResponse:
        """`resolve` for the body's "model" value alone (the body is not touched:
        `body_changed` says that it must be re-written with the chosen model)."""
        given = model
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
        return RoutedModel(model, chosen, route, chosen != given)

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
