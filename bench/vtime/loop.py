"""The discrete-event loop: one virtual clock, the pods' engine steps, routers' timers, arrivals.

Events run in time order; at equal times steps end first, then timers (the EPP's scrapes),
then arrivals, then FIFO. Nothing sleeps and nothing reads the wall clock except the CPU
meters. A request lands `gateway_s` after its trace time (the gateway's own latency, in
simulated seconds); the router decides at landing (or, when it holds the request in its own
queue, later: `Routed.later`), the pod's engine queues it at once, and its
TTFT and end-to-end time count from the trace time, as the load generator measures them.
"""

from __future__ import annotations

import functools
import heapq
import itertools
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from bench.harness.loadgen import RequestResult
from bench.harness.workloads import TraceRequest
from bench.probes.engine_check import VirtualClock
from bench.vtime.pods import SimPod
from modelsim.openai_api import ApiError
from modelsim.sequence import Seq, StepPlan

STEP, TIMER, LAND = 0, 1, 2  # tie order at one instant


class Events:
    """The event queue and the one clock of a run (simulated seconds)."""

    def __init__(self, clock: VirtualClock) -> None:
        self.clock = clock
        self._heap: list[tuple[float, int, int, Callable[[], None]]] = []
        self._order = itertools.count()

    @property
    def now(self) -> float:
        return self.clock.t

    def at(self, t: float, kind: int, fn: Callable[[], None]) -> None:
        heapq.heappush(self._heap, (t, kind, next(self._order), fn))

    def run_until(self, limit_s: float, done: Callable[[], bool]) -> None:
        """Run events up to `limit_s` or until `done()` holds with no step pending."""
        heap = self._heap
        while heap:
            t, _, _, fn = heapq.heappop(heap)
            if t > limit_s:
                break
            self.clock.t = t
            fn()
            if done():
                break


@dataclass
class Routed:
    """A router's answer: the pod (None: refused with `status`/`error`), and the callbacks the
    gateway would run as the response goes by (headers with the pod's status, then the close)."""

    pod: SimPod | None
    status: int = 0
    error: str | None = None
    on_response: Callable[[int], None] | None = None
    on_close: Callable[[bool], None] | None = None
    # Set when the decision waits (the EPP's flow-control queue): called at once with the
    # continuation that takes the final answer, which it runs when the router decides.
    later: Callable[[Callable[[Routed], None]], None] | None = None


class Router(Protocol):
    name: str

    def start(self, events: Events, pods: Sequence[SimPod]) -> None: ...

    def route(self, index: int, req: TraceRequest, body: bytes) -> Routed: ...

    def config(self) -> dict[str, object]: ...


@dataclass
class _Track:
    result: RequestResult
    routed: Routed
    landed_at: float
    last_token: float | None = None


@dataclass
class LoopStats:
    decisions: int = 0
    decision_cpu_ns: list[int] = field(default_factory=list)  # process time of each route() call
    steps: int = 0
    wall_s: float = 0.0
    cpu_s: float = 0.0
    simulated_s: float = 0.0
    engines: list[dict[str, Any]] = field(default_factory=list)  # per pod, at the end (engine_totals)


def engine_totals(pod: SimPod) -> dict[str, Any]:
    """What a pod's engine did over the run: prefix-cache hit rate, preemptions, adapter loads,
    KV use after its steps (mean over steps and peak)."""
    e = pod.pod.engine
    s = e.stats
    return {
        "pod": pod.name,
        "prefix_hit_rate": s.prefix_cache_hits / s.prefix_cache_queries if s.prefix_cache_queries else None,
        "preemptions": s.num_preemptions,
        "adapter_loads": e.lora.loads_from_disk + e.lora.loads_from_cpu,
        "steps": s.steps,
        "kv_usage_mean": round(pod.kv_sum / pod.kv_steps, 6) if pod.kv_steps else None,
        "kv_usage_peak": round(pod.kv_peak, 6),
    }


