"""Disaggregated prefill/decode and data-parallel ranks, in virtual time on modelsim's engines.

`python -m bench.probes.pd_sim [--seeds 1 2 3] [--out docs/benchmarks/pd.md]` runs each scenario with
each policy on the same GPUs (h100-llama3.1-8b engines, one virtual clock, no HTTP) and writes
TTFT and ITL P50/P95 (median over the seeds, [min-max]).

The routers here read the engines' exact state (`Engine.predict_ttft`, cached prefix tokens,
queues): they compare the serving shapes, not the EPP's scorers from scraped metrics.

- `round-robin`: aggregated pods in turn.
- `agg-least-ttft`: aggregated, the pod with the lowest predicted TTFT.
- `pd`, `pd-q1`, `pd-3p1d`: 2 prefill + 2 decode pods (`pd-3p1d`: 3 + 1; `pd-q1`: a prefill
  pod may queue 1 request, not 4); the P/D profile's rule (epp/scheduling/pd.py): the decode pod
  with the lowest predicted TTFT, a prefill pod when the prompt's part not cached there is at
  least `MIN_UNCACHED` tokens and the best prefill pod queues at most `MAX_PREFILL_QUEUE`. The
  prefill runs one token with its KV held; the KV moves in `profile.kv_transfer_s(prompt)`
  (modelsim/pd.py); the decode pod recomputes the last prompt token and decodes. TTFT counts
  to the decode pod's first token, as a client behind the sidecar sees it.
- `dp-rank-aware` / `dp-rank-blind`: pods of 2 data-parallel ranks each; the router picks the
  rank with the lowest predicted TTFT and pins it (`X-data-parallel-rank`), or picks the pod
  that way and leaves the rank to vLLM's own balancing (4 x waiting + running);
  `dp-epp-ranks`: the pod picked that way, the rank by the EPP's rule (epp/ranks.py: its own
  routing history per rank, in-flight counts), not the engines' state.
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import random
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from bench.probes.engine_check import VirtualClock
from epp.ranks import RankRouter
from epp.request import InferenceRequest
from modelsim.engine import Engine, Seq
from modelsim.profiles import get_profile

PROFILE = "h100-llama3.1-8b"
MIN_UNCACHED, MAX_PREFILL_QUEUE = 1024, 4
WARMUP_S = 10.0


@dataclass(frozen=True)
class Scenario:
    name: str
    rate: float  # requests per second, Poisson
    duration_s: float
    # (share, prompt tokens, output tokens, shared-prefix groups or 0); BLIS presets
    # (calibration.md): summarization 4,096/512, chatbot 256/256.
    mix: tuple[tuple[float, int, int, int], ...]
    policies: tuple[str, ...]
    what: str


SCENARIOS = (
    Scenario(
        "pd-long-prompt",
        8.0,
        60.0,
        ((1.0, 8192, 256, 0),),
        ("round-robin", "agg-least-ttft", "pd", "pd-q1", "pd-3p1d"),
        "long prompts (8,192 in / 256 out, document Q&A-shaped), 8 req/s on 4 GPUs",
    ),
    Scenario(
        "pd-mixed-chat",
        20.0,
        60.0,
        ((0.2, 8192, 256, 0), (0.8, 256, 256, 0)),
        ("round-robin", "agg-least-ttft", "pd", "pd-q1", "pd-3p1d"),
        "20 % long prompts (8,192/256) among 80 % chat (256/256, BLIS's chatbot preset), 20 req/s on 4 GPUs",
    ),
    Scenario(
        "dp-shared-prefix",
        12.0,
        60.0,
        ((1.0, 3072, 128, 96),),
        ("round-robin", "dp-rank-blind", "dp-epp-ranks", "dp-rank-aware"),
        "96 groups sharing a 2,048-token prefix (+1,024 own, 128 out), 12 req/s on 2 pods x 2 DP ranks "
        "with 4,000 KV blocks each (64k tokens: a rank holds a third of the prefixes)",
    ),
)


@dataclass(eq=False)
class Unit:
    """One engine the routers see (a pod, or one rank of a DP pod)."""

    engine: Engine
    pod: int
    role: str = "both"
    rank: int = 0
    stepping: bool = False


@dataclass
class Record:
    arrival: float
    tokens: list[float] = field(default_factory=list)  # emission times of the client's tokens


class Sim:
    def __init__(self, units: list[Unit], clock: VirtualClock) -> None:
        self.units, self.clock = units, clock
        self.heap: list[tuple[float, int, Callable[[], None]]] = []
        self.order = itertools.count()
        self.watch: dict[int, tuple[Seq, Record | None, Callable[[Seq], None] | None]] = {}

    def at(self, t: float, fn: Callable[[], None]) -> None:
        heapq.heappush(self.heap, (t, next(self.order), fn))

    def submit(
        self,
        unit: Unit,
        ids: list[int],
        max_tokens: int,
        record: Record | None,
        done: Callable[[Seq], None] | None = None,
        **kw: bool,
    ) -> Seq:
        seq = unit.engine.submit(ids, max_tokens, None, **kw)
        self.watch[seq.request_id] = (seq, record, done)
        self.wake(unit)
        return seq

    def wake(self, unit: Unit) -> None:
        if unit.stepping:
            return
        now = self.clock.t
        plan, end = unit.engine.plan_step(now)
        if not plan.scheduled:
            return
        unit.stepping = True

        def finish() -> None:
            counts = {s.request_id: s.num_output for s, _ in plan.scheduled}
            unit.engine.complete_step(plan, end)
            unit.stepping = False
            for s, _ in plan.scheduled:
                entry = self.watch.get(s.request_id)
                if entry is None:
                    continue
                if entry[1] is not None and s.num_output > counts[s.request_id]:
                    entry[1].tokens.append(end)
                if s.status in ("finished", "aborted"):
                    del self.watch[s.request_id]
                    if entry[2] is not None:
                        entry[2](s)
            self.wake(unit)

        self.at(end, finish)

    def run(self, until_s: float) -> None:
        while self.heap and self.heap[0][0] <= until_s:
            t, _, fn = heapq.heappop(self.heap)
            self.clock.t = t
            fn()


def prompt_ids(rng: random.Random, n: int, group: int | None, vocab: int) -> list[int]:
    if group is None:
        return [rng.randrange(vocab) for _ in range(n)]
    shared = random.Random(1_000_003 * (group + 1))
    head = [shared.randrange(vocab) for _ in range(2048)]
    return head + [rng.randrange(vocab) for _ in range(n - 2048)]


def run(scenario: Scenario, policy: str, seed: int) -> dict[str, float]:
    clock = VirtualClock()
    profile = get_profile(PROFILE)
    dp = policy.startswith("dp-")
    if dp:
        profile = profile.with_overrides(num_gpu_blocks=4000)
    pods = 2 if dp else 4
    ranks = 2 if dp else 1
    prefill_pods = 3 if policy == "pd-3p1d" else 2
    max_queue = 1 if policy == "pd-q1" else MAX_PREFILL_QUEUE
    units = []
    for p in range(pods):
        role = ("prefill" if p < prefill_pods else "decode") if policy.startswith("pd") else "both"
        for r in range(ranks):
            units.append(Unit(Engine(profile, clock, seed=seed * 100 + p * 10 + r), p, role, r))
    sim = Sim(units, clock)
    rng = random.Random(seed)
    records: list[Record] = []
    turn = itertools.count()
    router = RankRouter()

    def ttft(u: Unit, ids: list[int]) -> float:
        return u.engine.predict_ttft(ids, None)

    def route(ids: list[int], out: int) -> None:
        rec = Record(clock.t)
        records.append(rec)
        if policy == "round-robin":
            unit = units[next(turn) % len(units)] if not dp else None
            if unit is None:  # a DP pod served round-robin: vLLM balances its ranks
                pod = next(turn) % pods
                unit = min((u for u in units if u.pod == pod), key=_vllm_load)
            sim.submit(unit, ids, out, rec)
        elif policy in ("agg-least-ttft", "dp-rank-aware"):
            sim.submit(min(units, key=lambda u: ttft(u, ids)), ids, out, rec)
        elif policy == "dp-rank-blind":
            pod = min(units, key=lambda u: ttft(u, ids)).pod
            sim.submit(min((u for u in units if u.pod == pod), key=_vllm_load), ids, out, rec)
        elif policy == "dp-epp-ranks":  # the pod as rank-blind picks it, then the EPP's rank rule
            pod = min(units, key=lambda u: ttft(u, ids)).pod
            address = f"10.0.0.{pod}:8000"
            text = " ".join(map(str, ids))  # a prompt's text: the same prefix, the same leading blocks
            request = InferenceRequest(str(len(records)), "m", "m", None, text, len(ids), out)
            rank, hashes = router.pick(request, address, ranks)
            router.on_routed(address, rank, hashes)
            unit = next(u for u in units if u.pod == pod and u.rank == rank)
            sim.submit(unit, ids, out, rec, lambda _s: router.on_finished(address, rank))
        else:  # pd
            decoders = [u for u in units if u.role in ("decode", "both")]
            decode = min(decoders, key=lambda u: ttft(u, ids))
            uncached = len(ids) - decode.engine.cached_prefix_tokens(ids, None)
            prefillers = [u for u in units if u.role in ("prefill", "both") and u is not decode]
            prefill = min(prefillers, key=lambda u: ttft(u, ids)) if prefillers else None
            if prefill is None or uncached < MIN_UNCACHED or len(prefill.engine.waiting) > max_queue:
                sim.submit(decode, ids, out, rec)
                return

            def prefilled(seq: Seq, prefill: Unit = prefill, decode: Unit = decode) -> None:
                if seq.status != "finished":
                    return

                def moved() -> None:
                    prefill.engine.release_held(seq.request_id)
                    sim.wake(prefill)
                    sim.submit(decode, ids, out, rec, kv_from_remote=True)

                sim.at(clock.t + prefill.engine.profile.kv_transfer_s(len(ids)), moved)

            sim.submit(prefill, ids, 1, None, prefilled, hold_kv=True)

    t = 0.0
    while True:
        t += rng.expovariate(scenario.rate)
        if t >= scenario.duration_s:
            break
        pick = rng.random()
        share, n_in, n_out, groups = scenario.mix[-1]
        for share, n_in, n_out, groups in scenario.mix:  # noqa: B007 - the entry the draw falls in
            if pick < share:
                break
            pick -= share
        group = rng.randrange(groups) if groups else None
        ids = prompt_ids(rng, n_in, group, profile.vocab_size)
        sim.at(t, lambda ids=ids, n_out=n_out: route(ids, n_out))
    sim.run(scenario.duration_s + 600.0)
    kept = [r for r in records if r.arrival >= WARMUP_S and r.tokens]
    ttfts = [r.tokens[0] - r.arrival for r in kept]
    gaps = [b - a for r in kept for a, b in itertools.pairwise(r.tokens)]
    return {
        "ttft_p50": _pct(ttfts, 50),
        "ttft_p95": _pct(ttfts, 95),
        "itl_p50": _pct(gaps, 50),
        "itl_p95": _pct(gaps, 95),
        "itl_p99": _pct(gaps, 99),
        "itl_max": max(gaps, default=float("nan")),
        "requests": float(len(kept)),
    }


def _vllm_load(u: Unit) -> int:
    return 4 * len(u.engine.waiting) + len(u.engine.running)


def _pct(values: list[float], q: int) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, round(q / 100 * (len(values) - 1)))]


def _cell(values: list[float]) -> str:
    ms = [v * 1000 for v in values]
    return f"{statistics.median(ms):,.0f} ms [{min(ms):,.0f}-{max(ms):,.0f}]"


def _cell_fine(values: list[float]) -> str:
    ms = [v * 1000 for v in values]
    return f"{statistics.median(ms):,.1f} ms [{min(ms):,.1f}-{max(ms):,.1f}]"


def table(seeds: list[int], progress: Callable[[str], None] = print) -> str:
    lines = []
    for sc in SCENARIOS:
        lines += [f"### `{sc.name}`", "", sc.what + ".", ""]
        lines += [
            "| policy | TTFT P50 | TTFT P95 | ITL P50 | ITL P95 | ITL P99 |",
            "|---|---|---|---|---|---|",
        ]
        for policy in sc.policies:
            runs = []
            for seed in seeds:
                runs.append(run(sc, policy, seed))
                progress(f"{sc.name} {policy} seed {seed}: {runs[-1]}")
            cells = [_cell([r["ttft_p50"] for r in runs]), _cell([r["ttft_p95"] for r in runs])]
            cells += [_cell_fine([r[k] for r in runs]) for k in ("itl_p50", "itl_p95", "itl_p99")]
            lines.append(f"| `{policy}` | " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(prog="bench.probes.pd_sim", description=__doc__)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--out", type=Path, help="write the tables into this page between its markers")
    args = parser.parse_args()
    text = table(args.seeds)
    if args.out is None:
        print(text)
        return
    page = args.out.read_text()
    start, end = "<!-- pd-sim:start -->", "<!-- pd-sim:end -->"
    head, _, rest = page.partition(start)
    _, _, tail = rest.partition(end)
    args.out.write_text(f"{head}{start}\n{text}\n{end}{tail}")


if __name__ == "__main__":
    main()
