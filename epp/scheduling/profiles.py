"""Scheduling profiles: named weight sets plus a picker kind and thresholds, as plain data.

A profile is all a configuration file needs to define a policy: `Profile.from_dict` checks
every field and names the offending one in its error. Weight names accept the AWS-style
camelCase spellings (`kvCache`, `loraAffinity`, ...) as aliases of the canonical ones.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from types import MappingProxyType
from typing import Any

SCORER_NAMES = (
    "queue",
    "kv-cache",
    "prefix-cache",
    "lora-affinity",
    "running-requests",
    "inflight",
    "observed-speed",
    "queue-speed",
    "session-affinity",
)
SCORER_ALIASES = {
    "kvCache": "kv-cache",
    "kv_cache": "kv-cache",
    "prefix": "prefix-cache",
    "prefixCache": "prefix-cache",
    "loraAffinity": "lora-affinity",
    "lora": "lora-affinity",
    "runningRequests": "running-requests",
    "running": "running-requests",
    "inFlight": "inflight",
    "observedSpeed": "observed-speed",
    "speed": "observed-speed",
    "queueSpeed": "queue-speed",
    "sessionAffinity": "session-affinity",
}
# Totals are sums of weight x [0, 1]; bounding weights keeps them (and the picker's tie
# quantisation, total / 1e-9) finite.
MAX_WEIGHT = 1e6
PICKERS = ("max", "weighted-random")
PICKER_ALIASES = {"weighted": "weighted-random", "random": "weighted-random"}
# Config spellings (gateway/config.py, AWS-style camelCase) of the threshold fields.
THRESHOLD_ALIASES = {
    "queue": "queue_saturated",
    "queueSaturated": "queue_saturated",
    "kvCache": "kv_saturated",
    "kv_cache": "kv_saturated",
    "kvSaturated": "kv_saturated",
    "staleAfter": "stale_after",
    "prefixMinBlocks": "prefix_min_blocks",
}
MS_THRESHOLDS = {"staleAfterMs": "stale_after", "stale_after_ms": "stale_after"}


class ProfileError(ValueError):
    """A profile definition is invalid; the message starts with the offending field's path."""


@dataclass(frozen=True, slots=True)
class Thresholds:
    """Filter and scorer knobs. Defaults are GIE's published ones (stale_after is ours)."""

    queue_saturated: float = 5.0  # a pod is saturated at this many waiting requests
    kv_saturated: float = 0.8  # ... or at this KV-cache usage
    stale_after: float = 1.0  # seconds; older metrics are distrusted by the stale filter
    prefix_min_blocks: int = 16  # prefix score = matched / max(total, this): tiny prompts score tiny

    def validate(self, where: str) -> None:
        if not self.queue_saturated > 0:
            raise ProfileError(f"{where}.queue_saturated: must be > 0, got {self.queue_saturated}")
        if not 0 < self.kv_saturated <= 1:
            raise ProfileError(f"{where}.kv_saturated: must be in (0, 1], got {self.kv_saturated}")
        if not self.stale_after > 0:
            raise ProfileError(f"{where}.stale_after: must be > 0, got {self.stale_after}")
        if self.prefix_min_blocks < 1:
            raise ProfileError(f"{where}.prefix_min_blocks: must be >= 1, got {self.prefix_min_blocks}")


DEFAULT_THRESHOLDS = Thresholds()


@dataclass(frozen=True, slots=True)
class Profile:
    name: str
    weights: Mapping[str, float]
    picker: str = "max"
    thresholds: Thresholds = field(default_factory=Thresholds)
    priority: int = 0  # carried for admission (negative = sheddable); scheduling ignores it

    def __post_init__(self) -> None:
        where = f"profiles.{self.name}"
        if not self.name or not isinstance(self.name, str):
            raise ProfileError("profiles.<name>: a profile needs a non-empty string name")
        weights: dict[str, float] = {}
        for raw_key, raw_value in self.weights.items():
            key = SCORER_ALIASES.get(raw_key, raw_key)
            if key not in SCORER_NAMES:
                known = ", ".join(SCORER_NAMES)
                raise ProfileError(f"{where}.weights.{raw_key}: unknown scorer (known: {known})")
            if isinstance(raw_value, bool) or not isinstance(raw_value, int | float):
                raise ProfileError(f"{where}.weights.{raw_key}: must be a number, got {raw_value!r}")
            if not math.isfinite(raw_value) or not 0 <= raw_value <= MAX_WEIGHT:
                raise ProfileError(
                    f"{where}.weights.{raw_key}: must be in [0, {MAX_WEIGHT:g}], got {raw_value}"
                )
            if key in weights:
                raise ProfileError(f"{where}.weights.{raw_key}: duplicates {key}")
            weights[key] = float(raw_value)
        if not any(w > 0 for w in weights.values()):
            raise ProfileError(f"{where}.weights: at least one weight must be > 0")
        object.__setattr__(self, "picker", PICKER_ALIASES.get(self.picker, self.picker))
        if self.picker not in PICKERS:
            raise ProfileError(f"{where}.picker: must be one of {', '.join(PICKERS)}, got {self.picker!r}")
        self.thresholds.validate(f"{where}.thresholds")
        object.__setattr__(self, "weights", MappingProxyType(weights))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, name: str | None = None) -> Profile:
        """Build from config data: {name, weights: {...}, picker, thresholds: {...}}."""
        if not isinstance(data, Mapping):
            raise ProfileError(f"profiles.{name or '<name>'}: must be a mapping, got {type(data).__name__}")
        pname = data.get("name", name)
        if not isinstance(pname, str) or not pname:
            raise ProfileError("profiles.<name>.name: must be a non-empty string")
        where = f"profiles.{pname}"
        unknown = set(data) - {"name", "weights", "picker", "thresholds", "priority"}
        if unknown:
            raise ProfileError(f"{where}.{sorted(unknown)[0]}: unknown field")
        weights = data.get("weights")
        if not isinstance(weights, Mapping):
            raise ProfileError(f"{where}.weights: must be a mapping of scorer name to weight")
        picker = data.get("picker", "max")
        if not isinstance(picker, str):
            raise ProfileError(f"{where}.picker: must be a string")
        priority = data.get("priority", 0)
        if isinstance(priority, bool) or not isinstance(priority, int):
            raise ProfileError(f"{where}.priority: must be an integer, got {priority!r}")
        return cls(
            name=pname,
            weights=weights,
            picker=picker,
            priority=priority,
            thresholds=_thresholds_from(data.get("thresholds", {}), f"{where}.thresholds"),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "weights": dict(self.weights),
            "picker": self.picker,
            "priority": self.priority,
            "thresholds": {f.name: getattr(self.thresholds, f.name) for f in fields(Thresholds)},
        }


