"""The configuration schema every service shares, for every source (file, ConfigMap, CRD).

This is the routing table (pools, models, adapters, endpoints), the listener, the knobs of
BBR and the EPP's pod loop, and the EPP's scheduling section (`profiles`, `thresholds`,
`defaultProfile`, typed by gateway/profiles.py without loading the scheduler). Every service
validates the whole file with this one schema, so BBR and every EPP reach the same verdict on
a change (applied, or rejected for the same reason with the last good one kept everywhere).
pydantic gives field-named validation errors for free; `ConfigError` turns them into one
readable message per problem (`pools.0.models.1.name: field required`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal, TypeVar, overload

import yaml
from pydantic import (
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)

from extproc.errors import ANTHROPIC_PATHS
from gateway.pool_config import MAX_FLOW_WAIT_MS, PoolConfig, StrictModel
from gateway.profiles import Profile, resolve_profiles
from gateway.scheduling_params import Thresholds

# Idle pods are scraped at least this often (4 x the 50 ms default interval; below the
# default 1 s stale threshold with room for a late scrape).
DEFAULT_MAX_INTERVAL_MS = 200

DEFAULT_MAX_BODY_BYTES = 256 * 1024 * 1024  # the AWS gateway's BBR default (facts.md)


class SharedStateConfig(StrictModel):
    """State the EPP replicas of a pool share through Redis (epp/datalayer/shared_state.py): each
    replica publishes its per-pod in-flight counts under a key that expires after `ttlMs` (a
    dead replica's share disappears then) and reads the others' in the same round trip: within
    `publishIntervalMs` of a change of its own counts, else every `idleIntervalMs`. Off (None)
    by default; Redis unreachable = local counts only."""

    redis: str = Field(min_length=1, pattern=r"^(redis|rediss|unix)://")
    publish_interval_ms: int = Field(default=20, ge=5, le=1000, alias="publishIntervalMs")
    idle_interval_ms: int = Field(default=200, ge=5, le=10_000, alias="idleIntervalMs")
    ttl_ms: int = Field(default=1000, ge=50, le=60_000, alias="ttlMs")
    timeout_ms: int = Field(default=200, ge=10, le=10_000, alias="timeoutMs")
    key_prefix: str = Field(default="igw:epp", min_length=1, pattern=r"^[A-Za-z0-9:_.-]+$", alias="keyPrefix")
    # Share routing decisions (pod, prompt block hashes) so every replica's approximate prefix
    # index learns every replica's traffic, through a Redis stream capped at `prefixStreamMaxLen`.
    prefix_index: bool = Field(default=True, alias="prefixIndex")
    prefix_stream_max_len: int = Field(default=10_000, ge=100, le=10_000_000, alias="prefixStreamMaxLen")
    # Share each scrape's parsed state (waiting, running, KV use, adapters) through the same
    # stream, so every replica reads every scrape of the pool: with `scrape.shareAcrossReplicas`
    # each replica scrapes a pod only every N intervals, and its own reading alone was N
    # intervals old (docs/benchmarks/costs.md, "More than one EPP process").
    share_scrapes: bool = Field(default=True, alias="shareScrapes")
    # Push each pick to the other replicas as it is made (a Redis channel, published by the
    # round trip that also stores it), so a replica deciding a burst's next request counts
    # the picks its peers made a moment ago instead of up to `publishIntervalMs` later.
    push_picks: bool = Field(default=True, alias="pushPicks")

    @model_validator(mode="after")
    def _ttl_covers_publishing(self) -> SharedStateConfig:
        if self.idle_interval_ms < self.publish_interval_ms:
            raise ValueError("idleIntervalMs must be at least publishIntervalMs")
        if self.ttl_ms < 3 * self.idle_interval_ms:
            raise ValueError("ttlMs must be at least 3 x idleIntervalMs, or live idle replicas expire")
        return self


class ScrapeConfig(StrictModel):
    """Per-pod cadence (epp/datalayer/scrape.py `Cadence`): every `intervalMs` while the pod is busy or
    its metrics change, backing off to `maxIntervalMs` (the staleness bound) while it is idle
    and unchanged; each interval is spread by +-`jitter` so pods are not scraped in lock-step."""

    interval_ms: int = Field(default=50, ge=5, alias="intervalMs")
    # None: max(intervalMs, DEFAULT_MAX_INTERVAL_MS)
    max_interval_ms: int | None = Field(default=None, ge=5, le=60_000, alias="maxIntervalMs")
    jitter: float = Field(default=0.1, ge=0.0, le=0.5)
    timeout_ms: int = Field(default=500, ge=10, alias="timeoutMs")
    # Observed-speed EWMAs lose half their weight per half-life; after 4 without a new
    # observation the pod's speed is unknown again (epp/datalayer/pool.py).
    speed_half_life_ms: int = Field(default=10_000, ge=100, le=86_400_000, alias="speedHalfLifeMs")
    # On: with sharedState, each replica waits its interval times the pool's live replica count,
    # so the pods see about one scrape per interval from all of a pool's EPPs together (N
    # replicas at the full rate multiply the load on the servers' metrics endpoints by N:
    # docs/benchmarks/costs.md, "More than one EPP process"). Off by default: in virtual time
    # (docs/benchmarks/replicas.md) replicas that read each pod only every N intervals route
    # bursts worse than one EPP (bursty 4 replicas TTFT P50 +13 %, bursty-headroom and
    # family-skewed-fleet P95 +6 to +10 %), while every replica scraping at the full rate (and
    # taking its peers' pages too) routes within 3 % of one EPP; a metrics page costs the server
    # far less than a worse burst costs its clients.
    share_across_replicas: bool = Field(default=False, alias="shareAcrossReplicas")

    def max_interval(self) -> int:
        """The idle interval in ms: `maxIntervalMs`, or the default but never below intervalMs."""
        if self.max_interval_ms is not None:
            return self.max_interval_ms
        return max(self.interval_ms, DEFAULT_MAX_INTERVAL_MS)


class AdmissionConfig(StrictModel):
    retry_after_s: int = Field(default=1, ge=1, alias="retryAfterSeconds")


class FlowBand(StrictModel):
    """Bounds of one priority band's EPP queue (epp/requestcontrol/flow_control.py)."""

    max_queue: int = Field(default=256, ge=0, le=100_000, alias="maxQueue")  # 0: never queue, refuse
    max_wait_ms: int = Field(default=5_000, ge=1, le=MAX_FLOW_WAIT_MS, alias="maxWaitMs")


class FlowControlConfig(StrictModel):
    """Hold requests in the EPP while every candidate pod is saturated (off: shed/forward as before).

    Bands by the objective's priority: > 0 critical, 0 standard, < 0 sheddable. The tenant (fair
    share within a band) comes from `tenantClaim` (a verified JWT claim) or, for trusted requests
    only, `tenantHeader` (epp/requestcontrol/header_policy.py).
    """

    enabled: bool = False
    critical: FlowBand = Field(default_factory=lambda: FlowBand(max_queue=1024, max_wait_ms=MAX_FLOW_WAIT_MS))
    standard: FlowBand = Field(default_factory=FlowBand)
    sheddable: FlowBand = Field(default_factory=lambda: FlowBand(max_queue=64, max_wait_ms=1_000))
    ordering: Literal["fcfs", "edf"] = "fcfs"  # within a tenant: arrival or earliest deadline
    tenant_header: str = Field(default="x-gateway-tenant", min_length=1, alias="tenantHeader")
    tenant_claim: str | None = Field(
        default=None, min_length=1, pattern=r"^[A-Za-z0-9_.:/-]+$", alias="tenantClaim"
    )


class SessionAffinityConfig(StrictModel):
    """The request header whose value keys the `session-affinity` scorer."""

    header: str = Field(default="x-session-id", min_length=1)


class BbrConfig(StrictModel):
    max_body_bytes: int = Field(default=DEFAULT_MAX_BODY_BYTES, gt=0, alias="maxRequestBodyBytes")
    default_model: str | None = Field(default=None, alias="defaultModel")


class TracingConfig(StrictModel):
    """OpenTelemetry spans for BBR and EPP decisions (gateway/tracing.py), exported over
    OTLP/gRPC. Off unless `enabled` (or OTEL_TRACES_EXPORTER=otlp); a field left unset falls
    back to the standard OTEL_* variable the SDK reads; read once at process start."""

    enabled: bool = False
    # OTLP/gRPC collector, e.g. http://otel-collector:4317 (else OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT)
    endpoint: str | None = Field(default=None, min_length=1)
    # Parent-based ratio sampler (else OTEL_TRACES_SAMPLER[_ARG]; the SDK's default samples all)
    sample_ratio: float | None = Field(default=None, ge=0, le=1, alias="sampleRatio")
    # The resource's service.name (else OTEL_SERVICE_NAME, else inference-gateway-bbr / -epp)
    service_name: str | None = Field(default=None, min_length=1, alias="serviceName")


class JwtAuth(StrictModel):
    """Require a JWT (Authorization: Bearer) signed by a key of this JWKS on every request."""

    issuer: str = Field(min_length=1)
    audiences: list[str] = Field(default_factory=list)
    jwks: str = Field(min_length=2, description="inline JWKS JSON: public keys only")

    @field_validator("jwks")
    @classmethod
    def _jwks_object(cls, v: str) -> str:
        try:
            data = json.loads(v)
        except json.JSONDecodeError as exc:
            raise ValueError(f"not JSON: {exc.msg}") from None
        if not isinstance(data, dict) or not isinstance(data.get("keys"), list) or not data["keys"]:
            raise ValueError("must be a JWKS object with a non-empty 'keys' list")
        return v


# The APIs the gateway serves: OpenAI's, and Anthropic's Messages API (`/v1/messages` and its
# `count_tokens`, which vLLM and SGLang serve too). Anything else (vLLM's /v1/load_lora_adapter,
# /sleep, /collective_rpc, /reset_prefix_cache, /metrics, ...) is answered 404 by Envoy itself.
API_PATHS = (
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/embeddings",
    "/v1/responses",
    *ANTHROPIC_PATHS,
    "/v1/models",
)
MODELS_PATH = "/v1/models"  # answered by Envoy from the configuration, never by a pod


class TrustedClaim(StrictModel):
    """A claim of the verified JWT (`listener.jwt`) whose value makes the request trusted."""

    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.:/-]+$")
    value: str = Field(min_length=1)


