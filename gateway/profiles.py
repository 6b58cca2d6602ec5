"""Scheduling profiles: named weight sets plus a picker and thresholds, validated once.

A profile is all a configuration needs to define a policy. It is a pydantic model whose
scorer and picker names are the plugin catalogue's (gateway/plugin_catalogue.py), so the config file, the
ConfigMap, the CRD and code all go through this one validation. It is part of the shared
schema (gateway/config.py) so that BBR, which never loads the scheduler, rejects exactly the
files the EPPs reject. Names are kebab-case only (`kv-cache`, `weighted-random`).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic.json_schema import SkipJsonSchema

from gateway import plugin_catalogue
from gateway.scheduling_params import DEFAULT_THRESHOLDS, Thresholds

# The scheduler's plugins by config name (gateway/plugin_catalogue.py), as shipped: the picker
# names are an enum of the JSON schema (hence of the CRD); scorer names are checked against the
# catalogue as it is when a profile is validated.
SCORER_NAMES: tuple[str, ...] = plugin_catalogue.names("scorer")
PICKER_NAMES: tuple[str, ...] = plugin_catalogue.names("picker")

# Totals are sums of weight x [0, 1]; bounding weights keeps them (and the picker's tie
# quantisation, total / 1e-9) finite.
MAX_WEIGHT = 1e6

if TYPE_CHECKING:
    PickerName = str
else:  # the registry's names: an enum in the JSON schema, hence in the CRD
    PickerName = Literal[PICKER_NAMES]

Weight = Annotated[float, Field(ge=0, le=MAX_WEIGHT, allow_inf_nan=False, strict=True)]


class ProfileError(ValueError):
    """A profile definition is invalid; the message starts with the offending field's path."""


