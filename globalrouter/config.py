"""Configuration of the global router: member clusters, failover, cost and rate-limit policy.

One YAML file feeds every router replica and the global Envoy bootstrap, so the routes Envoy
knows and the members the ext_proc may pick can never disagree.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from gateway import config as gateway_config
from gateway.pool_config import validate_ip_port

_NAME = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")


class ConfigError(gateway_config.ConfigError):
    """The router configuration is invalid; the message names every offending field (a kind
    of the gateway's, so the command line reports both alike)."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Member(_Model):
    """One cluster gateway behind the global router."""

    name: str
    address: str  # "ip:port" of the cluster gateway's HTTPS listener
    region: str = ""  # used until the cluster's first heartbeat says otherwise
    cost_per_1k_tokens: float | None = Field(default=None, ge=0)  # ditto

    @field_validator("name")
    @classmethod
    def _dns_label(cls, v: str) -> str:
        if not _NAME.match(v):
            raise ValueError("must be a DNS label: lower-case letters, digits and '-'")
        return v

    @field_validator("address")
    @classmethod
    def _host_port(cls, v: str) -> str:
        return validate_ip_port(v)

    @property
    def host_port(self) -> tuple[str, int]:
        host, _, port = self.address.rpartition(":")
        return host.strip("[]"), int(port)


class PassiveHealth(_Model):
    """Eject a member after failures seen in responses, for `eject_s`, then ramp it back."""

    consecutive_failures: int = Field(default=3, ge=1)
    window: int = Field(default=20, ge=1)  # last N outcomes considered for the error rate
    min_requests: int = Field(default=5, ge=1)
    error_rate: float = Field(default=0.5, gt=0, le=1)
    eject_s: float = Field(default=5.0, gt=0)


class TenantLimit(_Model):
    """Per-window budget of one tenant; None means unlimited."""

    requests: int | None = Field(default=None, ge=0)
    tokens: int | None = Field(default=None, ge=0)


class RateLimits(_Model):
    """Global limits shared by all replicas through Redis (sliding window of `buckets` slices)."""

    redis_url: str | None = None
    window_s: float = Field(default=60.0, gt=0)
    buckets: int = Field(default=12, ge=1, le=600)
    default: TenantLimit = TenantLimit()
    tenants: dict[str, TenantLimit] = Field(default_factory=dict)
    fail_open: bool = True  # Redis down: admit (availability) rather than refuse everything
    key_prefix: str = "grl"
    timeout_s: float = Field(default=0.5, gt=0)  # per Redis call, including waiting for a connection
    max_connections: int = Field(default=16, ge=1)  # per replica

    def limit_for(self, tenant: str) -> TenantLimit:
        return self.tenants.get(tenant, self.default)

    @property
    def enabled(self) -> bool:
        limits = [self.default, *self.tenants.values()]
        return self.redis_url is not None and any(
            limit.requests is not None or limit.tokens is not None for limit in limits
        )


class RouterConfig(_Model):
    members: list[Member] = Field(min_length=1)
    stale_after_s: float = Field(default=1.5, gt=0)  # heartbeat age that makes a member down
    ramp_s: float = Field(default=10.0, ge=0)  # a returning member's weight grows linearly over this
    min_ramp: float = Field(default=0.02, ge=0, le=1)
    startup_grace_s: float = Field(default=10.0, ge=0)  # members first seen this soon after start: no ramp
    ttft_objective_s: float | None = Field(default=1.0, gt=0)  # None: balance by load, ignore cost
    assumed_ttft_s: float = Field(default=0.2, gt=0)  # until a cluster reports an observed TTFT
    assumed_tpot_s: float = Field(default=0.02, gt=0)
    assumed_output_tokens: int = Field(default=128, ge=1)
    burst_window_s: float = Field(default=0.75, gt=0)  # our recent routes added to reported load
    slots_per_pod: int = Field(default=8, ge=1)  # capacity when a heartbeat reports none
    kv_saturated: float = Field(default=0.95, gt=0, le=1)
    heartbeat_error_rate: float = Field(default=0.5, gt=0, le=1)  # reported rate that makes a member down
    cross_region_rtt_ms: float = Field(default=80.0, ge=0)
    region_rtt_ms: dict[str, float] = Field(default_factory=dict)  # "a|b" -> RTT between regions
    region_header: str = "x-gateway-client-region"
    tenant_header: str = "x-tenant"
    max_body_bytes: int = Field(default=64 * 1024 * 1024, ge=1024)
    passive_health: PassiveHealth = PassiveHealth()
    rate_limits: RateLimits = RateLimits()

    @model_validator(mode="after")
    def _unique(self) -> RouterConfig:
        names = [m.name for m in self.members]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"duplicate member names: {', '.join(dupes)}")
        for key in self.region_rtt_ms:
            if key.count("|") != 1:
                raise ValueError(f"region_rtt_ms key {key!r} must be 'region-a|region-b'")
        return self

    def member(self, name: str) -> Member:
        for m in self.members:
            if m.name == name:
                return m
        raise KeyError(name)

    def rtt_s(self, client_region: str | None, region: str) -> float:
        """Network distance from the client's region; unknown client region costs nothing."""
        if not client_region or not region or client_region == region:
            return 0.0
        ms = self.region_rtt_ms.get(f"{client_region}|{region}")
        if ms is None:
            ms = self.region_rtt_ms.get(f"{region}|{client_region}", self.cross_region_rtt_ms)
        return ms / 1000.0


def parse_config(data: Any) -> RouterConfig:
    try:
        return RouterConfig.model_validate(data)
    except ValidationError as exc:
        problems = [
            f"{'.'.join(str(p) for p in err['loc']) or '<root>'}: {err['msg']}" for err in exc.errors()
        ]
        raise ConfigError("invalid global router config:\n  " + "\n  ".join(problems)) from None


def load_config(path: str | Path) -> RouterConfig:
    try:
        data = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"cannot read global router config {path}: {exc}") from None
    return parse_config(data)
