"""Policy targets: what the load generator points at for one routing policy.

A target is a base URL plus async start/stop callables. Factories are registered by name;
the peer routers are built in, and other modules (Envoy round-robin, least-request, EPP
profiles, the oracle) register theirs with `register_policy` in a module listed in
`PLUGIN_MODULES` or passed with `python -m bench run --policy-module`.
"""

from __future__ import annotations

import importlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.harness.fleet import FleetNeeds
from bench.harness.peers import PEER_POLICIES, RunningPeer, start_peer

# Optional modules that register more policies when they exist (others own them).
PLUGIN_MODULES = ("bench.harness.gateway_policies",)


@dataclass
class TargetContext:
    worker_urls: list[str]  # the fleet's pod base URLs
    work_dir: Path  # scratch space for logs and rendered configs
    scenario: Any = None  # bench.harness.scenario.Scenario (fleet, workload, ...)
    options: dict[str, str] = field(default_factory=dict)  # --target-opt key=value
    # The harness's fleet as its ready file lists the pods (address, kv_events_port, ...);
    # empty with --worker-urls.
    fleet_pods: list[dict[str, Any]] = field(default_factory=list)
    fleet_needs: FleetNeeds = field(default_factory=FleetNeeds)  # what the fleet was started with


@dataclass
class PolicyTarget:
    name: str
    start: Callable[[], Awaitable[str]]  # brings the router up; returns the base URL to load
    stop: Callable[[], Awaitable[None]]
    # What exactly ran (filled by start): weights and profile, router argv, LB policy... The
    # run summary records it, so a table row names its full configuration.
    config: dict[str, Any] = field(default_factory=dict)
    # The running router object once started (e.g. devstack's LocalGateway), for diagnostics
    # such as bench/probes/flow_probe.py; None for routers started elsewhere.
    handle: Any = None


PolicyFactory = Callable[[TargetContext], PolicyTarget]
POLICIES: dict[str, PolicyFactory] = {}
# What a policy needs of the simulated fleet (KV events, the shipped tokenizer); absent: nothing.
FLEET_NEEDS: dict[str, FleetNeeds] = {}


def register_policy(name: str, factory: PolicyFactory, needs: FleetNeeds | None = None) -> None:
    POLICIES[name] = factory
    if needs is not None:
        FLEET_NEEDS[name] = needs


def fleet_needs(policies: list[str]) -> FleetNeeds:
    """What the fleet of a run of these policies must provide: the union of their needs."""
    return FleetNeeds.union(FLEET_NEEDS.get(p, FleetNeeds()) for p in policies)


def make_target(name: str, ctx: TargetContext) -> PolicyTarget:
    if name not in POLICIES:
        raise KeyError(f"unknown policy {name!r}; known: {', '.join(sorted(POLICIES))}")
    return POLICIES[name](ctx)


def load_plugins(extra: tuple[str, ...] = ()) -> None:
    """Import policy modules; the optional defaults may be absent, explicit ones must exist."""
    for module in PLUGIN_MODULES:
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name != module:
                raise
    for module in extra:
        importlib.import_module(module)


def peer_factory(kind: str, policy: str) -> PolicyFactory:
    def factory(ctx: TargetContext) -> PolicyTarget:
        running: list[RunningPeer] = []

        async def start() -> str:
            peer = await start_peer(kind, policy, ctx.worker_urls, log_dir=ctx.work_dir)
            running.append(peer)
            target.config.update(
                kind="peer-router",
                router=f"{kind}-router",
                policy=policy,
                argv=["python", *peer.command[1:]],  # the interpreter path is machine-specific
            )
            return peer.base_url

        async def stop() -> None:
            while running:
                await running.pop().stop()

        target = PolicyTarget(f"{kind}-{policy}", start, stop)
        return target

    return factory


def url_factory(ctx: TargetContext) -> PolicyTarget:
    """An already running router at `--target-opt url=...` (nothing to start or stop)."""
    if "url" not in ctx.options:
        raise KeyError("policy 'url' needs --target-opt url=http://host:port")

    async def start() -> str:
        return ctx.options["url"]

    async def stop() -> None:
        return None

    return PolicyTarget("url", start, stop, {"kind": "url", "url": ctx.options["url"]})


for _kind, _policies in PEER_POLICIES.items():
    for _policy in _policies:
        register_policy(f"{_kind}-{_policy}", peer_factory(_kind, _policy))
register_policy("url", url_factory)
