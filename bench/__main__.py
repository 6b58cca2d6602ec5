"""Benchmark CLI.

python -m bench run --scenario bench/scenarios/mixed-gpu.yaml --policy sglang-cache_aware [--policy ...]
    [--seeds reporting|tuning|N] [--seed N ...]     # default: the reporting seeds
    [--fleet-tokenizer] [--fleet-kv-events]        # on anyway for a run with a precise policy
    [--pin-router]                                 # the router on CPU 0, fleet + load generator on the rest
    [--summaries bench/summaries]                  # the committed root; default bench/scratch/summaries
python -m bench sim --scenario bench/scenarios/uniform.yaml --policy epp-default --policy oracle
    [--seeds ...] [--pods-scale K] [--duration-s S]   # virtual time (bench/vtime/), no sleeps
    [--summaries bench/summaries-virtual]          # the committed root; default bench/scratch/summaries-virtual
                                                   # (with --replicas: bench/scratch/summaries-virtual-replicas)
python -m bench sim-report                         # docs/benchmarks/virtual-time.md from the summaries
python -m bench slo-report                         # docs/benchmarks/slo.md (latency objectives)
python -m bench report [--summaries bench/summaries] [--mode quick] [--root .]   # README + docs/benchmarks*
    [--replicas-campaign DIR]                      # docs/benchmarks/replicas.md: real-time replicas campaign
python -m bench trace --scenario bench/scenarios/bursty.yaml      # trace statistics only
python -m bench serve --scenario bench/scenarios/uniform.yaml --policy epp-default  # for other load generators
python -m bench overhead                                          # load generator self-test
python -m bench policies                                          # registered policy names
python -m bench refresh [--plan] [--virtual-only]  # re-run what a change of the default made stale
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shlex
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

from tqdm import tqdm

from bench.harness.fleet import FleetNeeds, fleet_lag, fleet_with, running_fleet_pods
from bench.harness.llama_fleet import engine_counters, engine_record, is_llama_fleet, running_llama_fleet
from bench.harness.loadgen import (
    LoadGenConfig,
    RequestResult,
    run_trace,
    to_simulated,
    to_wall_clock,
    without_probe_time,
)
from bench.harness.pinning import CpuPlan, PinningError, cpu_plan, descendants, pin_router, pinned_to, record
from bench.harness.scenario import MODES, Scenario, ScenarioError, load_scenario
from bench.harness.serve import add_parser as add_serve_parser
from bench.harness.serve import serve
from bench.harness.stationarity import check_stationarity
from bench.harness.stats import summarize
from bench.harness.summary import (
    REPORTING_SEEDS,
    SUMMARIES_DIR,
    TUNING_SEEDS,
    build_summary,
    environment,
    machine_state,
    scratch_for,
    write_summary,
)
from bench.harness.targets import FLEET_NEEDS, POLICIES, TargetContext, fleet_needs, load_plugins, make_target
from bench.micro.overhead import measure_overhead, render_overhead
from bench.refresh import add_parser as add_refresh_parser
from bench.refresh import cmd_refresh
from bench.reports.pages import render_report
from bench.reports.replicas import render_page as render_replicas_page
from bench.reports.report import run_from, save_run, write_section
from bench.reports.slo import add_parser as add_slo_report_parser
from bench.reports.slo import cmd_slo_report
from bench.vtime.cli import REPLICA_SUMMARIES, VIRTUAL_SUMMARIES, cmd_sim
from bench.vtime.cli import add_parser as add_sim_parser
from bench.vtime.report import DOC as VIRTUAL_DOC
from bench.vtime.report import add_parser as add_sim_report_parser
from bench.vtime.report import cmd_sim_report, render_doc


def _options(pairs: Sequence[str]) -> dict[str, str]:
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise SystemExit(f"--target-opt expects key=value, got {pair!r}")
        out[key] = value
    return out


@contextlib.asynccontextmanager
async def _workers(
    scenario: Scenario, urls: Sequence[str], needs: FleetNeeds
) -> AsyncIterator[tuple[list[str], list[dict[str, Any]]]]:
    """The pod URLs and, for the harness's own fleet, its pods as the fleet reports them."""
    if urls:
        yield list(urls), []
        return
    if is_llama_fleet(scenario.fleet):
        async with running_llama_fleet(scenario.fleet) as pods:
            yield [f"http://{pod['address']}" for pod in pods], pods
        return
    async with running_fleet_pods(fleet_with(scenario.fleet, needs)) as pods:
        yield [f"http://{pod['address']}" for pod in pods], pods