def simulate(
    trace: Sequence[TraceRequest],
    pods: list[SimPod],
    router: Router,
    events: Events,
    *,
    gateway_s: float,
    limit_s: float,
    keep_itl: bool = True,
    until_first_tokens: bool = False,
) -> tuple[list[RequestResult], LoopStats]:
    """Replay `trace` through `router` onto `pods`; one RequestResult per trace entry.

    `until_first_tokens`: stop once every request has its first token (TTFT complete; the
    requests still decoding then keep no E2E): big runs skip the long drain of their outputs."""
    stats = LoopStats()
    tracks: dict[int, _Track] = {}  # id(seq) -> its request
    results: list[RequestResult] = []
    live = [0, 0]  # requests submitted and not finished; of those, without a first token

    def kick(pod: SimPod) -> None:
        if pod.stepping or not pod.has_work():
            return
        plan, end = pod.plan(events.now)
        pod.stepping = True
        events.at(end, STEP, lambda: step_done(pod, plan, end))

    def step_done(pod: SimPod, plan: StepPlan, end: float) -> None:
        pod.stepping = False
        if plan.scheduled:
            stats.steps += 1
            pod.pod.engine.complete_step(plan, end)
            pod.note_kv()
            for seq, _ in plan.scheduled:
                deliver(seq, end)
        kick(pod)

    def deliver(seq: Seq, now: float) -> None:
        """Drain the tokens a step emitted, as the pod's SSE handler would send them."""
        queue = seq.events
        track = tracks.get(id(seq))
        if track is None:
            return
        r = track.result
        while not queue.empty():
            ev = queue.get_nowait()
            if ev.finish_reason is not None:
                finish(seq, track, now, ev.error)
                return
            if r.ttft_s is None:
                r.ttft_s = now - r.scheduled_s
                live[1] -= 1
            elif keep_itl and track.last_token is not None:
                r.itl_s.append(now - track.last_token)
            track.last_token = now
            r.output_tokens += 1
            r.content_chunks += 1

    def finish(seq: Seq, track: _Track, now: float, error: str | None) -> None:
        del tracks[id(seq)]
        live[0] -= 1
        r = track.result
        if r.ttft_s is None:
            live[1] -= 1
        r.e2e_s = now - r.scheduled_s
        if error is not None:
            r.status, r.error = 500, error
        if track.routed.on_close is not None:
            track.routed.on_close(error is None)

    def land(index: int, req: TraceRequest) -> None:
        r = RequestResult(
            index=index, tag=req.tag, scheduled_s=req.at_s, sent_s=req.at_s, slo_ttft_s=req.slo_ttft_s
        )
        results.append(r)
        body = json.dumps(req.body, separators=(",", ":")).encode()
        started = time.process_time_ns()
        routed = router.route(index, req, body)
        stats.decision_cpu_ns.append(time.process_time_ns() - started)
        stats.decisions += 1
        if routed.later is not None:
            routed.later(lambda final: place(r, req, final))
        else:
            place(r, req, routed)

    def place(r: RequestResult, req: TraceRequest, routed: Routed) -> None:
        """The router's answer: refused (its status, as the load generator records it) or sent."""
        pod = routed.pod
        if pod is None:
            r.status, r.error = routed.status, routed.error or "refused"
            r.e2e_s = events.now - req.at_s
            return
        r.pod = pod.name
        try:
            _, seq = pod.pod.admit(req.body, "chat" if "messages" in req.body else "completion")
        except ApiError as exc:
            refuse(r, routed, exc.status, exc.message)
            return
        except ValueError as exc:
            refuse(r, routed, 400, str(exc))
            return
        r.status = 200
        if routed.on_response is not None:
            routed.on_response(200)
        tracks[id(seq)] = _Track(r, routed, events.now)
        live[0] += 1
        live[1] += 1
        kick(pod)

    def refuse(r: RequestResult, routed: Routed, status: int, message: str) -> None:
        r.status, r.error = status, message
        r.e2e_s = events.now - r.scheduled_s
        if routed.on_response is not None:
            routed.on_response(status)
        if routed.on_close is not None:
            routed.on_close(False)

    wall0, cpu0 = time.perf_counter(), time.process_time()
    router.start(events, pods)
    for i, req in enumerate(trace):
        events.at(req.at_s + gateway_s, LAND, functools.partial(land, i, req))
    landed_all = [False]
    last_landing = (trace[-1].at_s + gateway_s) if trace else 0.0

    def all_landed() -> None:
        landed_all[0] = True

    events.at(last_landing, LAND, all_landed)
    pending = 1 if until_first_tokens else 0
    events.run_until(limit_s, lambda: landed_all[0] and live[pending] == 0)
    for track in tracks.values():  # still running at the limit: the load generator's timeout
        if track.result.ttft_s is None or not until_first_tokens:
            track.result.error = "timeout"
            track.result.status = 0
    stats.wall_s = time.perf_counter() - wall0
    stats.cpu_s = time.process_time() - cpu0
    stats.simulated_s = events.now
    stats.engines = [engine_totals(p) for p in pods]
    results.sort(key=lambda r: r.index)
    return results, stats
