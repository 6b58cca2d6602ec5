"""Disaggregated prefill/decode and data-parallel ranks, in virtual time on modelsim's engines.

`python -m bench.probes.pd_sim [--seeds 1 2 3] [--out docs/benchmarks/pd.md]` runs each scenario with
each policy on the same GPUs (h100-llama3.1-8b engines, one virtual clock, no HTTP) and writes
TTFT and ITL P50/P95 (median over the seeds, [min-max]).

The `epp-*` policies route with the EPP's own code (`EppRouter`: `epp.app.EppApp` and an
`EppProcessor` per request) from the engines' scraped /metrics pages and the EPP's own
accounting of its picks; the others read the engines' exact state (`Engine.predict_ttft`,
cached prefix tokens, queues) and compare the serving shapes.

- `round-robin`: aggregated pods in turn.
- `agg-least-ttft`: aggregated, the pod with the lowest predicted TTFT.
- `epp-agg`: aggregated, the EPP's pick with the shipped `default` profile (predicted-ttft 5,
  precise-prefix-cache 2, kv-cache 1; without KV events the precise prefix scorer is the
  approximate `prefix-cache` on every pod, epp/scheduling/scorers.py).
- `epp-pd`: the same EPP and profile over 2 prefill + 2 decode pods labelled
  `llm-d.ai/role`, with `disaggregation: {}` (the defaults: `minUncachedTokens` 1,024,
  `maxPrefillQueue` 4), so every request goes through `pick_disaggregated`
  (epp/scheduling/disaggregation.py) as the live EPP routes it; then served as `pd` below.
- `pd`, `pd-q1`, `pd-3p1d`: 2 prefill + 2 decode pods (`pd-3p1d`: 3 + 1; `pd-q1`: a prefill
  pod may queue 1 request, not 4); the P/D profile's rule (epp/scheduling/disaggregation.py): the decode pod
  with the lowest predicted TTFT, a prefill pod when the prompt's part not cached there is at
  least `MIN_UNCACHED` tokens and the best prefill pod queues at most `MAX_PREFILL_QUEUE`. The
  prefill runs one token with its KV held; the KV moves in `profile.kv_transfer_s(prompt)`
  (modelsim/pd.py); the decode pod recomputes the last prompt token and decodes. TTFT counts
  to the decode pod's first token, as a client behind the sidecar sees it.
- `dp-rank-aware` / `dp-rank-blind`: pods of 2 data-parallel ranks each; the router picks the
  rank with the lowest predicted TTFT and pins it (`X-data-parallel-rank`), or picks the pod
  that way and leaves the rank to vLLM's own balancing (4 x waiting + running);
  `dp-epp-ranks`: the pod picked that way, the rank by the EPP's rule (epp/requestcontrol/dp_ranks.py: its own
  routing history per rank, in-flight counts), not the engines' state.
"""

from __future__ import annotations

import argparse
import functools
import heapq
import itertools
import json
import random
import statistics
import string
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from prometheus_client import CollectorRegistry

from bench.probes.engine_check import VirtualClock
from bench.vtime.epp import DEFAULT_SCRAPE_AGE_S, run_now
from bench.vtime.pods import address_for
from devstack.launch import gateway_config_for, pool_name_for
from epp.app import EppApp
from epp.datalayer.endpoint_records import Endpoint, Metrics
from epp.datalayer.scrape import SpeedTracker
from epp.requestcontrol.dp_ranks import RankRouter
from epp.requestcontrol.processor import EppProcessor
from epp.scheduling.request import CHARS_PER_TOKEN, InferenceRequest
from extproc.headers import DESTINATION_HEADER, MODEL_HEADER, SERVED_HEADER
from extproc.stream import RequestRoute
from gateway.pool_config import DisaggregationConfig
from modelsim.engine import Engine
from modelsim.metrics import make_registry, render
from modelsim.profiles import get_profile
from modelsim.sequence import Seq