# llama-server tokenizes with the tiny model's tokenizer, the shipped one: a tokenizing fleet.
LLAMA_TOKENIZES = FleetNeeds(tokenizer=True)


def run_fleet_needs(args: argparse.Namespace) -> FleetNeeds:
    """One fleet configuration for every policy of a run: the union of what its policies need
    (bench.harness.targets.FLEET_NEEDS) and the --fleet-* flags. The tokenizer changes the pods' token
    ids and, a little, their prompt tokens (the shipped one gives 0.97-1.03x the chars / 4
    target on the bench's text, the approximate ids 0.93-0.98x: `python -m bench.probes.token_parity`),
    so a policy compared with a precise one runs on the same fleet: in the same run, or with
    --fleet-tokenizer."""
    needs = fleet_needs(list(args.policy)) | FleetNeeds(args.fleet_kv_events, args.fleet_tokenizer)
    if is_llama_fleet(load_scenario(args.scenario, args.mode).fleet):
        needs = needs | LLAMA_TOKENIZES
    return needs


def run_label(policy: str, needs: FleetNeeds) -> str:
    """The policy's name, `+tok` added when the run's fleet tokenizes with the shipped tokenizer
    and the policy did not ask for it: its figures are then not those of the usual fleet."""
    if needs.tokenizer and not FLEET_NEEDS.get(policy, FleetNeeds()).tokenizer:
        return f"{policy}+tok"
    return policy


async def run_policy(
    scenario: Scenario, policy: str, args: argparse.Namespace, ctx: TargetContext
) -> list[RequestResult]:
    """One policy on one seeded trace: raw results to --results, a summary to --summaries."""
    time_scale = float(scenario.fleet.get("time_scale", 1.0))
    trace = to_wall_clock(scenario.trace(), time_scale)  # the trace is in simulated seconds
    if args.max_requests:
        trace = trace[: args.max_requests]
    target = make_target(policy, ctx)
    before = machine_state()
    plan: CpuPlan | None = getattr(args, "cpu_plan", None)
    started = descendants(os.getpid()) if plan else set()
    base_url = await target.start()
    pinning = None
    try:
        router = pin_router(started, plan.router) if plan else []
        lg = scenario.loadgen
        config = LoadGenConfig(
            base_url=base_url,
            http2=args.http2 or bool(lg.get("http2", False)),
            verify=args.ca_file or False,
            concurrency=args.concurrency or int(lg.get("concurrency", 256)),
            timeout_s=float(lg.get("timeout_s", 300.0)),
            max_wall_s=args.max_wall_s or scenario.duration_s / time_scale * 3 + 60,
        )
        with tqdm(
            total=len(trace),
            desc=f"{scenario.name}/{policy}/seed-{scenario.seed}",
            unit="req",
            disable=args.no_progress,
        ) as bar:
            run = await run_trace(trace, config, on_done=lambda _: bar.update())
        lag = await fleet_lag(ctx.worker_urls)
        counters = await engine_counters(ctx.worker_urls)  # llama-server's own; None on modelsim
        if plan:
            pinning = record(plan, router, bool(args.worker_urls))
    finally:
        await target.stop()
    after = machine_state()
    # The oracle's probe round trips are measured per request and taken out of its TTFT.
    run.results = without_probe_time(run.results)
    # Report simulated seconds, so runs at different time scales compare directly.
    run.results = to_simulated(run.results, time_scale)
    wall_s = run.wall_s
    run.wall_s *= time_scale
    label = args.label or run_label(policy, ctx.fleet_needs)
    meta = {
        "description": scenario.description,
        "fleet": scenario.fleet,
        "fleet_options": ctx.fleet_needs.describe(),
        "workload": scenario.workload,
        "arrivals": scenario.arrivals,
        "duration_s": scenario.duration_s,
        "seed": scenario.seed,
        "base_url": base_url,
        "time_scale": time_scale,
        "times": "simulated seconds (wall x time_scale)",
    }
    path = save_run(args.results, run_from(scenario.name, label, scenario.mode, run, meta, scenario.seed))
    info = {
        "policy_registered_as": policy,
        "command": ["python", "-m", "bench", *args.argv],
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(run.started_at)),
        "wall_s": wall_s,
        "time_scale": time_scale,
        "times": "simulated seconds (wall x time_scale)",
        "trace_requests": len(trace),
        "not_sent": run.not_sent,
        "max_requests": args.max_requests,
        "concurrency": config.concurrency,
        "http2": config.http2,
        "worker_urls_given": bool(args.worker_urls),
        "machine_before": before,
        "machine_after": after,
        "fleet_lag": lag,
        "fleet_options": ctx.fleet_needs.describe(),
        "cpu_pinning": pinning,  # None: the router shared every CPU with the harness
    }
    if is_llama_fleet(scenario.fleet):
        info["engine"] = engine_record()
    if counters is not None:
        info["engine_counters"] = counters
    summary = build_summary(
        scenario=scenario,
        policy=label,
        policy_config=target.config,
        results=run.results,
        run=info,
        env=environment(),
    )
    summary_file = write_summary(args.summaries, summary)
    st = summary["stats"]["steady"]
    goodput = "n/a" if st["goodput"] is None else f"{st['goodput'] * 100:.1f} %"
    print(
        f"{scenario.name}/{label}/seed-{scenario.seed}: {st['ok']}/{st['requests']} ok in the steady window, "
        f"TTFT P50/P95/P99 {_fmt(st['ttft_p50'])}/{_fmt(st['ttft_p95'])}/{_fmt(st['ttft_p99'])} s, "
        f"{st['output_tok_s']:,.0f} tok/s sustained, goodput {goodput}, errors {st['error_kinds'] or 0}, "
        f"pods {summarize(run.results).pods}, load generator lag P99 {_fmt(st['lag_p99'])} s, "
        f"fleet lag mean/max {_lag(lag)}{_pinned(pinning)} -> {summary_file} (raw: {path})"
    )
    return run.results


