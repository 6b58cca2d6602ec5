"""`python -m bench sim`: scenarios x policies x seeds in virtual time, summarised like `bench run`.

    python -m bench sim --scenario bench/scenarios/uniform.yaml --policy round-robin \\
        --policy epp-default --policy oracle [--seeds reporting|tuning|N] [--seed N ...] \\
        [--pods-scale K] [--duration-s S] [--gateway-ms MS] [--as-recorded bench/summaries] \\
        [--ttft-only] [--first-spike-s S] [--router-seed N] [--policy-module M] \\
        [--replicas N] [--store-rtt-ms MS] [--workers N]

Summaries go to bench/summaries-virtual/<mode>/<scenario>/<policy>/seed-<n>.json (the schema
of bench/harness/summary.py, `run.virtual: true`); a scaled run's scenario is named
`<scenario>@<pods>pods`. `--as-recorded ROOT`: an `epp-*` policy runs with the profile and
scrape settings its real-time summary (same scenario, policy, seed under ROOT) recorded, as
the agreement table needs (bench/vtime/report.py). `--replicas N` (any `epp-*` policy): N EPP
replicas sharing state through the virtual store (bench/vtime/shared_store.py, round trip
`--store-rtt-ms`), summaries under `<policy>-<N>replicas` in bench/summaries-virtual-replicas
(any run naming `--replicas`, 1 included: that campaign's one-EPP rows stay out of the
routing-alone tables). `--workers N`: every request takes
the multi-core EPP's path (parsed by one of N ext_proc workers, the record through the IPC
frame, `on_prepared` in the deciding process), summaries under `<label>-<N>workers`: its
decisions must equal the one-process run's (tests/bench/test_vtime_workers.py).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import statistics
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from bench.harness.gateway_policies import BEST_PROFILE, epp_config
from bench.harness.scenario import MODES, Scenario, ScenarioError, load_scenario
from bench.harness.summary import build_summary, environment, machine_state, summary_path, write_summary
from bench.probes.engine_check import VirtualClock
from bench.vtime.epp import DEFAULT_SCRAPE_AGE_S, VirtualEpp
from bench.vtime.loop import Events, LoopStats, Router, simulate
from bench.vtime.pods import build_pods, scaled_fleet
from bench.vtime.routers import Oracle, RoundRobin
from bench.vtime.shared_store import DEFAULT_RTT_MS
from gateway.profiles import BUILTIN_PROFILE_DATA

VIRTUAL_SUMMARIES = Path("bench/summaries-virtual")
# Runs that name a replica count (`--replicas N`, 1 included): the replicas-vs-one-EPP campaign,
# kept apart so its one-EPP rows never stand in for the routing-alone rows of the tables above.
REPLICA_SUMMARIES = Path("bench/summaries-virtual-replicas")
# The gateway's own latency per policy when --gateway-ms is not given, wall ms: "added p50" of
# docs/benchmarks/costs.md "Gateway overhead" (concurrency 1, 1 KB): Envoy round-robin +1.90,
# the full gateway (Envoy + BBR + EPP; the oracle sits where the EPP does) +7.12.
GATEWAY_MS = {"round-robin": 1.90, "oracle": 7.12, "epp": 7.12}
SCALED_WORKLOAD_KEYS = ("sessions", "groups")  # bench/harness/workloads.py: concurrent units of a trace
POLICIES = ("round-robin", "oracle", "epp-default", "epp-gie", "epp-predicted", "epp-best")


def load_policy_modules(names: list[str]) -> dict[str, dict[str, Any]]:
    """The EPP policies the `--policy-module`s define for virtual time: each module's
    `VIRTUAL_POLICIES`, name -> the gateway config keys its real-time target adds to the
    default profile's (bench/harness/flow_policies.py). ImportError for a module that is not there."""
    policies: dict[str, dict[str, Any]] = {}
    for name in names:
        module = importlib.import_module(name)
        policies.update({k: dict(v) for k, v in getattr(module, "VIRTUAL_POLICIES", {}).items()})
    return policies


def epp_extra(policy: str, modules: Mapping[str, Mapping[str, Any]] | None = None) -> dict[str, Any]:
    """The EPP configuration keys the real-time target of `policy` writes."""
    if modules and policy in modules:  # gateway_factory(profile=None, config_extra=...)
        return {**epp_config({}, None), **modules[policy]}
    if policy == "epp-default":
        return epp_config({}, None)
    if policy == "epp-best":
        return epp_config({}, BEST_PROFILE)
    builtin = policy.removeprefix("epp-")
    return epp_config({}, BUILTIN_PROFILE_DATA[builtin], builtin)


