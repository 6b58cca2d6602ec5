"""Which InferenceModelRewrite rule applies to a request's model (pure).

Precedence, as the llm-d API specifies it: a rule that names the model exactly beats a generic
rule (empty `matches`); among equals the oldest resource (creationTimestamp, then name) wins,
and within one resource the first rule in list order. A rule belongs to the pool its resource's
`poolRef` names (gateway.kube.llmd_api.config_pool_for): it applies to requests BBR routes to that
pool, and an exact rule may also name a model the configuration does not route at all (an alias
renamed to a served model). Resources for pools the gateway does not front are ignored.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from gateway.config import GatewayConfig, ModelRoute
from gateway.kube.llmd_api import Accepted, InferenceModelRewriteSpec, PoolRef, config_pool_for


@dataclass(frozen=True, slots=True)
class Rule:
    resource: str  # the InferenceModelRewrite's name
    pool_ref: PoolRef
    targets: tuple[tuple[str, int], ...]  # (model, weight)


class ModelRewrites:
    """The InferenceModelRewrite rules in force in one namespace, in precedence order."""

    def __init__(
        self, namespace: str = "", resources: Mapping[str, Accepted[InferenceModelRewriteSpec]] | None = None
    ) -> None:
        self.namespace = namespace
        self._exact: dict[str, list[Rule]] = {}
        self._generic: list[Rule] = []
        ordered = sorted((resources or {}).values(), key=lambda a: (a.created, a.name))
        for accepted in ordered:
            for rule in accepted.spec.rules:
                compiled = Rule(accepted.name, accepted.spec.pool_ref, rule.weighted_targets())
                if not rule.matches:
                    self._generic.append(compiled)
                for model in dict.fromkeys(m.model.value for m in rule.matches):
                    self._exact.setdefault(model, []).append(compiled)

    def __bool__(self) -> bool:
        return bool(self._exact or self._generic)

    def rule_for(self, model: str, config: GatewayConfig, routes: Mapping[str, ModelRoute]) -> Rule | None:
        route = routes.get(model)
        for rule in self._exact.get(model, ()):
            pool = config_pool_for(config, self.namespace, rule.pool_ref)
            if pool is not None and (route is None or route.pool == pool):
                return rule
        if route is None:
            return None
        for rule in self._generic:
            if config_pool_for(config, self.namespace, rule.pool_ref) == route.pool:
                return rule
        return None