def _pinned(pinning: dict[str, Any] | None) -> str:
    if pinning is None:
        return ""
    names = ", ".join(sorted({p["name"] for p in pinning["router_processes"]})) or "none started"
    return f", router ({names}) on CPU {pinning['router_cpus']}, harness on {pinning['harness_cpus']}"


def _lag(lag: dict[str, Any] | None) -> str:
    return "n/a" if lag is None else f"{lag['mean_lag_ms']:.2f}/{lag['max_lag_ms']:.0f} ms"


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def sim_summaries(replicas: int | None) -> Path:
    """Where `bench sim` writes when told no root: the scratch stand-in of the committed root its
    runs belong to (the replicas campaign's when a replica count is named)."""
    return scratch_for(VIRTUAL_SUMMARIES if replicas is None else REPLICA_SUMMARIES)


def run_seeds(args: argparse.Namespace) -> list[int]:
    """--seed N (repeatable) wins; else --seeds: reporting | tuning | N (the first N reporting)."""
    if args.seed:
        return list(dict.fromkeys(args.seed))
    choice = args.seeds or "reporting"
    if choice == "reporting":
        return list(REPORTING_SEEDS)
    if choice == "tuning":
        return list(TUNING_SEEDS)
    if choice.isdigit() and 1 <= int(choice) <= len(REPORTING_SEEDS):
        return list(REPORTING_SEEDS[: int(choice)])
    raise SystemExit(
        f"--seeds expects reporting, tuning or 1..{len(REPORTING_SEEDS)}, got {choice!r} (or use --seed N)"
    )


async def cmd_run(args: argparse.Namespace) -> int:
    load_plugins(tuple(args.policy_module))
    for policy in args.policy:
        if policy not in POLICIES:
            print(f"unknown policy {policy!r}; known: {', '.join(sorted(POLICIES))}", file=sys.stderr)
            return 2
    if args.label and len(args.policy) != 1:
        print("--label names one policy's runs; give exactly one --policy", file=sys.stderr)
        return 2
    needs = run_fleet_needs(args)
    llama = is_llama_fleet(load_scenario(args.scenario, args.mode).fleet)
    if needs.kv_events and llama:
        print("llama-server publishes no KV events: drop the precise policies", file=sys.stderr)
        return 2
    if args.worker_urls and (needs.kv_events or (needs.tokenizer and not llama)):
        print(
            f"the run needs the harness's fleet ({needs.describe()}): KV-event ports and the"
            " tokenizer are set when it starts the pods; drop --worker-urls",
            file=sys.stderr,
        )
        return 2
    args.cpu_plan = None
    if args.pin_router:
        try:
            args.cpu_plan = cpu_plan()
        except PinningError as exc:
            print(str(exc), file=sys.stderr)
            return 2
    with pinned_to(args.cpu_plan.harness if args.cpu_plan else None):  # the fleet inherits it
        return await _run_all(args, needs)


