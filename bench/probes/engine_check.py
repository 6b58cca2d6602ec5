"""Offline load check: a scenario's trace through modelsim's engines in virtual time.

No gateway, no HTTP, no fleet process: the trace's requests are tokenised as the pods would
tokenise them and submitted to one `modelsim.engine.Engine` per pod at their arrival times,
and the engines step in simulated time (a discrete-event loop, as fast as the CPU allows). A
simple router picks the pod per request. What it tells: whether a scenario loads its fleet as
its comments say (per-pod saturation rates, KV pressure, prefix hit rates under round-robin vs
key affinity, what a per-request best-TTFT pick reaches). What it does not: anything about the
gateway (scrape staleness, overhead), which only `bench run` measures.

    python -m bench.probes.engine_check --scenario bench/scenarios/kv-cache-wins.yaml --seed 100 \\
        --route round-robin --route affinity --route oracle
    python -m bench.probes.engine_check --scenario bench/scenarios/mixed-gpu.yaml --pod a10g --rate 4 --rate 5

Routes: `round-robin`; `least-loaded` (fewest queued + running requests); `affinity` (a stable
hash of the request's trace tag, e.g. its prefix group or adapter, picks the pod); `oracle`
(lowest `Engine.predict_ttft`, the rule bench/harness/oracle.py applies with the pods' `/sim/probe`).
"""

from __future__ import annotations

import argparse
import heapq
import sys
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from bench.harness.scenario import ScenarioError, load_scenario
from bench.harness.stats import WARMUP_FRACTION, percentile
from bench.harness.workloads import TraceRequest, generate_trace
from modelsim.clock import SimClock
from modelsim.engine import Engine
from modelsim.fleet import FleetSpec
from modelsim.kvcache import block_hash
from modelsim.sequence import Seq, StepPlan
from modelsim.server import PodConfig
from modelsim.tokenizer import ApproxTokenizer

ROUTES = ("round-robin", "least-loaded", "affinity", "oracle")
DRAIN_FACTOR = 10.0  # stop stepping at this many trace durations: what is left is a backlog


class VirtualClock(SimClock):
    """Simulated time the driver sets; the engine's step loop (which would sleep) is never run."""

    def __init__(self) -> None:  # no event loop needed: nothing sleeps on this clock
        self.time_scale = 1.0
        self.t = 0.0

    def now(self) -> float:
        return self.t


@dataclass
class SimPod:
    config: PodConfig
    engine: Engine
    busy_s: float = 0.0  # simulated seconds spent stepping until the last arrival
    peak_kv: float = 0.0  # highest share of KV blocks held by requests after a step
    peak_waiting: int = 0
    sent: int = 0
    stepping: bool = False

    def serves(self, model: str) -> bool:
        return model == self.config.model or model in self.config.adapters

    def load(self) -> int:
        return len(self.engine.waiting) + len(self.engine.running)


@dataclass(frozen=True)
class Done:
    """One request's outcome, times in simulated seconds."""

    at_s: float
    pod: str
    tag: str
    prompt_tokens: int
    cached_tokens: int
    ttft_s: float | None  # None: no first token before the drain limit
    finished_s: float | None
    output_tokens: int
    preemptions: int


Router = Callable[[TraceRequest, list[int], str | None, list[SimPod]], SimPod]


def _route_round_robin() -> Router:
    turn = [0]

    def pick(_: TraceRequest, __: list[int], ___: str | None, pods: list[SimPod]) -> SimPod:
        turn[0] += 1
        return pods[(turn[0] - 1) % len(pods)]

    return pick


def _route_least_loaded(_: TraceRequest, __: list[int], ___: str | None, pods: list[SimPod]) -> SimPod:
    return min(pods, key=SimPod.load)


def _route_affinity(req: TraceRequest, _: list[int], __: str | None, pods: list[SimPod]) -> SimPod:
    return pods[zlib.crc32(req.tag.encode()) % len(pods)]


def _route_oracle(_: TraceRequest, ids: list[int], adapter: str | None, pods: list[SimPod]) -> SimPod:
    return min(pods, key=lambda p: p.engine.predict_ttft(ids, adapter))


def make_router(name: str) -> Router:
    routers: dict[str, Callable[[], Router]] = {
        "round-robin": _route_round_robin,
        "least-loaded": lambda: _route_least_loaded,
        "affinity": lambda: _route_affinity,
        "oracle": lambda: _route_oracle,
    }
    if name not in routers:
        raise ValueError(f"unknown route {name!r}; expected one of {', '.join(ROUTES)}")
    return routers[name]()


def build_pods(fleet: dict[str, Any], only: str | None = None) -> list[SimPod]:
    """One engine per pod of a scenario's fleet; `only`: one replica of that fleet entry alone."""
    spec = FleetSpec.from_dict(fleet)
    pods = list(spec.pods)
    if only is not None:
        pods = [p for p in pods if only in (p.name, p.name.rsplit("-", 1)[0])][:1]
        if not pods:
            raise ValueError(f"no fleet pod named {only!r}")
    out = []
    for pod in pods:
        config = spec.pod_config(pod)
        engine = Engine(config.profile, VirtualClock(), model=config.model, seed=config.seed,
                        enable_prefix_caching=config.enable_prefix_caching)  # fmt: skip
        out.append(SimPod(config, engine))
    return out