def recorded_extra(config: Mapping[str, Any]) -> dict[str, Any]:
    """The EPP configuration keys that reproduce a real-time summary's recorded policy config."""
    profile = config["profile"]
    body = {k: profile[k] for k in ("weights", "picker", "thresholds", "priority") if k in profile}
    scrape = {k: v for k, v in config.get("scrape", {}).items() if v is not None}
    return {"profiles": {"recorded": body}, "defaultProfile": "recorded", "scrape": scrape}


def replica_label(policy: str, replicas: int, workers: int = 0) -> str:
    """The summary label of `policy` run by `replicas` EPP replicas (one: the policy's own),
    each with `workers` ext_proc workers (0: the streams in the deciding process)."""
    label = policy if replicas == 1 else f"{policy}-{replicas}replicas"
    return label if workers == 0 else f"{label}-{workers}workers"


def make_router(
    policy: str,
    seed: int,
    scenario: Scenario,
    extra: Mapping[str, Any] | None,
    replicas: int = 1,
    store_rtt_ms: float = DEFAULT_RTT_MS,
    workers: int = 0,
) -> Router:
    if policy == "round-robin":
        return RoundRobin(seed)
    if policy == "oracle":
        return Oracle(seed)
    time_scale = float(scenario.fleet.get("time_scale", 1.0))
    config = dict(extra if extra is not None else epp_extra(policy))
    return VirtualEpp(
        config,
        seed=seed,
        time_scale=time_scale,
        scrape_age_s=DEFAULT_SCRAPE_AGE_S,
        label=replica_label(policy, replicas, workers),
        replicas=replicas,
        store_rtt_ms=store_rtt_ms,
        workers=workers,
    )


def scaled(
    scenario: Scenario, factor: int, duration_s: float | None = None, first_spike_s: float | None = None
) -> Scenario:
    """The scenario at `factor` x its pods and arrival rate (and `duration_s`, and a bursty
    pattern's first spike at `first_spike_s`, if given: a short run then still has a spike)."""
    out = scenario
    if first_spike_s is not None:
        out = dataclasses.replace(out, arrivals={**out.arrivals, "first_spike_s": first_spike_s})
    if factor != 1:
        arrivals = dict(out.arrivals)
        arrivals["rate"] = float(arrivals["rate"]) * factor
        # Live sessions and prompt groups scale with the pods, so each pod sees what it saw.
        workload = {
            k: (int(v) * factor if k in SCALED_WORKLOAD_KEYS else v) for k, v in scenario.workload.items()
        }
        fleet = scaled_fleet(scenario.fleet, factor)
        pods = sum(int(p.get("replicas", 1)) for p in fleet["pods"])
        out = dataclasses.replace(
            out, name=f"{scenario.name}@{pods}pods", fleet=fleet, arrivals=arrivals, workload=workload
        )
    if duration_s is not None:
        out = dataclasses.replace(out, duration_s=duration_s)
    return out


def run_one(
    scenario: Scenario,
    policy: str,
    *,
    gateway_ms: float | None = None,
    extra: Mapping[str, Any] | None = None,
    keep_itl: bool = True,
    until_first_tokens: bool = False,
    router_seed: int | None = None,
    replicas: int = 1,
    store_rtt_ms: float = DEFAULT_RTT_MS,
    workers: int = 0,
) -> tuple[list[Any], LoopStats, Router]:
    """One policy on one seeded scenario in virtual time: its results, loop stats and router.
    `router_seed`: the router's random source (ties, scrape jitter); default the trace seed.
    `replicas`: EPP replicas (epp-* policies) sharing state over a store `store_rtt_ms` away.
    `workers`: each request parsed by one of that many ext_proc workers, as `epp.workers` does."""
    time_scale = float(scenario.fleet.get("time_scale", 1.0))
    if gateway_ms is None:
        gateway_ms = GATEWAY_MS["epp" if policy.startswith("epp-") else policy]
    clock = VirtualClock()
    events = Events(clock)
    pods = build_pods(scenario.fleet, clock)
    seed = scenario.seed if router_seed is None else router_seed
    router = make_router(policy, seed, scenario, extra, replicas, store_rtt_ms, workers)
    trace = scenario.trace()
    limit_s = scenario.duration_s * 3 + 60 * time_scale  # bench run's max wall time, simulated
    results, stats = simulate(
        trace,
        pods,
        router,
        events,
        gateway_s=gateway_ms / 1000 * time_scale,
        limit_s=limit_s,
        keep_itl=keep_itl,
        until_first_tokens=until_first_tokens,
    )
    return results, stats, router


