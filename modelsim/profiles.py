"""Named GPU profiles: the step-time model and engine limits of one simulated model server.

The step time follows the roofline form of the calibration reference:
``step_ms = T0 + max(W + k_kv * decode_context_tokens / 1000, c_p * (P_uncached + D))``
(memory-bound weight and KV reads vs compute-bound token work, plus fixed overhead), times
``lora_step_factor`` when the batch runs an adapter.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml


class ProfileError(ValueError):
    """A profile is unknown or malformed."""


@dataclass(frozen=True, slots=True)
class GpuProfile:
    name: str
    t0_ms: float
    w_ms: float
    k_kv_ms_per_1k: float
    c_p_ms_per_token: float
    num_gpu_blocks: int
    block_size: int = 16
    max_num_batched_tokens: int = 8192
    max_num_seqs: int = 1024
    max_model_len: int = 131072
    vocab_size: int = 128256
    max_loras: int = 4
    max_cpu_loras: int = 8
    lora_step_factor: float = 1.2
    lora_load_cpu_ms: float = 10.0
    lora_load_disk_ms: float = 500.0
    # KV transfer between a prefill and a decode pod (vLLM's NIXL connector): a prompt's KV
    # takes kv_bytes_per_token x tokens / link bandwidth + a fixed latency (see profiles.yaml).
    kv_bytes_per_token: int = 131072
    kv_link_gbytes_s: float = 50.0
    kv_transfer_latency_ms: float = 1.0
    source: str = ""

    def __post_init__(self) -> None:
        for f in ("num_gpu_blocks", "block_size", "max_num_batched_tokens", "max_num_seqs", "max_model_len"):
            if getattr(self, f) <= 0:
                raise ProfileError(f"profile {self.name!r}: {f} must be positive")
        if self.max_loras < 0 or self.max_cpu_loras < self.max_loras:
            raise ProfileError(f"profile {self.name!r}: need 0 <= max_loras <= max_cpu_loras")
        if self.kv_bytes_per_token <= 0 or self.kv_link_gbytes_s <= 0:
            raise ProfileError(
                f"profile {self.name!r}: kv_bytes_per_token and kv_link_gbytes_s must be positive"
            )
        for f in ("t0_ms", "w_ms", "k_kv_ms_per_1k", "c_p_ms_per_token", "kv_transfer_latency_ms"):
            if getattr(self, f) < 0:
                raise ProfileError(f"profile {self.name!r}: {f} must be >= 0")

    def step_ms(
        self, prefill_tokens: int, decode_tokens: int, decode_context_tokens: int, lora: bool
    ) -> float:
        """Duration of one engine step in simulated milliseconds (roofline form, see module doc)."""
        memory = self.w_ms + self.k_kv_ms_per_1k * decode_context_tokens / 1000.0
        compute = self.c_p_ms_per_token * (prefill_tokens + decode_tokens)
        ms = self.t0_ms + max(memory, compute)
        return ms * self.lora_step_factor if lora else ms

    def kv_transfer_s(self, tokens: int) -> float:
        """Simulated seconds to move ``tokens`` tokens of KV cache to another pod."""
        seconds = tokens * self.kv_bytes_per_token / (self.kv_link_gbytes_s * 1e9)
        return seconds + self.kv_transfer_latency_ms / 1000.0

    def with_overrides(self, **overrides: Any) -> GpuProfile:
        return _build(self.name, {**dataclasses.asdict(self), **overrides})


_FIELDS = {f.name for f in dataclasses.fields(GpuProfile)}


def _build(name: str, raw: dict[str, Any]) -> GpuProfile:
    unknown = set(raw) - _FIELDS - {"base"}
    if unknown:
        raise ProfileError(f"profile {name!r}: unknown fields {sorted(unknown)}")
    values = {k: v for k, v in raw.items() if k != "base"}
    values["name"] = name
    try:
        return GpuProfile(**values)
    except TypeError as exc:
        raise ProfileError(f"profile {name!r}: {exc}") from None


def parse_profiles(
    section: dict[str, Any], known: dict[str, GpuProfile] | None = None
) -> dict[str, GpuProfile]:
    """Parse a ``profiles:`` mapping; an entry may say ``base: <name>`` to inherit and override."""
    if not isinstance(section, dict):
        raise ProfileError("profiles must be a mapping of name -> fields")
    out: dict[str, GpuProfile] = dict(known or {})
    for name, raw in section.items():
        if not isinstance(raw, dict):
            raise ProfileError(f"profile {name!r} must be a mapping")
        base = raw.get("base")
        if base is not None:
            if base not in out:
                raise ProfileError(f"profile {name!r}: unknown base {base!r}")
            merged = {**dataclasses.asdict(out[base]), "source": "", **raw}
            merged.pop("name", None)
            out[name] = _build(name, merged)
        else:
            out[name] = _build(name, raw)
    return out


def builtin_profiles() -> dict[str, GpuProfile]:
    text = (Path(__file__).parent / "profiles.yaml").read_text()
    return parse_profiles(yaml.safe_load(text)["profiles"])


def load_profiles_file(path: str | Path, known: dict[str, GpuProfile] | None = None) -> dict[str, GpuProfile]:
    data = yaml.safe_load(Path(path).read_text()) or {}
    return parse_profiles(data.get("profiles", data), known)


def get_profile(name: str, extra: dict[str, GpuProfile] | None = None) -> GpuProfile:
    table = {**builtin_profiles(), **(extra or {})}
    try:
        return table[name]
    except KeyError:
        raise ProfileError(f"unknown profile {name!r}; known: {sorted(table)}") from None