def simulate(
    trace: Sequence[TraceRequest], pods: list[SimPod], router: Router, drain_limit_s: float
) -> list[Done]:
    """Replay `trace` on `pods` in virtual time; every request's outcome, in arrival order.

    Steps run back to back while a pod has work; requests arriving during a step join its
    queue for the next one, as in the engine's own loop. Stepping stops at `drain_limit_s`.
    """
    arrivals = sorted(trace, key=lambda r: r.at_s)
    horizon = arrivals[-1].at_s if arrivals else 0.0
    tokenizer = {p.config.name: ApproxTokenizer(p.config.profile.vocab_size) for p in pods}
    steps: list[tuple[float, int, float, StepPlan]] = []  # (end, pod index, start, plan)
    submitted: list[tuple[TraceRequest, SimPod, Seq]] = []

    def set_time(t: float) -> None:
        for pod in pods:
            assert isinstance(pod.engine.clock, VirtualClock)
            pod.engine.clock.t = t

    def kick(i: int, t: float) -> None:
        pod = pods[i]
        if pod.stepping or not (pod.engine.waiting or pod.engine.running):
            return
        plan, end = pod.engine.plan_step(t)
        if not plan.scheduled:  # nothing fits now: look again one idle step later, as the loop does
            end = t + pod.config.profile.t0_ms / 1000
        pod.stepping = True
        pod.peak_waiting = max(pod.peak_waiting, len(pod.engine.waiting))
        heapq.heappush(steps, (end, i, t, plan))

    n = 0
    while n < len(arrivals) or steps:
        next_arrival = arrivals[n].at_s if n < len(arrivals) else float("inf")
        if steps and steps[0][0] <= next_arrival:
            end, i, start, plan = heapq.heappop(steps)
            if end > drain_limit_s:
                break
            set_time(end)
            pod = pods[i]
            pod.stepping = False
            if plan.scheduled:
                pod.busy_s += max(0.0, min(end, horizon) - start)
                pod.engine.complete_step(plan, end)
                pod.peak_kv = max(pod.peak_kv, pod.engine.kv_usage())
            kick(i, end)
            continue
        req = arrivals[n]
        n += 1
        set_time(req.at_s)
        model = req.body["model"]
        candidates = [p for p in pods if p.serves(model)]
        if not candidates:
            raise ValueError(f"no pod serves {model!r}")
        ids = tokenizer[candidates[0].config.name].encode_chat(req.body["messages"])
        adapter = None if model == candidates[0].config.model else model
        pod = router(req, ids, adapter, candidates)
        pod.sent += 1
        seq = pod.engine.submit(ids, int(req.body.get("max_tokens", 16)), adapter)
        submitted.append((req, pod, seq))
        kick(pods.index(pod), req.at_s)
    return [
        Done(
            at_s=req.at_s,
            pod=pod.config.name,
            tag=req.tag,
            prompt_tokens=seq.num_prompt,
            cached_tokens=seq.cached_tokens,
            ttft_s=None if seq.first_token is None else seq.first_token - seq.arrival,
            finished_s=seq.finished_at if seq.status == "finished" else None,
            output_tokens=seq.num_output,
            preemptions=seq.preemptions,
        )
        for req, pod, seq in submitted
    ]


