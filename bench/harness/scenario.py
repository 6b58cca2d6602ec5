"""Scenario files: one YAML = fleet + workload + arrivals + duration, validated field by field.

Errors name the offending field (`workload.groups: expected an integer >= 1, got 'x'`) so a
typo in a scenario fails before any process starts. A `quick:` block overrides any top-level
keys (deep-merged) for the short mode used in CI and on small machines.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from bench.harness.llama_fleet import ENGINE as LLAMA_ENGINE
from bench.harness.llama_fleet import LLAMA_POD_KEYS, check_llama_pod
from bench.harness.workloads import ARRIVALS, WORKLOADS, TraceRequest, generate_trace

PROFILES = (
    "h100-llama3.1-8b",
    "a10g-llama3.1-8b",
    "h100x4-llama3.1-70b",
    "h100x2-qwen3-32b",
    "a10gx4-qwen3-32b",
    "h100x8-qwen3-235b",
)
MODES = ("quick", "full")

_COMMON = {"kind": str, "model": str}
_WORKLOAD_KEYS: dict[str, dict[str, type]] = {
    "chat": {},
    "sessions": {
        "sessions": int,
        "turns": int,
        "system_tokens": int,
        "question_tokens": int,
        "answer_tokens": int,
        "staggered": bool,
        "session_header": bool,
        "shared_system": bool,
        "tool_output_fraction": float,
        "tool_output_tokens": int,
    },
    "docqa": {"documents": int, "document_tokens": int, "question_tokens": int, "output_tokens": int},
    "shared_prefix": {
        "groups": int,
        "prompts_per_group": int,
        "system_tokens": int,
        "question_tokens": int,
        "output_tokens": int,
        "zipf_s": float,
    },
    "lora": {"adapters": int, "zipf_s": float, "adapter_prefix": str},
    "long_short": {"long_fraction": float, "long_input_tokens": int, "long_output_tokens": int},
    "priority_tenants": {"critical_fraction": float, "sheddable_fraction": float, "heavy_share": float},
    "slo_mix": {"tight_fraction": float, "tight_ms": int, "loose_ms": int},
    "interactive_batch": {
        "interactive_fraction": float,
        "interactive_ms": int,
        "batch_ms": int,
        "batch_input_tokens": int,
        "batch_output_tokens": int,
        "batch_objective": str,
    },
}
_ARRIVAL_KEYS: dict[str, dict[str, type]] = {
    "poisson": {"rate": float},
    "gamma": {"rate": float, "burstiness": float},
    "bursty": {
        "rate": float,
        "spike_factor": float,
        "spike_len_s": float,
        "spike_every_s": float,
        "first_spike_s": float,
    },
}
# Passed through to modelsim's FleetSpec (max_loras, num_gpu_blocks and the step-time coefficients:
# GPU-profile overrides there; the A10G sensitivity scenarios scale the latter).
_POD_KEYS = {
    "model": str,
    "profile": str,
    "replicas": int,
    "name": str,
    "adapters": list,
    "max_loras": int,
    "num_gpu_blocks": int,
    "max_num_seqs": int,
    "max_num_batched_tokens": int,
    "max_model_len": int,
    "t0_ms": float,
    "w_ms": float,
    "k_kv_ms_per_1k": float,
    "c_p_ms_per_token": float,
    "dialect": str,
    "enable_prefix_caching": bool,
}
_TOP_KEYS = {
    "name", "description", "seed", "slo", "fleet", "workload", "arrivals", "duration_s", "quick", "loadgen",
}  # fmt: skip
_SLO_KEYS = {"ttft_s": float}
_LOADGEN_KEYS = {"concurrency": int, "timeout_s": float, "max_requests": int, "http2": bool}


class ScenarioError(ValueError):
    """A scenario file is invalid; the message starts with the dotted field path."""


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    seed: int
    # modelsim fleet spec: {time_scale, pods: [{model, profile, replicas}]}, or llama-server
    # processes: {engine: llama.cpp, pods: [{threads, replicas, ...}]} (bench/harness/llama_fleet.py)
    fleet: dict[str, Any]
    workload: dict[str, Any]
    arrivals: dict[str, Any]
    duration_s: float
    loadgen: dict[str, Any]
    mode: str
    slo_ttft_s: float | None = None  # goodput: a request is good when its TTFT is within this
    path: str = ""  # the YAML file it came from, if any

    def trace(self) -> list[TraceRequest]:
        return generate_trace(self.workload, self.arrivals, self.duration_s, self.seed)

    def with_seed(self, seed: int) -> Scenario:
        """The same scenario with another trace seed: a different trace of the same shape."""
        return dataclasses.replace(self, seed=seed)

    @property
    def models(self) -> set[str]:
        return {pod["model"] for pod in self.fleet["pods"]}


def _fail(path: str, message: str) -> ScenarioError:
    return ScenarioError(f"{path}: {message}")


def _check_value(path: str, value: Any, kind: type) -> Any:
    if kind is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise _fail(path, f"expected a number, got {value!r}")
        if value < 0:
            raise _fail(path, f"must be >= 0, got {value!r}")
        return float(value)
    if kind is int:
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise _fail(path, f"expected an integer >= 1, got {value!r}")
        return value
    if not isinstance(value, kind):
        raise _fail(path, f"expected {kind.__name__}, got {value!r}")
    return value


def _check_mapping(path: str, value: Any, allowed: Mapping[str, type]) -> dict[str, Any]:
    if not isinstance(value, Mapping):
        raise _fail(path, f"expected a mapping, got {value!r}")
    out = {}
    for key, item in value.items():
        if key not in allowed:
            raise _fail(f"{path}.{key}", f"unknown field; expected one of {', '.join(sorted(allowed))}")
        out[key] = _check_value(f"{path}.{key}", item, allowed[key])
    return out


def _require(path: str, data: Mapping[str, Any], key: str) -> Any:
    if key not in data:
        raise _fail(f"{path}.{key}" if path else key, "required field missing")
    return data[key]


def _deep_merge(base: dict[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _check_fleet(raw: Any) -> dict[str, Any]:
    if not isinstance(raw, Mapping):
        raise _fail("fleet", f"expected a mapping, got {raw!r}")
    unknown = set(raw) - {"pods", "time_scale", "engine"}
    if unknown:
        raise _fail(f"fleet.{sorted(unknown)[0]}", "unknown field; expected engine, pods, time_scale")
    pods = _require("fleet", raw, "pods")
    if not isinstance(pods, list) or not pods:
        raise _fail("fleet.pods", "expected a non-empty list")
    engine = raw.get("engine", "modelsim")
    if engine == LLAMA_ENGINE:  # real engines (bench/harness/llama_fleet.py): wall-clock time only
        llama = [
            check_llama_pod(_check_mapping(f"fleet.pods[{i}]", p, LLAMA_POD_KEYS)) for i, p in enumerate(pods)
        ]
        if raw.get("time_scale", 1.0) != 1.0:
            raise _fail("fleet.time_scale", "real engines run in wall-clock time: 1 or absent")
        return {"engine": LLAMA_ENGINE, "pods": llama, "time_scale": 1.0}
    if engine != "modelsim":
        raise _fail("fleet.engine", f"unknown {engine!r}; expected modelsim or {LLAMA_ENGINE}")
    checked = []
    for i, pod in enumerate(pods):
        path = f"fleet.pods[{i}]"
        pod = _check_mapping(path, pod, _POD_KEYS)
        for key in ("model", "profile"):
            _require(path, pod, key)
        if pod["profile"] not in PROFILES:
            raise _fail(
                f"{path}.profile", f"unknown {pod['profile']!r}; expected one of {', '.join(PROFILES)}"
            )
        pod.setdefault("replicas", 1)
        if not all(isinstance(a, str) and a for a in pod.get("adapters", [])):
            raise _fail(f"{path}.adapters", "expected a list of adapter names")
        checked.append(pod)
    time_scale = _check_value("fleet.time_scale", raw.get("time_scale", 1.0), float)
    if time_scale <= 0:
        raise _fail("fleet.time_scale", "must be > 0")
    return {"pods": checked, "time_scale": time_scale}


def parse_scenario(data: Any, mode: str = "quick", name: str = "") -> Scenario:
    """Validate a scenario dict (as loaded from YAML) and apply the `quick:` overrides in quick mode."""
    if mode not in MODES:
        raise ScenarioError(f"mode: unknown {mode!r}; expected one of {', '.join(MODES)}")
    if not isinstance(data, Mapping):
        raise ScenarioError(f"scenario: expected a mapping, got {type(data).__name__}")
    for key in data:
        if key not in _TOP_KEYS:
            raise _fail(str(key), f"unknown field; expected one of {', '.join(sorted(_TOP_KEYS))}")
    quick = data.get("quick", {})
    if not isinstance(quick, Mapping):
        raise _fail("quick", "expected a mapping of overrides")
    if "quick" in quick:
        raise _fail("quick.quick", "cannot nest")
    merged = _deep_merge({k: v for k, v in data.items() if k != "quick"}, quick if mode == "quick" else {})

    fleet = _check_fleet(_require("", merged, "fleet"))
    workload_raw = _require("", merged, "workload")
    if not isinstance(workload_raw, Mapping):
        raise _fail("workload", "expected a mapping")
    kind = _require("workload", workload_raw, "kind")
    if kind not in WORKLOADS:
        raise _fail("workload.kind", f"unknown {kind!r}; expected one of {', '.join(WORKLOADS)}")
    workload = _check_mapping("workload", workload_raw, {**_COMMON, **_WORKLOAD_KEYS[kind]})
    model = _require("workload", workload, "model")
    if kind != "lora" and model not in {p["model"] for p in fleet["pods"]}:
        raise _fail("workload.model", f"{model!r} is not served by any fleet pod")
    if kind == "lora":
        served = {a for pod in fleet["pods"] for a in pod.get("adapters", [])}
        prefix = workload.get("adapter_prefix", f"{model}-lora-")
        missing = [f"{prefix}{i:02d}" for i in range(workload.get("adapters", 12))]
        missing = [name for name in missing if name not in served]
        if missing:
            raise _fail("workload.adapters", f"adapters not served by any pod: {', '.join(missing[:3])}...")
    for key in ("long_fraction", "tight_fraction"):
        if workload.get(key, 0.0) > 1:
            raise _fail(f"workload.{key}", "must be between 0 and 1")
    for key in ("tight_ms", "loose_ms"):
        if workload.get(key, 1) > 600_000:
            raise _fail(f"workload.{key}", "must be at most 600000 (the header's bound)")

    arrivals_raw = _require("", merged, "arrivals")
    if not isinstance(arrivals_raw, Mapping):
        raise _fail("arrivals", "expected a mapping")
    pattern = arrivals_raw.get("pattern", "poisson")
    if pattern not in ARRIVALS:
        raise _fail("arrivals.pattern", f"unknown {pattern!r}; expected one of {', '.join(ARRIVALS)}")
    arrivals = _check_mapping(
        "arrivals", {k: v for k, v in arrivals_raw.items() if k != "pattern"}, _ARRIVAL_KEYS[pattern]
    )
    if _require("arrivals", arrivals, "rate") <= 0:
        raise _fail("arrivals.rate", "must be > 0")
    if arrivals.get("burstiness", 1.0) <= 0:
        raise _fail("arrivals.burstiness", "must be > 0")
    if pattern == "bursty":
        if arrivals.get("spike_factor", 8.0) < 1:
            raise _fail("arrivals.spike_factor", "must be >= 1")
        if not 0 < arrivals.get("spike_len_s", 5.0) < arrivals.get("spike_every_s", 30.0):
            raise _fail("arrivals.spike_len_s", "must be > 0 and below arrivals.spike_every_s")
    arrivals["pattern"] = pattern

    duration = _check_value("duration_s", _require("", merged, "duration_s"), float)
    if duration <= 0:
        raise _fail("duration_s", "must be > 0")
    seed = merged.get("seed", 0)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise _fail("seed", f"expected an integer, got {seed!r}")
    loadgen = _check_mapping("loadgen", merged.get("loadgen", {}), _LOADGEN_KEYS)
    slo = _check_mapping("slo", merged.get("slo", {}), _SLO_KEYS)
    if slo.get("ttft_s", 1.0) <= 0:
        raise _fail("slo.ttft_s", "must be > 0")
    return Scenario(
        name=str(merged.get("name", name)),
        description=str(merged.get("description", "")),
        seed=seed,
        fleet=fleet,
        workload=workload,
        arrivals=arrivals,
        duration_s=duration,
        loadgen=loadgen,
        mode=mode,
        slo_ttft_s=slo.get("ttft_s"),
    )


def load_scenario(path: str | Path, mode: str = "quick") -> Scenario:
    """Read and validate a scenario YAML file; the name defaults to the file stem."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ScenarioError(f"{path}: cannot read ({exc.strerror or exc})") from exc
    except yaml.YAMLError as exc:
        raise ScenarioError(f"{path}: invalid YAML ({exc})") from exc
    try:
        return dataclasses.replace(parse_scenario(data, mode, name=path.stem), path=str(path))
    except ScenarioError as exc:
        raise ScenarioError(f"{path.name}: {exc}") from exc