PROFILE = "h100-llama3.1-8b"
MODEL = "llama-3.1-8b"  # the model the EPP's pool serves (the engines' pages name it)
MIN_UNCACHED, MAX_PREFILL_QUEUE = 1024, 4
WARMUP_S = 10.0
PD_POLICIES = ("pd", "pd-q1", "pd-3p1d", "epp-pd")  # 2 (3) prefill + 2 (1) decode pods


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
        ("round-robin", "agg-least-ttft", "epp-agg", "pd", "epp-pd", "pd-q1", "pd-3p1d"),
        "long prompts (8,192 in / 256 out, document Q&A-shaped), 8 req/s on 4 GPUs",
    ),
    Scenario(
        "pd-mixed-chat",
        20.0,
        60.0,
        ((0.2, 8192, 256, 0), (0.8, 256, 256, 0)),
        ("round-robin", "agg-least-ttft", "epp-agg", "pd", "epp-pd", "pd-q1", "pd-3p1d"),
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
    prompt: int  # tokens
    tokens: list[float] = field(default_factory=list)  # emission times of the client's tokens
    split: bool = False  # prefilled on a prefill pod


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


def serve(
    sim: Sim,
    decode: Unit,
    prefill: Unit | None,
    ids: list[int],
    out: int,
    rec: Record,
    answered: Callable[[], None] | None = None,
    done: Callable[[Seq], None] | None = None,
) -> None:
    """The request on `decode`; with `prefill`, its prompt first prefilled there (one token, its
    KV held), the KV moved in `profile.kv_transfer_s(prompt)`, then decoded on `decode` (which
    recomputes the last prompt token). `answered`: when the decode pod takes the request (its
    response headers); `done`: when it ends there."""
    rec.split = prefill is not None
    if prefill is None:
        if answered is not None:
            answered()
        sim.submit(decode, ids, out, rec, done)
        return

    def prefilled(seq: Seq, prefill: Unit = prefill) -> None:
        if seq.status != "finished":
            return

        def moved() -> None:
            prefill.engine.release_held(seq.request_id)
            sim.wake(prefill)
            if answered is not None:
                answered()
            sim.submit(decode, ids, out, rec, done, kv_from_remote=True)

        sim.at(sim.clock.t + prefill.engine.profile.kv_transfer_s(len(ids)), moved)

    sim.submit(prefill, ids, 1, None, prefilled, hold_kv=True)


_SYMBOLS = string.ascii_letters + string.digits + "+/"


def prompt_text(ids: list[int]) -> str:
    """The prompt as the EPP reads it: CHARS_PER_TOKEN characters per token id, so its estimate
    (characters / CHARS_PER_TOKEN) is the engine's token count and the approximate prefix
    index's blocks (block size x CHARS_PER_TOKEN characters) are the engine's KV blocks."""
    digits = range(CHARS_PER_TOKEN - 1, -1, -1)
    return "".join(_SYMBOLS[(i >> 6 * k) & 63] for i in ids for k in digits)


@dataclass(eq=False)
class _Scrapes:
    """One pod's scrape loop state (the live `Scraper._loop`'s locals)."""

    endpoint: Endpoint
    registry: CollectorRegistry
    interval: float
    speed: SpeedTracker = field(default_factory=SpeedTracker)
    previous: Metrics | None = None
    pending: int = 0  # generation of the queued scrape; a wake bumps it, voiding the old one
    idle: bool = False  # the queued scrape ends a sleep longer than the fast interval


class EppRouter:
    """The EPP itself in the loop: `epp.app.EppApp` built from a gateway config of these units
    (no event loop runs, so it starts no server, scrape task or watcher; bench/vtime/epp.py
    builds its EPPs the same way), one `EppProcessor` per request as Envoy drives it
    (`on_request` at arrival: parse, the profile's scorers, `pick_disaggregated` when the pool
    has `disaggregation`, `Pool.on_routed` on the decode and the prefill pod; the decode pod's
    response headers release the prefill pod's slot; `on_close` at the last token).

    What it reads is what the live EPP reads: each engine's /metrics page
    (`modelsim.metrics.render`) recorded through the live `Scraper.record_page`
    `DEFAULT_SCRAPE_AGE_S` after it is rendered, at the scraper's own cadence (`next_delay`:
    the config's 50 ms interval while a pod is busy, backing off while idle, jittered; a routed
    request ends an idle sleep), plus the pool's ledger and in-flight counts of its own picks
    since. No KV events: the precise prefix scorer is the approximate one (scorers.py)."""

    def __init__(
        self, sim: Sim, units: list[Unit], *, disaggregated: bool, seed: int, until_s: float
    ) -> None:
        self.sim, self.until_s = sim, until_s
        self.pd = DisaggregationConfig()  # the defaults, as `disaggregation: {}` configures them
        self.units = {address_for(u.pod): u for u in units}
        if len(self.units) != len(units):
            raise ValueError("one unit per pod: the EPP routes to pods")
        config = gateway_config_for(
            [{"name": f"pod-{u.pod}", "model": MODEL, "address": a} for a, u in self.units.items()], {}
        )
        (pool,) = config["pools"]
        if disaggregated:
            pool["disaggregation"] = {}
            for ep in pool["endpoints"]:  # as Kubernetes discovery reads the pods' labels
                ep["labels"] = {self.pd.role_label: self.units[ep["address"]].role}
        with tempfile.TemporaryDirectory(prefix="pd-sim-epp-") as work:
            path = Path(work) / "gateway.yaml"
            path.write_text(yaml.safe_dump(config, sort_keys=False))
            self.app = app = EppApp(path, pool_name_for(MODEL))
        app.pool.clock = app.scheduler.residency.clock = app.scheduler.memory.clock = self._now
        app.scheduler.rng = random.Random(seed * 1000)
        app.scraper.rng = random.Random(seed * 1000 + 500)
        app.pool.routed_hook = self._wake
        self.requests = itertools.count()
        fast = app.scraper.cadence.fast_s
        self.scrapes: dict[str, _Scrapes] = {}
        for ep in app.pool.endpoints():
            registry = make_registry(self.units[ep.address].engine, MODEL, "vllm")
            state = self.scrapes[ep.address] = _Scrapes(ep, registry, fast)
            self._schedule(state, self._now() + app.scraper.rng.random() * fast, idle=False)  # a random phase

    def _now(self) -> float:
        return self.sim.clock.t

    def decide(self, ids: list[int], out: int) -> tuple[Unit, Unit | None, EppProcessor]:
        """The EPP's decision for this prompt: its decode (or only) pod, its prefill pod if it split
        the request, and the processor that holds the request's accounting until `on_close`."""
        n = next(self.requests)
        body = json.dumps({"model": MODEL, "prompt": prompt_text(ids), "max_tokens": out}).encode()
        headers = {
            ":method": "POST",
            ":path": "/v1/completions",
            "x-request-id": f"req-{n}",
            MODEL_HEADER: MODEL,
        }
        processor = EppProcessor(self.app.ctx)
        outcome = run_now(processor.on_request(headers, body))
        if not isinstance(outcome, RequestRoute):
            raise RuntimeError(f"the EPP did not route request {n}: {outcome!r}")
        decode = self.units[outcome.set_headers[DESTINATION_HEADER].split(",", 1)[0]]
        prefill = outcome.set_headers.get(self.pd.prefiller_header)
        return decode, None if prefill is None else self.units[prefill], processor

    def route(self, ids: list[int], out: int, rec: Record) -> None:
        decode, prefill, processor = self.decide(ids, out)

        def answered() -> None:
            processor.on_response_headers({":status": "200", SERVED_HEADER: address_for(decode.pod)})

        serve(self.sim, decode, prefill, ids, out, rec, answered, lambda seq: processor.on_close(True))

    # ---- scrapes: the live loop's steps (epp/datalayer/scrape.py `Scraper._loop`) as events -------------
    def _schedule(self, state: _Scrapes, at: float, *, idle: bool) -> None:
        state.pending += 1
        state.idle = idle
        generation = state.pending
        self.sim.at(at, lambda: self._scrape(state, generation))

    def _scrape(self, state: _Scrapes, generation: int) -> None:
        if generation != state.pending:
            return  # replaced by a wake
        state.pending += 1  # nothing queued until the page is recorded
        state.idle = False
        page, sent_at = render(state.registry), self._now()
        self.sim.at(sent_at + DEFAULT_SCRAPE_AGE_S, lambda: self._record(state, page, sent_at))

    def _record(self, state: _Scrapes, page: bytes, sent_at: float) -> None:
        scraper = self.app.scraper
        metrics = scraper.record_page(state.endpoint, page, state.speed, sent_at)
        delay, state.interval = scraper.next_delay(
            state.endpoint.address, state.interval, state.previous, metrics
        )
        state.previous = metrics
        if self._now() >= self.until_s and not self.app.pool.inflight_total():
            return  # every request is over: no more scrapes to keep the run going
        self._schedule(state, max(self._now(), sent_at + delay), idle=delay > scraper.cadence.fast_s)

    def _wake(self, address: str) -> None:
        """A request was routed to `address`: end its idle sleep (`Scraper.wake`)."""
        state = self.scrapes.get(address)
        if state is not None and state.idle:
            self._schedule(state, self._now(), idle=False)


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
        role = ("prefill" if p < prefill_pods else "decode") if policy in PD_POLICIES else "both"
        for r in range(ranks):
            units.append(Unit(Engine(profile, clock, seed=seed * 100 + p * 10 + r), p, role, r))
    sim = Sim(units, clock)
    rng = random.Random(seed)
    records: list[Record] = []
    turn = itertools.count()
    router = RankRouter()
    epp = None
    if policy.startswith("epp-"):
        epp = EppRouter(sim, units, disaggregated=policy == "epp-pd", seed=seed, until_s=scenario.duration_s)

    def ttft(u: Unit, ids: list[int]) -> float:
        return u.engine.predict_ttft(ids, None)

    def route(ids: list[int], out: int) -> None:
        rec = Record(clock.t, len(ids))
        records.append(rec)
        if epp is not None:
            epp.route(ids, out, rec)
        elif policy == "round-robin":
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
            if prefill is not None and (uncached < MIN_UNCACHED or len(prefill.engine.waiting) > max_queue):
                prefill = None
            serve(sim, decode, prefill, ids, out, rec)

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
        sim.at(t, functools.partial(route, ids, n_out))
    sim.run(scenario.duration_s + 600.0)
    kept = [r for r in records if r.arrival >= WARMUP_S and r.tokens]
    ttfts = [r.tokens[0] - r.arrival for r in kept]
    gaps = [b - a for r in kept for a, b in itertools.pairwise(r.tokens)]
    long = [r.split for r in kept if r.prompt >= MIN_UNCACHED]
    short = [r.split for r in kept if r.prompt < MIN_UNCACHED]
    return {
        "ttft_p50": _pct(ttfts, 50),
        "ttft_p95": _pct(ttfts, 95),
        "itl_p50": _pct(gaps, 50),
        "itl_p95": _pct(gaps, 95),
        "itl_p99": _pct(gaps, 99),
        "itl_max": max(gaps, default=float("nan")),
        "requests": float(len(kept)),
        # shares of the prompts of at least / under MIN_UNCACHED tokens prefilled on a prefill pod
        "split_long": statistics.fmean(long) if long else float("nan"),
        "split_short": statistics.fmean(short) if short else float("nan"),
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
        split = any(p in PD_POLICIES for p in sc.policies)  # a column: long prompts split
        lines += [
            "| policy | TTFT P50 | TTFT P95 | ITL P50 | ITL P95 | ITL P99 |"
            + (" long split |" if split else ""),
            "|---|---|---|---|---|---|" + ("---|" if split else ""),
        ]
        for policy in sc.policies:
            runs = []
            for seed in seeds:
                runs.append(run(sc, policy, seed))
                progress(f"{sc.name} {policy} seed {seed}: {runs[-1]}")
            cells = [_cell([r["ttft_p50"] for r in runs]), _cell([r["ttft_p95"] for r in runs])]
            cells += [_cell_fine([r[k] for r in runs]) for k in ("itl_p50", "itl_p95", "itl_p99")]
            if split and policy not in PD_POLICIES:
                cells.append("-")  # aggregated: nothing to split
            elif split:
                shares = [100 * r["split_long"] for r in runs]
                cells.append(f"{statistics.median(shares):.0f} % [{min(shares):.0f}-{max(shares):.0f}]")
            lines.append(f"| `{policy}` | " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


MARKERS = ("<!-- pd-sim:start -->", "<!-- pd-sim:end -->")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench.probes.pd_sim", description=__doc__)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--out", type=Path, help="write the tables into this page between its markers")
    args = parser.parse_args(argv)
    start, end = MARKERS
    if args.out is not None:  # checked before minutes of simulation, not after
        try:
            page = args.out.read_text()
        except OSError as exc:
            parser.exit(2, f"bench.probes.pd_sim: cannot read --out {args.out}: {exc.strerror}\n")
        if start not in page or end not in page:
            parser.exit(2, f"bench.probes.pd_sim: --out {args.out} has no {start} ... {end} block\n")
    text = table(args.seeds)
    if args.out is None:
        print(text)
        return 0
    head, _, rest = page.partition(start)
    _, _, tail = rest.partition(end)
    args.out.write_text(f"{head}{start}\n{text}\n{end}{tail}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