def distinct_prompt_tokens(trace: Sequence[TraceRequest], vocab_size: int, block_size: int) -> int:
    """KV the trace's prompts need to be cached all at once: distinct full blocks x block size."""
    tokenizer = ApproxTokenizer(vocab_size)
    seen: set[int] = set()
    for req in trace:
        ids = tokenizer.encode_chat(req.body["messages"])
        model = req.body["model"]
        parent = 0
        for i in range(len(ids) // block_size):
            parent = block_hash(parent, ids[i * block_size : (i + 1) * block_size], model)
            seen.add(parent)
    return len(seen) * block_size


@dataclass(frozen=True)
class CheckResult:
    route: str
    requests: int
    steady: int
    unfinished: int  # steady-window requests without a first token at the drain limit
    ttft_p50_s: float | None
    ttft_p95_s: float | None
    ttft_p99_s: float | None
    cached_share: float  # cached prompt tokens / prompt tokens, steady window
    preemptions: int
    # requests finishing in the trace's second half per second: the offered rate unless a backlog grows
    completed_per_s: float
    offered_per_s: float
    pods: list[dict[str, Any]]


def check(trace: Sequence[TraceRequest], pods: list[SimPod], route: str, duration_s: float) -> CheckResult:
    """Run one route and summarise the steady window (arrivals in [0.1 T, T], T the last arrival)."""
    done = simulate(trace, pods, make_router(route), DRAIN_FACTOR * duration_s)
    horizon = max((d.at_s for d in done), default=0.0)
    lo = WARMUP_FRACTION * horizon
    steady = [d for d in done if d.at_s >= lo]
    ttfts = [d.ttft_s if d.ttft_s is not None else float("inf") for d in steady]
    prompt = sum(d.prompt_tokens for d in steady)
    span = max(1e-9, horizon - lo)
    half = horizon / 2
    pods_out = [
        {
            "pod": p.config.name,
            "share": p.sent / max(1, len(done)),
            "busy": p.busy_s / max(1e-9, horizon),
            "peak_kv": p.peak_kv,
            "peak_waiting": p.peak_waiting,
            "lora_loads": p.engine.lora.loads_from_disk + p.engine.lora.loads_from_cpu,
        }
        for p in pods
    ]
    return CheckResult(
        route=route,
        requests=len(done),
        steady=len(steady),
        unfinished=sum(d.ttft_s is None for d in steady),
        ttft_p50_s=_finite(percentile(ttfts, 50)),
        ttft_p95_s=_finite(percentile(ttfts, 95)),
        ttft_p99_s=_finite(percentile(ttfts, 99)),
        cached_share=sum(d.cached_tokens for d in steady) / prompt if prompt else 0.0,
        preemptions=sum(d.preemptions for d in done),
        completed_per_s=sum(1 for d in done if d.finished_s is not None and half <= d.finished_s <= horizon)
        / max(1e-9, horizon - half),
        offered_per_s=len(steady) / span,
        pods=pods_out,
    )


def _finite(value: float | None) -> float | None:
    return None if value is None or value == float("inf") else value


def _ms(value: float | None) -> str:
    return "backlog" if value is None else f"{value * 1000:,.0f} ms"


def describe(result: CheckResult) -> str:
    head = (
        f"{result.route}: {result.requests} requests, steady {result.steady} "
        f"(offered {result.offered_per_s:.1f}/s, completed {result.completed_per_s:.1f}/s); "
        f"TTFT P50 {_ms(result.ttft_p50_s)}, P95 {_ms(result.ttft_p95_s)}, P99 {_ms(result.ttft_p99_s)}; "
        f"prefix cached {result.cached_share * 100:.0f} %; preemptions {result.preemptions}"
        + (f"; {result.unfinished} without a first token" if result.unfinished else "")
    )
    rows = [
        f"    {p['pod']}: share {p['share'] * 100:.0f} %, busy {p['busy'] * 100:.0f} %, "
        f"peak KV {p['peak_kv'] * 100:.0f} %, peak queue {p['peak_waiting']}"
        + (f", adapter loads {p['lora_loads']}" if p["lora_loads"] else "")
        for p in result.pods
    ]
    return "\n".join([head, *rows])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m bench.probes.engine_check", description=__doc__.split("\n")[0]
    )
    ap.add_argument("--scenario", required=True)
    ap.add_argument("--mode", choices=("quick", "full"), default="quick")
    ap.add_argument("--seed", type=int, help="trace seed (default: the scenario's own)")
    ap.add_argument("--route", action="append", choices=ROUTES, help="repeatable; default round-robin")
    ap.add_argument("--pod", help="one replica of this fleet entry alone (with --rate: its capacity)")
    ap.add_argument("--rate", type=float, action="append", default=[],
                    help="with --pod: Poisson arrivals at this rate instead of the scenario's")  # fmt: skip
    args = ap.parse_args(argv)
    try:
        scenario = load_scenario(args.scenario, args.mode)
    except ScenarioError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    seed = scenario.seed if args.seed is None else args.seed
    pods = build_pods(scenario.fleet, args.pod)
    kv_tokens = sum(p.config.profile.num_gpu_blocks * p.config.profile.block_size for p in pods)
    runs: list[tuple[str, list[TraceRequest]]] = []
    if args.rate:
        if args.pod is None:
            ap.error("--rate needs --pod")
        for rate in args.rate:
            arrivals = {"pattern": "poisson", "rate": rate}
            runs.append((f"{args.pod} alone at {rate:g} req/s", generate_trace(
                scenario.workload, arrivals, scenario.duration_s, seed)))  # fmt: skip
    else:
        runs.append((f"{scenario.name} seed {seed}", scenario.with_seed(seed).trace()))
    for label, trace in runs:
        profile = pods[0].config.profile
        demand = distinct_prompt_tokens(trace, profile.vocab_size, profile.block_size)
        print(f"{label} ({scenario.mode}, {scenario.duration_s:g} s): distinct prompt KV {demand:,} tokens "
              f"vs KV capacity {kv_tokens:,} ({demand / kv_tokens * 100:.0f} %)")  # fmt: skip
        for route in args.route or ["round-robin"]:
            print(describe(check(trace, build_pods(scenario.fleet, args.pod), route, scenario.duration_s)))
            sys.stdout.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