async def _run_all(args: argparse.Namespace, needs: FleetNeeds) -> int:
    scenario = load_scenario(args.scenario, args.mode)
    seeds = run_seeds(args)
    work_dir = Path(tempfile.mkdtemp(prefix=f"bench-{scenario.name}-"))
    for seed in seeds:
        seeded = scenario.with_seed(seed)
        for policy in args.policy:
            # A fresh simulated fleet per policy: every policy replays the same trace, and pods kept
            # from the previous policy would still hold its prompts in their prefix caches.
            async with _workers(seeded, args.worker_urls, needs) as (urls, pods):
                ctx = TargetContext(urls, work_dir, seeded, _options(args.target_opt), pods, needs)
                await run_policy(seeded, policy, args, ctx)
    return 0


def cmd_trace(args: argparse.Namespace) -> int:
    scenario = load_scenario(args.scenario, args.mode)
    if args.seed is not None:
        scenario = scenario.with_seed(args.seed)
    trace = scenario.trace()
    chars = [sum(len(m["content"]) for m in r.body["messages"]) for r in trace]
    print(
        f"{scenario.name} ({scenario.mode}, seed {scenario.seed}): {len(trace)} requests over {scenario.duration_s:g} s"
    )
    if trace:
        print(f"  offered rate {len(trace) / scenario.duration_s:.2f} req/s")
        print(f"  prompt tokens (~chars/4): mean {statistics.mean(chars) / 4:.0f}, max {max(chars) / 4:.0f}")
        print(f"  max_tokens mean {statistics.mean(r.body['max_tokens'] for r in trace):.0f}")
        print(f"  distinct tags {len({r.tag for r in trace})}")
        try:
            verdict = check_stationarity(trace, scenario.duration_s)
            print(f"  stationary: {'yes' if verdict.ok else 'NO'} (halves: {verdict.describe()})")
        except ValueError as exc:
            print(f"  stationary: cannot judge ({exc})")
    return 0


