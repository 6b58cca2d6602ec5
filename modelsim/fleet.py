"""A fleet of simulated pods served from one asyncio process, described by a ``FleetSpec``.

>>> spec = FleetSpec.from_dict({"time_scale": 1.0, "pods": [{"name": "llama-0", "model": "llama"}]})
>>> async with run_fleet(spec) as fleet:  # doctest: +SKIP
...     fleet.pod("llama-0").address
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from modelsim.clock import SimClock
from modelsim.engine import Engine
from modelsim.kv_events import KVEventsConfig, KVEventsConfigError
from modelsim.metrics import DIALECTS
from modelsim.pd import ROLES
from modelsim.profiles import GpuProfile, ProfileError, builtin_profiles, load_profiles_file, parse_profiles
from modelsim.server import Faults, Pod, PodConfig
from modelsim.tokenizer import HFTokenizer, TokenizerFileError

DEFAULT_PROFILE = "h100-llama3.1-8b"
_PROFILE_FIELDS = {f.name for f in dataclasses.fields(GpuProfile)} - {"name", "source"}
_POD_KEYS = {
    "name",
    "model",
    "adapters",
    "profile",
    "dialect",
    "port",
    "replicas",
    "seed",
    "enable_prefix_caching",
    "kv_events",
    "tokenizer",
    "role",
    "data_parallel_size",
}


class SpecError(ValueError):
    """The fleet description is invalid."""


@dataclass(frozen=True)
class PodSpec:
    """One pod (after replica expansion). ``overrides`` replace profile fields for this pod."""

    name: str
    model: str
    adapters: tuple[str, ...] = ()
    profile: str = DEFAULT_PROFILE
    dialect: str = "vllm"
    port: int = 0
    seed: int = 0
    enable_prefix_caching: bool = True
    overrides: dict[str, Any] = field(default_factory=dict)
    kv_events: KVEventsConfig | None = None  # vLLM's --kv-events-config (replica r: ports + r)
    tokenizer: HFTokenizer | None = None  # the model's tokenizer files (None: approximate ids)
    role: str = "both"  # disaggregated serving: prefill, decode or both (modelsim/pd.py)
    data_parallel_size: int = 1  # vLLM's --data-parallel-size: engines behind one API server


@dataclass(frozen=True)
class FleetSpec:
    pods: tuple[PodSpec, ...]
    time_scale: float = 1.0
    profiles: dict[str, GpuProfile] = field(default_factory=builtin_profiles)

    @classmethod
    def from_dict(cls, data: dict[str, Any], base_dir: Path | None = None) -> FleetSpec:
        """Validate a fleet description; ``replicas: N`` expands to pods ``<name>-0..N-1``."""
        if not isinstance(data, dict):
            raise SpecError("fleet spec must be a mapping")
        unknown = set(data) - {"time_scale", "pods", "profiles", "profiles_file"}
        if unknown:
            raise SpecError(f"unknown fleet fields {sorted(unknown)}")
        time_scale = data.get("time_scale", 1.0)
        if isinstance(time_scale, bool) or not isinstance(time_scale, int | float) or time_scale <= 0:
            raise SpecError("time_scale must be a number > 0")
        try:
            profiles = builtin_profiles()
            if "profiles_file" in data:
                path = Path(data["profiles_file"])
                profiles = load_profiles_file(
                    path if path.is_absolute() or base_dir is None else base_dir / path, profiles
                )
            if "profiles" in data:
                profiles = parse_profiles(data["profiles"], profiles)
        except (ProfileError, OSError) as exc:
            raise SpecError(str(exc)) from None
        raw_pods = data.get("pods")
        if not isinstance(raw_pods, list) or not raw_pods:
            raise SpecError("'pods' must be a non-empty list")
        pods: list[PodSpec] = []
        for i, raw in enumerate(raw_pods):
            pods.extend(_expand(raw, i, profiles, base_dir))
        names = [p.name for p in pods]
        dupes = {n for n in names if names.count(n) > 1}
        if dupes:
            raise SpecError(f"duplicate pod names {sorted(dupes)}")
        return cls(pods=tuple(pods), time_scale=float(time_scale), profiles=profiles)

    @classmethod
    def from_yaml(cls, path: str | Path) -> FleetSpec:
        path = Path(path)
        try:
            data = yaml.safe_load(path.read_text())
        except (OSError, yaml.YAMLError) as exc:
            raise SpecError(f"cannot read fleet spec {path}: {exc}") from None
        return cls.from_dict(data, base_dir=path.parent)

    def pod_config(self, pod: PodSpec) -> PodConfig:
        try:
            profile = self.profiles[pod.profile].with_overrides(**pod.overrides)
        except ProfileError as exc:
            raise SpecError(f"pod {pod.name!r}: {exc}") from None
        return PodConfig(
            name=pod.name,
            model=pod.model,
            profile=profile,
            adapters=pod.adapters,
            dialect=pod.dialect,
            seed=pod.seed,
            enable_prefix_caching=pod.enable_prefix_caching,
            kv_events=pod.kv_events,
            tokenizer=pod.tokenizer,
            role=pod.role,
            data_parallel_size=pod.data_parallel_size,
        )


def _tokenizer(raw: Any, where: str, base_dir: Path | None) -> HFTokenizer | None:
    """A folder (relative to the spec's directory) or a shipped name (modelsim/tokenizer_files)."""
    if raw is None:
        return None
    if not isinstance(raw, str) or not raw:
        raise SpecError(f"{where}: 'tokenizer' must be a folder path or a shipped tokenizer's name")
    path = Path(raw)
    if not path.is_absolute() and base_dir is not None and (base_dir / path).is_dir():
        path = base_dir / path
    try:
        return HFTokenizer(path)
    except TokenizerFileError as exc:
        raise SpecError(f"{where}: {exc}") from None


def _expand(
    raw: Any, index: int, profiles: dict[str, GpuProfile], base_dir: Path | None = None
) -> list[PodSpec]:
    where = f"pods[{index}]"
    if not isinstance(raw, dict):
        raise SpecError(f"{where} must be a mapping")
    unknown = set(raw) - _POD_KEYS - _PROFILE_FIELDS
    if unknown:
        raise SpecError(f"{where}: unknown fields {sorted(unknown)}")
    model = raw.get("model")
    if not isinstance(model, str) or not model:
        raise SpecError(f"{where}: 'model' must be a non-empty string")
    name = raw.get("name", f"{model}-{index}")
    adapters = raw.get("adapters", [])
    if not isinstance(adapters, list) or not all(isinstance(a, str) and a for a in adapters):
        raise SpecError(f"{where}: 'adapters' must be a list of names")
    profile = raw.get("profile", DEFAULT_PROFILE)
    if profile not in profiles:
        raise SpecError(f"{where}: unknown profile {profile!r}; known: {sorted(profiles)}")
    dialect = raw.get("dialect", "vllm")
    if dialect not in DIALECTS:
        raise SpecError(f"{where}: unknown dialect {dialect!r}; known: {list(DIALECTS)}")
    port, replicas, seed = raw.get("port", 0), raw.get("replicas", 1), raw.get("seed", index)
    for key, value, lo in (("port", port, 0), ("replicas", replicas, 1), ("seed", seed, 0)):
        if (
            isinstance(value, bool)
            or not isinstance(value, int)
            or value < lo
            or (key == "port" and value > 65535)
        ):
            raise SpecError(f"{where}: '{key}' must be an integer >= {lo}")
    overrides = {k: v for k, v in raw.items() if k in _PROFILE_FIELDS}
    try:
        profiles[profile].with_overrides(**overrides)
    except (ProfileError, TypeError) as exc:
        raise SpecError(f"{where}: {exc}") from None
    try:
        kv_events = KVEventsConfig.parse(raw.get("kv_events"))
    except KVEventsConfigError as exc:
        raise SpecError(f"{where}: {exc}") from None
    tokenizer = _tokenizer(raw.get("tokenizer"), where, base_dir)
    dp = raw.get("data_parallel_size", 1)
    if isinstance(dp, bool) or not isinstance(dp, int) or not 1 <= dp <= 64:
        raise SpecError(f"{where}: 'data_parallel_size' must be an integer in [1, 64]")
    role = raw.get("role", "both")
    if role not in ROLES:
        raise SpecError(f"{where}: unknown role {role!r}; known: {list(ROLES)}")
    out = []
    for r in range(replicas):
        out.append(
            PodSpec(
                name=str(name) if replicas == 1 else f"{name}-{r}",
                model=model,
                adapters=tuple(adapters),
                profile=profile,
                dialect=dialect,
                port=port + r if port else 0,
                seed=seed * 1000 + r,
                enable_prefix_caching=bool(raw.get("enable_prefix_caching", True)),
                overrides=overrides,
                kv_events=kv_events.offset(r * dp) if kv_events else None,  # rank k: + k
                tokenizer=tokenizer,
                role=role,
                data_parallel_size=dp,
            )
        )
    return out


class PodHandle:
    """What tests and launchers hold for one running pod."""

    def __init__(self, pod: Pod) -> None:
        self._pod = pod

    name = property(lambda self: self._pod.name)
    model = property(lambda self: self._pod.config.model)
    adapters = property(lambda self: self._pod.config.adapters)
    dialect = property(lambda self: self._pod.config.dialect)
    host = property(lambda self: self._pod.host)
    port = property(lambda self: self._pod.port)
    address = property(lambda self: self._pod.address)
    profile = property(lambda self: self._pod.config.profile)

    @property
    def url(self) -> str:
        return f"http://{self.address}"

    @property
    def engine(self) -> Engine:
        return self._pod.engine

    @property
    def faults(self) -> Faults:
        return self._pod.faults

    def set_fault(
        self,
        error_rate: float | None = None,
        stall_s: float | None = None,
        refuse: bool | None = None,
        crash: bool | None = None,
    ) -> Awaitable[Faults]:
        """Change fault knobs now; awaiting the result is optional (it waits for a re-listen)."""
        if error_rate is not None and not 0.0 <= error_rate <= 1.0:
            raise ValueError("error_rate must be within [0, 1]")
        if stall_s is not None and stall_s < 0:
            raise ValueError("stall_s must be >= 0")
        if crash:
            self._pod.crash_now()
        if refuse and not self._pod.faults.crashed:
            self._pod.faults.refuse = True
            self._pod._close_listener()
        return asyncio.ensure_future(self._pod.set_fault(error_rate, stall_s, refuse, crash))

    @property
    def kv_events_port(self) -> int | None:
        """Bound KV-event PUB port (None when events are off)."""
        pub = self._pod.kv_publisher
        return pub.port if pub else None

    @property
    def kv_replay_port(self) -> int | None:
        pub = self._pod.kv_publisher
        return pub.replay_port or None if pub else None

    def crash(self) -> Awaitable[None]:
        """Kill the pod: listener closed and connections aborted before this returns."""
        self._pod.crash_now()
        return asyncio.ensure_future(self._pod.engine.stop())

    def restart(self) -> Awaitable[None]:
        """Bring a crashed pod back on the same port with an empty engine."""
        return asyncio.ensure_future(self._pod.restart())

    def probe(self, prompt_ids: list[int], adapter: str | None = None) -> dict[str, Any]:
        return self._pod.probe(prompt_ids, adapter)

    def info(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "model": self.model,
            "adapters": list(self.adapters),
            "dialect": self.dialect,
            "address": self.address,
            "role": self._pod.config.role,
            "data_parallel_size": self._pod.config.data_parallel_size,
            **(
                {"kv_events_port": self.kv_events_port, "kv_replay_port": self.kv_replay_port}
                if self.kv_events_port
                else {}
            ),
        }


class Fleet:
    def __init__(self, spec: FleetSpec, clock: SimClock, pods: list[Pod]) -> None:
        self.spec = spec
        self.clock = clock
        self.pods = [PodHandle(p) for p in pods]
        self._by_name = {h.name: h for h in self.pods}

    @property
    def time_scale(self) -> float:
        return self.clock.time_scale

    def pod(self, name: str) -> PodHandle:
        try:
            return self._by_name[name]
        except KeyError:
            raise KeyError(f"no pod named {name!r}; pods: {sorted(self._by_name)}") from None

    def ready_info(self) -> dict[str, Any]:
        return {"pods": [h.info() for h in self.pods]}


@contextlib.asynccontextmanager
async def run_fleet(spec: FleetSpec, host: str = "127.0.0.1") -> AsyncIterator[Fleet]:
    """Start every pod of ``spec`` on ``host`` and stop them all on exit."""
    clock = SimClock(spec.time_scale)
    pods = [Pod(spec.pod_config(p), clock) for p in spec.pods]
    for pod in pods:
        pod.fleet = pods
    started: list[Pod] = []
    try:
        for pod, ps in zip(pods, spec.pods, strict=True):
            await pod.start(host, ps.port)
            started.append(pod)
        yield Fleet(spec, clock, pods)
    finally:
        await asyncio.gather(*(p.stop() for p in started), return_exceptions=True)
