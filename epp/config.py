"""The EPP's configuration schema: the shared one plus the EPP's own scheduling section.

`gateway.config.GatewayConfig` carries `profiles`, `thresholds` and `defaultProfile` as plain
data; `EppConfig` types them with the scheduler's models (epp/scheduling/profiles.py, whose
names come from the plugin registry) and checks what refers to them. Every EPP config source
(file, ConfigMap, InferenceGatewayConfig resource) validates through `EppConfig`, and the CRD
is generated from it (epp/crd.py), so BBR and the EPP read one file with one schema each.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import Field, PrivateAttr, model_validator

from epp.scheduling.params import Thresholds
from epp.scheduling.profiles import Profile, resolve_profiles
from gateway.config import GatewayConfig, load_config, parse_config


class EppConfig(GatewayConfig):
    profiles: dict[str, Profile] = Field(default_factory=dict)  # type: ignore[assignment]
    # Pool-wide plugin parameters; a profile's own `thresholds` override them field by field.
    thresholds: Thresholds = Field(default_factory=Thresholds)  # type: ignore[assignment]
    _resolved: dict[str, Profile] = PrivateAttr(default_factory=dict)

    @model_validator(mode="after")
    def _scheduling(self) -> EppConfig:
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
        return self

    def scheduler_profiles(self) -> dict[str, Profile]:
        """Configured profiles over the built-ins (default, chat, batch), each with the
        pool-wide thresholds under its own."""
        return dict(self._resolved)


def parse_epp_config(data: Any) -> EppConfig:
    return parse_config(data, EppConfig)


def load_epp_config(path: str | Path) -> EppConfig:
    return load_config(path, EppConfig)
