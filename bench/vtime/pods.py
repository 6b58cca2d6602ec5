"""The simulated pods of a virtual-time run: modelsim's own `Pod` objects on one virtual clock.

No listener is started: requests go through `Pod.admit` (the HTTP handlers' validation and
engine submit), metric pages through the pod's registry and `modelsim.metrics.render`, and the
oracle through `Pod.probe` (what /sim/probe answers). Addresses are made-up `ip:port` strings,
the form discovery gives the EPP.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from bench.probes.engine_check import VirtualClock
from modelsim.fleet import FleetSpec
from modelsim.metrics import render
from modelsim.sequence import StepPlan
from modelsim.server import Pod


def address_for(index: int) -> str:
    """The i-th pod's address: 10.x.y.z:8000 (distinct for up to 16 million pods)."""
    return f"10.{(index >> 16) & 255}.{(index >> 8) & 255}.{index & 255}:8000"


@dataclass(eq=False)
class SimPod:
    pod: Pod
    address: str
    index: int
    stepping: bool = False  # a step is planned and its end event is queued
    kv_peak: float = 0.0  # KV use (0..1, what /metrics reports) after each engine step: highest,
    kv_sum: float = 0.0  # sum and count for the mean over steps
    kv_steps: int = 0

    def note_kv(self) -> None:
        """Sample the engine's KV use after a step (per-pod KV use in the summaries)."""
        usage = self.pod.engine.kv_usage()
        self.kv_peak = max(self.kv_peak, usage)
        self.kv_sum += usage
        self.kv_steps += 1

    @property
    def name(self) -> str:
        return self.pod.name

    def page(self) -> bytes:
        """The pod's /metrics page now, byte for byte what its HTTP handler serves."""
        return render(self.pod.registry)

    def has_work(self) -> bool:
        engine = self.pod.engine
        return bool(engine.waiting or engine.running)

    def plan(self, now: float) -> tuple[StepPlan, float]:
        """The engine's next step from `now`; an empty plan waits one idle step, as its loop does."""
        plan, end = self.pod.engine.plan_step(now)
        if not plan.scheduled:
            end = now + self.pod.config.profile.t0_ms / 1000
        return plan, end

    def describe(self) -> dict[str, Any]:
        """The pod as `devstack.launch.gateway_config_for` wants it (what describe_pods asks)."""
        c = self.pod.config
        return {
            "name": c.name,
            "model": c.model,
            "adapters": list(c.adapters),
            "dialect": c.dialect,
            "address": self.address,
        }


def build_pods(fleet: dict[str, Any], clock: VirtualClock) -> list[SimPod]:
    """One modelsim Pod per pod of the scenario's fleet spec, all on `clock`."""
    spec = FleetSpec.from_dict(dict(fleet))
    return [SimPod(Pod(spec.pod_config(p), clock), address_for(i), i) for i, p in enumerate(spec.pods)]


def scaled_fleet(fleet: dict[str, Any], factor: int) -> dict[str, Any]:
    """The fleet with every entry's replicas multiplied by `factor`."""
    if factor < 1:
        raise ValueError("the pod scale must be an integer >= 1")
    pods = [{**p, "replicas": int(p.get("replicas", 1)) * factor} for p in fleet["pods"]]
    return {**fleet, "pods": pods}