class Profile(BaseModel):
    """One scheduling policy. `priority` < 0 marks its traffic sheddable (admission reads it;
    scheduling ignores it)."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    name: SkipJsonSchema[str] = Field(default="", exclude=True)  # set from its key in `profiles`
    weights: dict[str, Weight]
    # The filters this profile runs, in this order (the catalogue's names); None: every filter
    # of the catalogue, in its order. `adapter-slots` reads what `unsaturated` set aside, so it
    # adds saturated pods back only after it.
    filters: tuple[str, ...] | None = None
    picker: PickerName = "max"
    priority: int = Field(default=0, strict=True)
    thresholds: Thresholds = DEFAULT_THRESHOLDS
    # The time-to-first-token objective of this profile's requests (docs/scheduling.md, "Latency
    # objectives"); a trusted request's `x-gateway-slo-ttft-ms` overrides it. None: no objective.
    slo_ttft_ms: int | None = Field(default=None, ge=1, le=600_000, alias="sloTtftMs")

    @field_validator("weights")
    @classmethod
    def _known_scorers(cls, weights: dict[str, float]) -> dict[str, float]:
        for name in weights:
            known = plugin_catalogue.names("scorer")
            if name not in known:
                raise ValueError(f"unknown scorer {name!r} (known: {', '.join(known)})")
        if not any(w > 0 for w in weights.values()):
            raise ValueError("at least one weight must be > 0")
        return weights

    @field_validator("filters")
    @classmethod
    def _known_filters(cls, filters: tuple[str, ...] | None) -> tuple[str, ...] | None:
        known = plugin_catalogue.names("filter")
        for name in filters or ():
            if name not in known:
                raise ValueError(f"unknown filter {name!r} (known: {', '.join(known)})")
        if filters is not None and len(set(filters)) != len(filters):
            raise ValueError("a filter is named twice")
        return filters

    def resolved(self, name: str, pool_wide: Thresholds) -> Profile:
        """This profile named `name`, its own thresholds over the pool-wide ones."""
        return self.model_copy(update={"name": name, "thresholds": pool_wide.overlaid(self.thresholds)})

    def to_dict(self) -> dict[str, Any]:
        """Config data that validates back to this profile."""
        return self.model_dump(by_alias=True)


def profile(name: str, weights: Mapping[str, float], **fields: Any) -> Profile:
    """A validated profile from code (tests, benchmarks); raises ProfileError."""
    return _validate(name, {"weights": dict(weights), **fields}).resolved(name, DEFAULT_THRESHOLDS)


def _validate(name: str, data: Any) -> Profile:
    try:
        return Profile.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in (f"profiles.{name}", *err["loc"]))
        raise ProfileError(f"{where}: {err['msg']}") from None


# Built-ins as plain data, the same shape a config file uses.
BUILTIN_PROFILE_DATA: Mapping[str, Mapping[str, Any]] = MappingProxyType(
    {
        # The shipped default (issue #11): each pod's predicted time to first token for this
        # request (see "predicted") plus prefix affinity. The prediction is greedy per request;
        # the prefix term keeps a prompt family on the pods that hold it, which is what keeps it
        # cached under KV pressure (the prediction alone spread tenants' prompts and lost their
        # hits: family-tenant-prefix-kv, tuning seed 100, TTFT P95 0.55 s vs 0.27 s with it).
        # precise-prefix-cache reads the pods' KV events where the pool has them (a model
        # tokenizer and events ports configured) and is prefix-cache elsewhere, per pod.
        # Chosen on the tuning seeds of the four scenario families; docs/benchmarks/history.md.
        "default": {"weights": {"predicted-ttft": 5, "precise-prefix-cache": 2, "kv-cache": 1}},
        # GIE's and AWS's published defaults (ours until issue #11), so results compare with theirs.
        "gie": {"weights": {"queue": 2, "kv-cache": 2, "prefix-cache": 3}},
        # Interactive chat, tuned for TTFT: the EPP's own in-flight count reacts within a
        # request (scrapes lag by up to an interval), observed speed steers away from slow
        # GPUs, prefix hits cut prefill, LoRA affinity keeps adapter loads off the path.
        "chat": {
            "weights": {
                "queue": 2,
                "kv-cache": 1,
                "prefix-cache": 2,
                "lora-affinity": 1,
                "inflight": 2,
                "observed-speed": 3,
            }
        },
        # Predicted TTFT per pod alone (queue wait + uncached prefill at the pod's learned pace
        # + adapter load + KV-admission wait), the default's main term. kv-cache 1 breaks near-ties toward KV
        # headroom: the prediction sees admission, not the preemptions a full pod risks as its
        # running decodes grow. The prefix and LoRA terms are inside the prediction.
        "predicted": {"weights": {"predicted-ttft": 5, "kv-cache": 1}},
        # Offline/batch throughput: keep caches hot and leave KV headroom for big batches;
        # queues are tolerated (saturated only at 20 waiting or 95 % KV).
        "batch": {
            "weights": {"prefix-cache": 4, "kv-cache": 3, "queue": 1, "lora-affinity": 1},
            "thresholds": {"queue": 20, "kvCache": 0.95},
        },
    }
)


def resolve_profiles(
    configured: Mapping[str, Profile] | None = None, pool_wide: Thresholds = DEFAULT_THRESHOLDS
) -> dict[str, Profile]:
    """Configured profiles over the built-ins, each named and with the pool-wide thresholds
    under its own."""
    merged = {name: _validate(name, data) for name, data in BUILTIN_PROFILE_DATA.items()}
    merged.update(configured or {})
    return {name: p.resolved(name, pool_wide) for name, p in merged.items()}


def profiles_from_dict(
    data: Mapping[str, Any], pool_wide: Mapping[str, Any] | None = None
) -> dict[str, Profile]:
    """`resolve_profiles` from plain config data ({name: {weights, picker, priority,
    thresholds}}, thresholds in config spelling); raises ProfileError naming the field."""
    try:
        wide = Thresholds.model_validate(pool_wide or {})
    except ValidationError as exc:
        raise ProfileError(f"thresholds: {exc.errors()[0]['msg']}") from None
    return resolve_profiles({name: _validate(name, body) for name, body in data.items()}, wide)


BUILTIN_PROFILES: Mapping[str, Profile] = MappingProxyType(resolve_profiles())
DEFAULT = BUILTIN_PROFILES["default"]