def _thresholds_from(data: Any, where: str) -> Thresholds:
    if not isinstance(data, Mapping):
        raise ProfileError(f"{where}: must be a mapping")
    known = {f.name: f.type for f in fields(Thresholds)}
    values: dict[str, Any] = {}
    for raw_key, value in data.items():
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise ProfileError(f"{where}.{raw_key}: must be a finite number, got {value!r}")
        if raw_key in MS_THRESHOLDS:
            key, value = MS_THRESHOLDS[raw_key], value / 1000.0
        else:
            key = THRESHOLD_ALIASES.get(raw_key, raw_key)
        if key not in known:
            raise ProfileError(f"{where}.{raw_key}: unknown field (known: {', '.join(known)})")
        if key in values:
            raise ProfileError(f"{where}.{raw_key}: duplicates {key}")
        if key == "prefix_min_blocks":
            if value != int(value):
                raise ProfileError(f"{where}.{key}: must be an integer, got {value!r}")
            value = int(value)
        values[key] = value
    thresholds = Thresholds(**values)
    thresholds.validate(where)
    return thresholds


# Built-ins as plain data, the same shape a config file uses.
BUILTIN_PROFILE_DATA: Mapping[str, Mapping[str, Any]] = MappingProxyType(
    {
        # GIE's and AWS's published defaults, so results compare with theirs.
        "default": {"weights": {"queue": 2, "kv-cache": 2, "prefix-cache": 3}},
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
        # Offline/batch throughput: keep caches hot and leave KV headroom for big batches;
        # queues are tolerated (saturated only at 20 waiting or 95 % KV).
        "batch": {
            "weights": {"prefix-cache": 4, "kv-cache": 3, "queue": 1, "lora-affinity": 1},
            "thresholds": {"queue_saturated": 20, "kv_saturated": 0.95},
        },
    }
)


def profiles_from_dict(
    data: Mapping[str, Any] | None = None,
    *,
    thresholds: Mapping[str, Any] | None = None,
    include_builtins: bool = True,
) -> dict[str, Profile]:
    """Profiles from config data ({name: {weights, picker, priority, thresholds}}) overlaid
    on the built-ins. `thresholds` are pool-wide defaults (config spellings accepted, e.g.
    `{"queue": 5, "kvCache": 0.8, "staleAfterMs": 1000}`); a profile's own thresholds win.
    """
    data = {} if data is None else data
    if not isinstance(data, Mapping):
        raise ProfileError("profiles: must be a mapping of profile name to profile")
    if thresholds is not None and not isinstance(thresholds, Mapping):
        raise ProfileError("thresholds: must be a mapping")
    sources: dict[str, Any] = dict(BUILTIN_PROFILE_DATA) if include_builtins else {}
    for pname, body in data.items():
        if not isinstance(pname, str) or not pname:
            raise ProfileError("profiles: profile names must be non-empty strings")
        if isinstance(body, Mapping) and "name" in body and body["name"] != pname:
            raise ProfileError(f"profiles.{pname}.name: differs from its key {pname!r}")
        sources[pname] = body
    merged: dict[str, Profile] = {}
    for pname, body in sources.items():
        if isinstance(body, Mapping) and thresholds:
            own = body.get("thresholds", {})
            if not isinstance(own, Mapping):
                raise ProfileError(f"profiles.{pname}.thresholds: must be a mapping")
            body = {**body, "thresholds": _merge_thresholds(thresholds, own)}
        merged[pname] = Profile.from_dict(body, name=pname)
    return merged


def _merge_thresholds(pool_wide: Mapping[str, Any], own: Mapping[str, Any]) -> dict[str, Any]:
    """Pool-wide defaults under a profile's own values, compared by canonical field name."""

    def canonical(key: str) -> str:
        return MS_THRESHOLDS.get(key) or THRESHOLD_ALIASES.get(key, key)

    own_fields = {canonical(k) for k in own}
    return {**{k: v for k, v in pool_wide.items() if canonical(k) not in own_fields}, **own}


BUILTIN_PROFILES: Mapping[str, Profile] = MappingProxyType(profiles_from_dict())
DEFAULT = BUILTIN_PROFILES["default"]
CHAT = BUILTIN_PROFILES["chat"]
BATCH = BUILTIN_PROFILES["batch"]