def _cpu(samples_ns: list[int]) -> dict[str, float | None]:
    ns = sorted(samples_ns)
    if not ns:
        return {"mean_us": None, "p50_us": None, "p99_us": None}
    return {
        "mean_us": statistics.fmean(ns) / 1000,
        "p50_us": ns[len(ns) // 2] / 1000,
        "p99_us": ns[min(len(ns) - 1, int(len(ns) * 0.99))] / 1000,
    }


def summarise(
    scenario: Scenario,
    policy: str,
    results: list[Any],
    stats: LoopStats,
    router: Router,
    argv: list[str],
    gateway_ms: float | None,
    extra_info: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    ms = gateway_ms if gateway_ms is not None else GATEWAY_MS["epp" if policy.startswith("epp-") else policy]
    run = {
        "virtual": True,
        "clock": "virtual (simulated seconds; engines and EPP share it)",
        "command": ["python", "-m", "bench", *argv],
        "wall_s": stats.wall_s,
        "cpu_s": stats.cpu_s,
        "simulated_s": stats.simulated_s,
        "engine_steps": stats.steps,
        "decisions": stats.decisions,
        "decision_cpu": _cpu(stats.decision_cpu_ns),  # the router's whole decision (EPP: on_request)
        **({"pick_cpu": _cpu(router.pick_cpu_ns)} if isinstance(router, VirtualEpp) else {}),
        **({"flow_control": router.flow_outcomes()} if isinstance(router, VirtualEpp) else {}),
        "engines": stats.engines,
        "gateway_ms": ms,
        "pods": len({r.pod for r in results if r.pod}) or None,
        "trace_requests": len(results),
        "machine_after": machine_state(),
        **dict(extra_info or {}),
    }
    return build_summary(
        scenario=scenario,
        policy=policy,
        policy_config=router.config(),
        results=results,
        run=run,
        env=environment(),
    )


def cmd_sim(args: argparse.Namespace, seeds: list[int]) -> int:
    """`seeds`: bench.__main__.run_seeds(args), the one rule for --seed / --seeds."""
    try:
        modules = load_policy_modules(args.policy_module)
    except ImportError as exc:
        print(f"--policy-module: {exc}", file=sys.stderr)
        return 2
    for policy in args.policy:
        if policy not in POLICIES and policy not in modules:
            known = ", ".join([*POLICIES, *modules])
            print(f"unknown virtual-time policy {policy!r}; known: {known}", file=sys.stderr)
            return 2
    if args.pods_scale < 1:
        print("--pods-scale must be an integer >= 1", file=sys.stderr)
        return 2
    if args.summaries is None:
        args.summaries = str(VIRTUAL_SUMMARIES if args.replicas is None else REPLICA_SUMMARIES)
    args.replicas = 1 if args.replicas is None else args.replicas
    if args.replicas < 1 or (args.replicas > 1 and not all(p.startswith("epp-") for p in args.policy)):
        print("--replicas must be >= 1, and above 1 only with epp-* policies", file=sys.stderr)
        return 2
    if args.workers < 0 or (args.workers > 0 and not all(p.startswith("epp-") for p in args.policy)):
        print("--workers must be >= 0, and above 0 only with epp-* policies", file=sys.stderr)
        return 2
    if not args.store_rtt_ms >= 0:
        print("--store-rtt-ms must be >= 0", file=sys.stderr)
        return 2
    if args.duration_s is not None and not args.duration_s > 0:
        print("--duration-s must be > 0", file=sys.stderr)
        return 2
    try:
        base = load_scenario(args.scenario, args.mode)
    except ScenarioError as exc:
        print(f"scenario error: {exc}", file=sys.stderr)
        return 2
    scenario = scaled(base, args.pods_scale, args.duration_s, args.first_spike_s)
    for seed in seeds:
        seeded = scenario.with_seed(seed)
        for policy in args.policy:
            extra = epp_extra(policy, modules) if policy in modules else None
            info: dict[str, Any] = {}
            if args.as_recorded and policy.startswith("epp-"):
                recorded = summary_path(args.as_recorded, args.mode, base.name, policy, seed)
                if not recorded.exists():
                    print(f"skip {base.name}/{policy}/seed-{seed}: no real-time summary {recorded}")
                    continue
                extra = recorded_extra(json.loads(recorded.read_text())["policy"]["config"])
                info["as_recorded"] = recorded.as_posix()
            results, stats, router = run_one(
                seeded,
                policy,
                gateway_ms=args.gateway_ms,
                extra=extra,
                keep_itl=not args.ttft_only,
                until_first_tokens=args.ttft_only,
                router_seed=args.router_seed,
                replicas=args.replicas,
                store_rtt_ms=args.store_rtt_ms,
                workers=args.workers,
            )
            if args.router_seed is not None:
                info["router_seed"] = args.router_seed
            if args.ttft_only:
                info["ttft_only"] = (
                    "stopped once every request had its first token: no ITL; E2E of early finishers only"
                )
            label = replica_label(policy, args.replicas, args.workers)
            summary = summarise(seeded, label, results, stats, router, args.argv, args.gateway_ms, info)
            path = write_summary(args.summaries, summary)
            st = summary["stats"]["steady"]
            cpu = summary["run"]["decision_cpu"]
            print(
                f"{seeded.name}/{label}/seed-{seed}: {st['ok']}/{st['requests']} ok, TTFT P50/P95 "
                f"{_ms(st['ttft_p50'])}/{_ms(st['ttft_p95'])}, decision CPU mean {cpu['mean_us'] or 0:.0f} us, "
                f"wall {stats.wall_s:.1f} s for {stats.simulated_s:.1f} simulated s -> {path}"
            )
            sys.stdout.flush()
    return 0


def _ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value * 1000:.1f} ms"


def add_parser(sub: Any) -> None:
    sim = sub.add_parser("sim", help="run scenarios in virtual time (the EPP's code, simulated engines)")
    sim.add_argument("--scenario", required=True)
    sim.add_argument(
        "--policy", action="append", required=True, help=f"repeatable: {', '.join(POLICIES)} or a module's"
    )
    sim.add_argument(
        "--policy-module", action="append", default=[], help="module whose VIRTUAL_POLICIES adds EPP policies"
    )
    sim.add_argument("--mode", choices=MODES, default="quick")
    sim.add_argument("--seeds", help="reporting (default), tuning, or N = the first N reporting seeds")
    sim.add_argument("--seed", type=int, action="append", default=[], help="explicit trace seed; repeatable")
    sim.add_argument(
        "--pods-scale", type=int, default=1, help="K x every fleet entry's replicas and the rate"
    )
    sim.add_argument("--duration-s", type=float, help="override the scenario's duration (bound big runs)")
    sim.add_argument(
        "--gateway-ms", type=float, help="gateway latency per request, wall ms (default: measured)"
    )
    sim.add_argument("--as-recorded", help="epp-* policies run the config of this root's real-time summaries")
    sim.add_argument(
        "--summaries",
        help=(
            "summaries root (default: git-ignored scratch under bench/scratch/; name "
            f"{VIRTUAL_SUMMARIES} or, with --replicas, {REPLICA_SUMMARIES} to write the committed one)"
        ),
    )
    sim.add_argument(
        "--ttft-only", action="store_true", help="stop once every request has its first token (big runs)"
    )
    sim.add_argument("--router-seed", type=int, help="the routers' random source (default: the trace seed)")
    sim.add_argument("--replicas", type=int, help="EPP replicas (epp-* policies), sharing state (default 1)")
    sim.add_argument(
        "--workers",
        type=int,
        default=0,
        help="ext_proc workers per EPP (epp.workers): each request parsed by one of them and "
        "handed over as the IPC frame carries it (default 0: parsed in the deciding process)",
    )
    sim.add_argument(
        "--store-rtt-ms",
        type=float,
        default=DEFAULT_RTT_MS,
        help=f"replicas: the shared store's round trip, wall ms (default {DEFAULT_RTT_MS}: loopback Valkey)",
    )
    sim.add_argument("--first-spike-s", type=float, help="bursty arrivals: move the first spike here")
