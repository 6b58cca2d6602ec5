"""The llm-d router's InferenceObjective and InferenceModelRewrite resources, parsed and vetted.

Users of llm-d and of the Gateway API Inference Extension already write these two resources
(group `llm-d.ai`, version `v1alpha2`; clusters that still run the GIE releases before the APIs
moved serve the same schema as `inference.networking.x-k8s.io/v1alpha2`):

- InferenceObjective `spec: {priority?: int32, poolRef: {group?, kind?, name}}`: a request whose
  `x-gateway-inference-objective` header names the resource gets its priority (unset = 0;
  negative = sheddable). The EPP applies it (epp/requestcontrol/header_policy.py).
- InferenceModelRewrite `spec: {poolRef, rules: [{matches?: [{model: {type?: Exact, value}}],
  targets: [{modelRewrite, weight?}]}]}`: a request for a matched model is sent, by weight, to
  one of the targets. BBR applies it (gateway/model_rewrites.py).

This module is pure (no Kubernetes client): pydantic models of the specs, `LastGood` (each
resource's last valid version, rejections logged and counted), and how a `poolRef` names one of
the configured pools. Unknown spec fields are ignored, as the API server prunes them and newer
upstream versions may add some; everything we read is validated strictly.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Generic, Literal, TypeVar

from prometheus_client import Counter, Gauge
from pydantic import BaseModel, ConfigDict, Field, StrictInt, ValidationError, model_validator

from gateway.config import GatewayConfig, validation_problems

log = logging.getLogger(__name__)

GROUP = "llm-d.ai"
LEGACY_GROUP = "inference.networking.x-k8s.io"  # GIE before the APIs moved to llm-d
API_GROUPS = (GROUP, LEGACY_GROUP)
VERSION = "v1alpha2"
POOL_GROUPS = frozenset({"inference.networking.k8s.io", "inference.networking.x-k8s.io"})

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1


@dataclass(frozen=True, slots=True)
class LlmdKind:
    kind: str
    plural: str


INFERENCE_OBJECTIVES = LlmdKind("InferenceObjective", "inferenceobjectives")
INFERENCE_MODEL_REWRITES = LlmdKind("InferenceModelRewrite", "inferencemodelrewrites")

RESOURCE_UPDATES = Counter(
    "gateway_llmd_resource_updates",
    "InferenceObjective / InferenceModelRewrite versions seen, by result (rejected: the last good one stays)",
    ["kind", "result"],
)
RESOURCES_IN_FORCE = Gauge(
    "gateway_llmd_resources_in_force", "InferenceObjectives / InferenceModelRewrites applied", ["kind"]
)


class _Spec(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True, populate_by_name=True)


class PoolRef(_Spec):
    group: str = "inference.networking.k8s.io"
    kind: str = "InferencePool"
    name: str = Field(min_length=1, max_length=253)


Int32 = Annotated[StrictInt, Field(ge=INT32_MIN, le=INT32_MAX)]


class InferenceObjectiveSpec(_Spec):
    priority: Int32 | None = None  # unset: 0, as the reference EPP treats it
    pool_ref: PoolRef = Field(alias="poolRef")

    @property
    def effective_priority(self) -> int:
        return 0 if self.priority is None else self.priority


class ModelMatch(_Spec):
    type: Literal["Exact"] = "Exact"
    value: str = Field(min_length=1)


class Match(_Spec):
    model: ModelMatch


class TargetModel(_Spec):
    model_rewrite: str = Field(alias="modelRewrite", min_length=1)
    weight: Annotated[StrictInt, Field(ge=1, le=1_000_000)] | None = None


class RewriteRule(_Spec):
    matches: list[Match] = Field(default_factory=list)  # empty: every model of the pool
    targets: list[TargetModel] = Field(min_length=1)

    @model_validator(mode="after")
    def _weights_all_or_none(self) -> RewriteRule:
        weighted = sum(1 for t in self.targets if t.weight is not None)
        if 0 < weighted < len(self.targets):
            raise ValueError("targets: set a weight on every target or on none")
        return self

    def weighted_targets(self) -> tuple[tuple[str, int], ...]:
        """(model, weight) per target; unweighted targets share the traffic equally."""
        return tuple((t.model_rewrite, t.weight or 1) for t in self.targets)


class InferenceModelRewriteSpec(_Spec):
    pool_ref: PoolRef = Field(alias="poolRef")
    rules: list[RewriteRule] = Field(min_length=1)


S = TypeVar("S", bound=_Spec)


@dataclass(frozen=True, slots=True)
class Accepted(Generic[S]):
    """A resource version that passed validation."""

    name: str
    created: str  # metadata.creationTimestamp (RFC 3339): older resources take precedence
    spec: S


class ResourceRejected(ValueError):
    """A resource version that cannot be applied; the message says why."""


class LastGood(Generic[S]):
    """Each present resource's last valid version.

    `update(cache)` takes the watch's full name -> object cache: a new version is parsed (and
    vetted by `check`, e.g. against the gateway configuration), applied when valid, else
    logged, counted under `gateway_llmd_resource_updates_total{result="rejected"}` and the
    resource's previous valid version kept; a resource absent from the cache stops applying.
    """

    def __init__(self, kind: LlmdKind, spec_type: type[S], check: Callable[[S], None] | None = None) -> None:
        self.kind = kind
        self._spec_type = spec_type
        self._check = check
        self._good: dict[str, Accepted[S]] = {}
        self._seen: dict[str, str] = {}  # name -> version last evaluated

    def update(self, cache: Mapping[str, Mapping[str, Any]]) -> dict[str, Accepted[S]]:
        for name in [n for n in self._seen if n not in cache]:
            del self._seen[name]
            if self._good.pop(name, None) is not None:
                log.info("%s %s deleted; it no longer applies", self.kind.kind, name)
        for name, obj in cache.items():
            meta = obj.get("metadata") or {}
            version = str(meta.get("generation") or meta.get("resourceVersion") or "")
            if self._seen.get(name) == version and version:
                continue  # unchanged spec (a status update, a re-list)
            self._seen[name] = version
            try:
                accepted = Accepted(name, str(meta.get("creationTimestamp") or ""), self._parse(obj))
            except ResourceRejected as exc:
                RESOURCE_UPDATES.labels(kind=self.kind.kind, result="rejected").inc()
                kept = "keeping its last good version" if name in self._good else "it does not apply"
                log.error("%s %s rejected (%s): %s", self.kind.kind, name, kept, exc)
                continue
            RESOURCE_UPDATES.labels(kind=self.kind.kind, result="applied").inc()
            self._good[name] = accepted
        RESOURCES_IN_FORCE.labels(kind=self.kind.kind).set(len(self._good))
        return dict(self._good)

    def _parse(self, obj: Mapping[str, Any]) -> S:
        spec = obj.get("spec")
        if not isinstance(spec, Mapping):
            raise ResourceRejected("spec must be an object")
        try:
            parsed = self._spec_type.model_validate(spec)
        except ValidationError as exc:
            raise ResourceRejected(validation_problems(exc)) from None
        if self._check is not None:
            try:
                self._check(parsed)
            except ValueError as exc:
                raise ResourceRejected(str(exc)) from None
        return parsed


def is_inference_pool(ref: PoolRef) -> bool:
    return ref.kind == "InferencePool" and ref.group in POOL_GROUPS


def config_pool_for(config: GatewayConfig, namespace: str, ref: PoolRef) -> str | None:
    """The configured pool a `poolRef` (in `namespace`) names, or None if we front no such pool.

    A Kubernetes pool is named by its InferencePool (`kubernetes.namespace` / `poolName`); a
    statically configured pool by its own `name`.
    """
    if not is_inference_pool(ref):
        return None
    for pool in config.pools:
        k = pool.kubernetes
        if k is not None and k.namespace == namespace and k.pool_name == ref.name:
            return pool.name
    for pool in config.pools:
        if pool.kubernetes is None and pool.name == ref.name:
            return pool.name
    return None


def check_rewrite_targets(config: Callable[[], GatewayConfig]) -> Callable[[InferenceModelRewriteSpec], None]:
    """A `LastGood` check: every target must be a model the gateway routes (else a typo would
    send a share of the traffic to 404s)."""

    def check(spec: InferenceModelRewriteSpec) -> None:
        routes = config().routes()
        for i, rule in enumerate(spec.rules):
            for target in rule.targets:
                if target.model_rewrite not in routes:
                    raise ValueError(
                        f"rules.{i}.targets: {target.model_rewrite!r} is not a model the gateway routes"
                    )

    return check


def parse_watch_ref(value: str, flag: str) -> tuple[str, str | None]:
    """`namespace[/name]` -> (namespace, name or None)."""
    namespace, sep, name = value.partition("/")
    if not namespace or (sep and not name) or "/" in name:
        raise ValueError(f"{flag} must be NAMESPACE or NAMESPACE/NAME, got {value!r}")
    return namespace, name or None


def add_api_group_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--llm-d-api-group",
        default=GROUP,
        choices=API_GROUPS,
        help=f"API group of InferenceObjective / InferenceModelRewrite (version {VERSION}); "
        f"{LEGACY_GROUP} on clusters with the GIE CRDs from before the move to llm-d",
    )