class HeaderTrust(StrictModel):
    """Who may use the request headers that reveal the fleet or change a request's priority.

    Untrusted requests get `x-gateway-decision` only with `decisionHeader: true`, and may pick
    only a model's `objectives` with `x-gateway-inference-objective`, never above the model's own
    priority. Trusted requests may do both freely. The EPP enforces it (epp/requestcontrol/header_policy.py).
    """

    # Every client may ask for the per-pod scores (reveals pod addresses: local development only).
    decision_header: bool = Field(default=False, alias="decisionHeader")
    # Only internal callers reach this listener (e.g. a ClusterIP-only gateway): trust every request.
    internal: bool = False
    jwt_claim: TrustedClaim | None = Field(default=None, alias="jwtClaim")


class ListenerConfig(StrictModel):
    """What Envoy accepts from clients before any ext_proc service sees the request."""

    # 8 KiB: below what the model servers accept themselves (aiohttp, modelsim: 8,190 bytes per
    # header; uvicorn/h11, vLLM and SGLang: 16 KiB in all), so an oversized header is Envoy's
    # JSON 431, never a pod's plain-text 400. Raise it only with the servers' limits.
    max_request_headers_kb: int = Field(default=8, ge=1, le=8192, alias="maxRequestHeadersKb")
    max_headers_count: int = Field(default=100, ge=1, le=10_000, alias="maxHeadersCount")
    # Exact request paths the gateway serves (any query string allowed); others are a JSON 404.
    paths: list[str] = Field(default_factory=lambda: list(API_PATHS), min_length=1)
    # Opt-out for operators who need more than the inference API: route every path to the pools.
    allow_all_paths: bool = Field(default=False, alias="allowAllPaths")
    jwt: JwtAuth | None = None
    trust: HeaderTrust = Field(default_factory=HeaderTrust)
    # How Envoy hands request bodies to BBR and the EPP (gateway/envoy/routes.py
    # `pool_processing_mode`). `streamed` (FULL_DUPLEX_STREAMED): any size up to
    # bbr.maxRequestBodyBytes, and the services send every chunk back. `buffered`: Envoy
    # collects the body and sends it once, nothing comes back (cheaper, see docs/benchmarks/costs.md
    # "Gateway overhead"), bounded by Envoy's per-connection buffer: a larger body gets a JSON 413.
    request_body_mode: Literal["streamed", "buffered"] = Field(default="streamed", alias="requestBodyMode")
    # Whether the EPP sees each response's headers (`always`) or, by default (`auto`), only where
    # a feature reads them: the decision header (`trust.decisionHeader`, or trusted callers, who
    # may ask for it), a pool's retries over `fallbackEndpoints` (the served endpoint). Otherwise
    # its routes ask for response trailers alone, which hold the ext_proc stream to the response's
    # end (the in-flight ledger) without Envoy waiting on the EPP before the first byte, and save
    # a message each way per request (docs/benchmarks/costs.md, "Gateway overhead").
    epp_response_headers: Literal["auto", "always"] = Field(default="auto", alias="eppResponseHeaders")
    # The buffered body limit, rendered as the listener's per_connection_buffer_limit_bytes;
    # unset: the renderer's connection buffer (`render_envoy --buffer-bytes`, 4 MiB default).
    max_buffered_body_bytes: int | None = Field(
        default=None, ge=64 * 1024, le=1024 * 1024 * 1024, alias="maxBufferedBodyBytes"
    )

    @field_validator("paths")
    @classmethod
    def _absolute(cls, v: list[str]) -> list[str]:
        for path in v:
            if not path.startswith("/") or any(c in path for c in "?# "):
                raise ValueError(f"{path!r} must be an absolute path without query, fragment or spaces")
        return v

    @model_validator(mode="after")
    def _one_path_policy(self) -> ListenerConfig:
        if self.allow_all_paths and "paths" in self.model_fields_set:
            raise ValueError(
                "allowAllPaths: true routes every path; remove 'paths' or set allowAllPaths: false"
            )
        limit = self.max_buffered_body_bytes
        if limit is not None and limit < self.max_request_headers_kb * 1024:
            # The same per-connection buffer holds the request headers.
            raise ValueError(
                f"maxBufferedBodyBytes ({limit}) must be at least maxRequestHeadersKb "
                f"({self.max_request_headers_kb} KiB): Envoy's connection buffer holds the headers too"
            )
        if self.trust.jwt_claim is not None and self.jwt is None:
            raise ValueError(
                "trust.jwtClaim needs listener.jwt: only a verified token can carry a trusted claim"
            )
        return self