async def cmd_overhead(args: argparse.Namespace) -> int:
    rates = [float(r) for r in args.rates.split(",")]
    results = await measure_overhead(rates, args.seconds, args.peak_requests, args.tokens)
    command = (
        "python -m bench overhead " + shlex.join(sys.argv[2:]) if sys.argv[2:] else "python -m bench overhead"
    )
    markdown = render_overhead(results, command.strip(), args.tokens)
    print(markdown)
    if args.doc:
        write_section(args.doc, "loadgen-overhead", markdown)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run one scenario under one or more policies")
    run.add_argument("--scenario", required=True)
    run.add_argument("--policy", action="append", required=True, help="repeatable; see `policies`")
    run.add_argument("--mode", choices=MODES, default="quick")
    run.add_argument(
        "--worker-urls", nargs="*", default=[], help="use running pods instead of starting modelsim"
    )
    run.add_argument(
        "--target-opt", action="append", default=[], help="key=value passed to the policy target"
    )
    run.add_argument("--policy-module", action="append", default=[], help="module that registers policies")
    run.add_argument(
        "--seeds",
        help="reporting (default), tuning, or N = the first N reporting seeds (bench/harness/summary.py)",
    )
    run.add_argument("--seed", type=int, action="append", default=[], help="explicit trace seed; repeatable")
    run.add_argument(
        "--label", help="store the runs under this name instead of the policy's (tuning variants)"
    )
    run.add_argument("--results", default="bench/results", help="raw per-request results (git-ignored)")
    run.add_argument(
        "--summaries",
        default=str(scratch_for(SUMMARIES_DIR)),
        help=f"summaries root (default {scratch_for(SUMMARIES_DIR)}, git-ignored; the committed one: {SUMMARIES_DIR})",
    )
    run.add_argument("--http2", action="store_true")
    run.add_argument("--ca-file", help="CA bundle for TLS targets (default: verification off)")
    run.add_argument("--concurrency", type=int, help="in-flight cap (default from the scenario, else 256)")
    run.add_argument("--max-requests", type=int, help="cut the trace to its first N requests")
    run.add_argument("--max-wall-s", type=float, help="hard wall-time limit per policy")
    run.add_argument("--no-progress", action="store_true")
    run.add_argument(
        "--fleet-tokenizer",
        action="store_true",
        help="pods tokenize with the shipped tokenizer (on anyway when a policy of the run needs it)",
    )
    run.add_argument(
        "--pin-router",
        action="store_true",
        help=(
            "the router under test on the first CPU, the fleet and load generator on the others"
            " (bench/harness/pinning.py)"
        ),
    )
    run.add_argument(
        "--fleet-kv-events",
        action="store_true",
        help="pods publish KV events (on anyway when a policy of the run needs them)",
    )

    add_sim_parser(sub)
    add_sim_report_parser(sub)
    add_slo_report_parser(sub)

    rep = sub.add_parser(
        "report",
        help="render the committed summaries into README.md, docs/benchmarks.md and docs/benchmarks/",
    )
    rep.add_argument("--summaries", default=str(SUMMARIES_DIR))
    rep.add_argument("--mode", choices=MODES, default="quick")
    rep.add_argument("--results", help="raw results for the plots (e.g. bench/results); default: no plots")
    rep.add_argument("--root", default=".", help="the repository whose README.md and docs/ are rewritten")
    rep.add_argument("--baseline", default="round-robin")
    rep.add_argument(
        "--replicas-campaign",
        help="results root of one replicas campaign for docs/benchmarks/replicas.md's real-time table "
        "(default: the newest bench/results-committed/*-replicas/)",
    )

    tr = sub.add_parser("trace", help="print a scenario's trace statistics")
    tr.add_argument("--scenario", required=True)
    tr.add_argument("--mode", choices=MODES, default="quick")
    tr.add_argument("--seed", type=int, help="trace seed (default: the scenario's own)")

    ov = sub.add_parser("overhead", help="measure the load generator against a local stub")
    ov.add_argument("--rates", default="20,50,100,200")
    ov.add_argument("--seconds", type=float, default=10.0)
    ov.add_argument("--peak-requests", type=int, default=3000)
    ov.add_argument("--tokens", type=int, default=16)
    ov.add_argument("--doc", help="also write the section into this markdown file")

    add_serve_parser(sub, MODES)
    add_refresh_parser(sub)

    sub.add_parser("policies", help="list registered policy names")

    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # recorded in each run's summary
    try:
        if args.command == "run":
            return asyncio.run(cmd_run(args))
        if args.command == "report":
            names = render_report(args.root, args.summaries, args.mode, args.baseline, args.results)
            print(f"rendered {len(names)} scenario(s) under {args.root}: {', '.join(names) or 'none'}")
            virtual = Path(args.root) / VIRTUAL_SUMMARIES
            if virtual.exists():  # virtual-time runs (bench sim): their own page, apart from these tables
                render_doc(args.summaries, virtual, args.mode, Path(args.root) / VIRTUAL_DOC)
                print(f"rendered the virtual-time tables into {Path(args.root) / VIRTUAL_DOC}")
            replicas = Path(args.root) / REPLICA_SUMMARIES
            if replicas.exists() or args.replicas_campaign:  # replicas vs one EPP, virtual and real time
                page = render_replicas_page(args.root, replicas, args.replicas_campaign, args.mode)
                print(f"rendered the replica tables into {page}")
            return 0
        if args.command == "sim":
            args.summaries = args.summaries or str(sim_summaries(args.replicas))
            return cmd_sim(args, run_seeds(args))
        if args.command == "sim-report":
            return cmd_sim_report(args)
        if args.command == "slo-report":
            return cmd_slo_report(args)
        if args.command == "trace":
            return cmd_trace(args)
        if args.command == "serve":
            scenario = load_scenario(args.scenario, args.mode)
            options = _options(args.target_opt)
            return asyncio.run(serve(scenario, args.policy, options, args.ready_file, args.seconds))
        if args.command == "refresh":
            return cmd_refresh(args)
        if args.command == "overhead":
            return asyncio.run(cmd_overhead(args))
        load_plugins()
        print("\n".join(sorted(POLICIES)))
        return 0
    except ScenarioError as exc:
        print(f"scenario error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