class GatewayConfig(StrictModel):
    pools: list[PoolConfig] = Field(min_length=1)
    listener: ListenerConfig = Field(default_factory=ListenerConfig)
    # The EPP's scheduling section: profiles over the built-ins (gateway/profiles.py), and
    # pool-wide plugin parameters that a profile's own `thresholds` override field by field.
    profiles: dict[str, Profile] = Field(default_factory=dict)
    default_profile: str = Field(default="default", alias="defaultProfile")
    thresholds: Thresholds = Field(default_factory=Thresholds)
    scrape: ScrapeConfig = Field(default_factory=ScrapeConfig)
    admission: AdmissionConfig = Field(default_factory=AdmissionConfig)
    flow_control: FlowControlConfig = Field(default_factory=FlowControlConfig, alias="flowControl")
    session_affinity: SessionAffinityConfig = Field(
        default_factory=SessionAffinityConfig, alias="sessionAffinity"
    )
    bbr: BbrConfig = Field(default_factory=BbrConfig)
    tracing: TracingConfig = Field(default_factory=TracingConfig)
    shared_state: SharedStateConfig | None = Field(default=None, alias="sharedState")
    _resolved: dict[str, Profile] = PrivateAttr(default_factory=dict)

    @model_validator(mode="after")
    def _consistent(self) -> GatewayConfig:
        seen_pools: set[str] = set()
        names: dict[str, str] = {}
        for pool in self.pools:
            if pool.name in seen_pools:
                raise ValueError(f"pools: duplicate pool name {pool.name!r}")
            seen_pools.add(pool.name)
            for model in pool.models:
                for name in (model.name, *model.adapters):
                    if name in names:
                        raise ValueError(
                            f"model name {name!r} is declared twice (pools {names[name]!r} and {pool.name!r})"
                        )
                    names[name] = pool.name
            pool_names = {m.name for m in pool.models} | {a for m in pool.models for a in m.adapters}
            for model in pool.models:
                for rw in model.rewrites:
                    if rw.model not in pool_names:
                        raise ValueError(
                            f"pools.{pool.name}.models.{model.name}.rewrites: {rw.model!r} is not served by this pool"
                        )
                if model.rewrites and sum(rw.weight for rw in model.rewrites) == 0:
                    raise ValueError(f"pools.{pool.name}.models.{model.name}.rewrites: weights sum to 0")
        if self.listener.max_buffered_body_bytes is not None and not self.buffers_request_bodies():
            raise ValueError(
                "listener.maxBufferedBodyBytes bounds buffered bodies only: set listener.requestBodyMode: "
                "buffered (or a FailOpen pool), or remove it"
            )
        if self.scrape.max_interval() < self.scrape.interval_ms:
            raise ValueError("scrape.maxIntervalMs: must be >= scrape.intervalMs")
        for pool in self.pools:
            if pool.kubernetes is not None and pool.fallback_endpoints:
                raise ValueError(
                    f"pools.{pool.name}.fallbackEndpoints: Kubernetes pools route through ORIGINAL_DST, "
                    "which takes one address; set it to 0"
                )
        if self.flow_control.tenant_claim is not None and self.listener.jwt is None:
            raise ValueError("flowControl.tenantClaim needs listener.jwt: only a verified token has claims")
        if self.bbr.default_model is not None and self.bbr.default_model not in names:
            raise ValueError(f"bbr.defaultModel: {self.bbr.default_model!r} is not a configured model")
        self._scheduling()
        return self

    def _scheduling(self) -> None:
        """What the scheduling section refers to exists, and the scrape cadence suits it."""
        profiles = resolve_profiles(self.profiles, self.thresholds)
        if self.default_profile not in profiles:
            raise ValueError(f"defaultProfile: {self.default_profile!r} is not a defined profile")
        for pool in self.pools:
            for model in pool.models:
                for name in (model.profile, *model.objectives):
                    if name is not None and name not in profiles:
                        raise ValueError(
                            f"pools.{pool.name}.models.{model.name}: profile {name!r} is not defined"
                        )
        stale_ms = min(p.thresholds.stale_after_ms for p in profiles.values())
        if self.scrape.max_interval_ms is not None and self.scrape.max_interval_ms >= stale_ms:
            raise ValueError(
                "scrape.maxIntervalMs: must be below every profile's staleAfterMs, or idle pods read as stale"
            )
        self._resolved = profiles

    def scheduler_profiles(self) -> dict[str, Profile]:
        """Configured profiles over the built-ins (default, gie, chat, predicted, batch), each
        with the pool-wide thresholds under its own."""
        return dict(self._resolved)

    def buffers_request_bodies(self, pool: PoolConfig | None = None) -> bool:
        """Whether Envoy buffers request bodies (BUFFERED) rather than streaming them: every
        route in `requestBodyMode: buffered`; a FailOpen pool's EPP always, since Envoy honours
        `failure_mode_allow` only there. Without `pool`: any route at all."""
        if self.listener.request_body_mode == "buffered":
            return True
        pools = self.pools if pool is None else [pool]
        return any(p.failure_mode == "FailOpen" for p in pools)

    def epp_reads_response_headers(self, pool: PoolConfig | None = None) -> bool:
        """Whether a pool's EPP (any pool's, without `pool`) needs the response headers event
        (`listener.eppResponseHeaders`)."""
        listener = self.listener
        if listener.epp_response_headers == "always":
            return True
        trust = listener.trust
        if trust.decision_header or trust.internal or trust.jwt_claim is not None:
            return True
        pools = self.pools if pool is None else [pool]
        # disaggregation: the decode pod's response headers end the prefill pod's slot
        return any(p.fallback_endpoints > 0 or p.disaggregation is not None for p in pools)

    def routes(self) -> Mapping[str, ModelRoute]:
        """Every public model name (base or adapter) -> where it goes. Built once per config
        (the config is immutable): BBR and the EPP look a model up on every request."""
        return self._route_table

    @cached_property
    def _route_table(self) -> Mapping[str, ModelRoute]:
        out: dict[str, ModelRoute] = {}
        for pool in self.pools:
            for model in pool.models:
                out[model.name] = ModelRoute(pool.name, model.name, None)
                for adapter in model.adapters:
                    out[adapter] = ModelRoute(pool.name, model.name, adapter)
        return MappingProxyType(out)

    def pool(self, name: str) -> PoolConfig:
        for pool in self.pools:
            if pool.name == name:
                return pool
        raise KeyError(name)


@dataclass(frozen=True, slots=True)
class ModelRoute:
    pool: str
    base_model: str
    adapter: str | None


class ConfigError(ValueError):
    """A configuration that failed validation; the message names each bad field."""


def validation_problems(exc: ValidationError) -> str:
    """One `field.path: message` per problem, `; `-separated (also for the llm-d resources)."""
    problems = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"]) or "(root)"
        problems.append(f"{where}: {err['msg']}")
    return "; ".join(problems)


Schema = TypeVar("Schema", bound=GatewayConfig)


@overload
def parse_config(data: Mapping[str, Any]) -> GatewayConfig: ...
@overload
def parse_config(data: Mapping[str, Any], schema: type[Schema]) -> Schema: ...
def parse_config(data: Mapping[str, Any], schema: type[GatewayConfig] = GatewayConfig) -> GatewayConfig:
    """Validate config data against `schema` (the EPP passes its own, a subclass)."""
    try:
        return schema.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(validation_problems(exc)) from None


@overload
def load_config(path: str | Path) -> GatewayConfig: ...
@overload
def load_config(path: str | Path, schema: type[Schema]) -> Schema: ...
def load_config(path: str | Path, schema: type[GatewayConfig] = GatewayConfig) -> GatewayConfig:
    try:
        data = yaml.safe_load(Path(path).read_text())
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {' '.join(str(exc).split())}") from None
    if not isinstance(data, Mapping):
        raise ConfigError(f"{path}: the top level must be a mapping")
    return parse_config(data, schema)
