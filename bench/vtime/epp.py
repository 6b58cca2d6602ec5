"""The EPP in virtual time: `epp.app.EppApp` itself, one per pool, fed by the loop's events.

Built from the gateway configuration the real-time `epp-*` targets write
(`devstack.launch.gateway_config_for` with `bench.harness.gateway_policies.epp_config`), constructed
with no event loop running, so it starts no scrape task, server or watcher. Then:

- its pool, residency and scheduler read the run's virtual clock (`Pool.clock`,
  `AdapterResidency.clock`), converted to the EPP's seconds (simulated / time_scale);
  its scheduler and scraper random sources are seeded;
- each pod is scraped at the scraper's own cadence (`Scraper.next_delay`: fast while busy or
  changing, doubling while idle, jittered, the first one at a random phase), its rendered page
  recorded `scrape_age_s` later through `Scraper.record_page` (the live parse, speeds,
  prefill pace and the app's scrape hook, which feeds adapter residency); a request routed to
  a pod in an idle sleep scrapes it at once (the live `routed_hook` wake);
- each request runs through a fresh `EppProcessor` as Envoy drives it: `on_request` (parse,
  pick with the profile's scorers, admission, `on_routed`) at landing, `on_response_headers`
  when the pod answers, `on_close` when its stream ends;
- a decision that waits in the flow-control queue is parked on the pool's `VirtualFlow`
  (bench/vtime/flow.py: the production controller, resumed when its dispatcher routes the
  request or at its deadline) and answers the loop then. Any other wait (a tokenizer off the
  loop) raises: the loop has no event loop to wait on.

KV events are not fed (the real-time `epp-default` runs had none either).
"""

from __future__ import annotations

import random
import tempfile
import time
from collections.abc import Callable, Coroutine, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import yaml

from bench.harness.gateway_policies import profile_record
from bench.harness.workloads import TraceRequest
from bench.vtime.flow import Park, VirtualFlow
from bench.vtime.loop import TIMER, Events, Routed
from bench.vtime.pods import SimPod
from bench.vtime.shared_store import DEFAULT_RTT_MS, VirtualSharedStore
from devstack.launch import gateway_config_for
from epp.app import EppApp
from epp.datalayer.endpoint_records import Endpoint, Metrics
from epp.datalayer.scrape import SpeedTracker
from epp.requestcontrol.parse import WorkerParser
from epp.requestcontrol.processor import EppProcessor
from extproc import ipc
from extproc.errors import ErrorResponse
from extproc.headers import DESTINATION_HEADER, MODEL_HEADER, SERVED_HEADER
from extproc.stream import RequestRoute
from gateway.config import parse_config

T = TypeVar("T")
DEFAULT_SCRAPE_AGE_S = 0.002  # a page's age when recorded: HTTP round trip plus parse, wall seconds
VIRTUAL_REDIS = "redis://virtual-store:6379"  # sharedState.redis of virtual replicas: never dialled
REPLICA_SEED_STRIDE = 10_000_000  # replica r's random sources: seed * 1000 + r * stride + ...


def run_now(coro: Coroutine[Any, Any, T]) -> T | Park:
    """Run the EPP's decision to its result, or to the flow-control wait it parks at (then the
    coroutine is left suspended there). Any other suspension is not simulable."""
    try:
        yielded = coro.send(None)
    except StopIteration as stop:
        return stop.value
    if isinstance(yielded, Park):
        return yielded
    coro.close()
    raise RuntimeError("the EPP's decision waited on something but its flow-control queue: not simulable")


class _PodScrapes:
    """One pod's scrape loop state (the live loop's locals)."""

    __slots__ = ("address", "idle", "interval", "pending", "pod", "previous", "speed")

    def __init__(self, pod: SimPod, interval: float) -> None:
        self.pod = pod
        self.address = pod.address
        self.speed = SpeedTracker()
        self.interval = interval
        self.previous: Metrics | None = None
        self.pending = 0  # generation of the queued scrape; a wake bumps it, voiding the old one
        self.idle = False  # the queued scrape ends a sleep longer than the fast interval


class _Replica:
    """One EPP replica: its apps (one per pool) and its scrape loops' state."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.apps: dict[str, EppApp] = {}
        self.scrapes: dict[str, _PodScrapes] = {}
        self.endpoints: dict[str, Endpoint] = {}
        self.pool_of: dict[str, EppApp] = {}


class VirtualEpp:
    """Every pool's EPP for one run; routes like BBR (model -> pool) then that pool's EPP.

    `replicas` > 1: that many independent EPPs (each its own apps, scrape loops and seeded
    random sources), sharing state through `VirtualSharedStore` (bench/vtime/shared_store.py)
    as `sharedState` configures them; each request goes to one replica as Envoy gives ext_proc
    streams out: round-robin over the replicas, from a random offset of the router seed."""

    name = "epp"

    def __init__(
        self,
        config: Mapping[str, Any],
        *,
        seed: int,
        time_scale: float = 1.0,
        scrape_age_s: float = DEFAULT_SCRAPE_AGE_S,
        label: str = "epp-default",
        replicas: int = 1,
        store_rtt_ms: float = DEFAULT_RTT_MS,
        workers: int = 0,
    ) -> None:
        if replicas < 1:
            raise ValueError("replicas must be >= 1")
        if workers < 0:
            raise ValueError("workers must be >= 0")
        self.name = label
        self._config = dict(config)
        if replicas > 1 and self._config.get("sharedState") is None:
            self._config["sharedState"] = {"redis": VIRTUAL_REDIS}
        self._seed = seed
        self._ts = time_scale
        self._age = scrape_age_s
        self._replicas = [_Replica(r) for r in range(replicas)]
        self._turn = random.Random(seed).randrange(replicas) if replicas > 1 else 0
        self._rtt_ms = store_rtt_ms
        # `epp.workers`: each replica's ext_proc workers, taking requests in turn (the live
        # workers share one port: which one gets a stream does not matter, they hold no state).
        self._parsers = [WorkerParser() for _ in range(workers)]
        self._settings: dict[int, dict[str, Any]] = {}  # per app: what SETTINGS carries
        self.store: VirtualSharedStore | None = None
        self._routes: dict[str, str] = {}  # model (base or adapter) -> pool name
        self._events: Events | None = None
        self._by_address: dict[str, SimPod] = {}
        self.pick_cpu_ns: list[int] = []  # process time of each WeightedScheduler.pick

    # ---- setup ------------------------------------------------------------------------------
    def start(self, events: Events, pods: Sequence[SimPod]) -> None:
        self._events = events
        self._by_address = {p.address: p for p in pods}
        config = gateway_config_for([p.describe() for p in pods], {}, self._config)
        parsed = parse_config(config)
        self._routes = {model: route.pool for model, route in parsed.routes().items()}
        if len(self._replicas) > 1:
            self.store = VirtualSharedStore(events, self._ts, self._rtt_ms)
        with tempfile.TemporaryDirectory(prefix="vtime-epp-") as work:
            path = Path(work) / "gateway.yaml"
            path.write_text(yaml.safe_dump(config, sort_keys=False))
            for replica in self._replicas:
                for i, pool in enumerate(parsed.pools):
                    replica.apps[pool.name] = app = EppApp(path, pool.name)  # no loop: nothing starts
                    self._wire(replica, app, i)
        for replica in self._replicas:
            for app in replica.apps.values():
                fast = app.scraper.cadence.fast_s
                for ep in app.pool.endpoints():
                    replica.endpoints[ep.address] = ep
                    replica.pool_of[ep.address] = app
                    pod = self._by_address[ep.address]
                    state = replica.scrapes[ep.address] = _PodScrapes(pod, fast)
                    phase = app.scraper.rng.random() * fast  # the live loop's random first phase
                    self._schedule(replica, app, state, events.now + phase * self._ts, idle=False)
        if self.store is not None:
            for replica in self._replicas:
                for name, app in replica.apps.items():
                    assert app.shared_state is not None
                    self.store.attach(name, app.shared_state)

    def _wire(self, replica: _Replica, app: EppApp, index: int) -> None:
        clock = self._epp_clock
        app.pool.clock = clock
        app.scheduler.residency.clock = clock
        app.scheduler.memory.clock = clock
        base = self._seed * 1000 + replica.index * REPLICA_SEED_STRIDE
        app.scheduler.rng = random.Random(base + index)
        app.scraper.rng = random.Random(base + 500 + index)
        app.pool.routed_hook = lambda address: self._wake(replica, address)
        if app.shared_state is not None:
            app.shared_state.replica_id = f"replica-{replica.index}"
        assert self._events is not None
        flow = VirtualFlow(app.store.current().flow_control, self._events, self._ts)
        app.flow = app.ctx.flow = flow
        app.pool.capacity_hook = flow.signal
        pick = app.scheduler.pick  # the production pick, timed: the CPU a decision's scoring costs

        def timed_pick(request: Any, snapshot: Any) -> Any:
            started = time.process_time_ns()
            decision = pick(request, snapshot)
            self.pick_cpu_ns.append(time.process_time_ns() - started)
            return decision

        app.scheduler.pick = timed_pick  # type: ignore[method-assign]

    def _epp_clock(self) -> float:
        """The EPP's monotonic clock: simulated seconds / time_scale (it lives in wall time)."""
        assert self._events is not None
        return self._events.now / self._ts

    def config(self) -> dict[str, object]:
        app = next(iter(self._replicas[0].apps.values()))
        config = app.store.current()
        profile = config.scheduler_profiles()[config.default_profile]
        out: dict[str, object] = {
            "kind": "virtual",
            "epp": "epp.app.EppApp, EppProcessor per request",
            "default_profile": config.default_profile,
            "profile": profile_record(profile),
            "scrape": config.scrape.model_dump(by_alias=True),
            "scrape_age_s": self._age,
            "kv_events": False,
            "flow_control": config.flow_control.model_dump(by_alias=True),
        }
        if self.store is not None:
            states = [a.shared_state for r in self._replicas for a in r.apps.values() if a.shared_state]
            out["replicas"] = len(self._replicas)
            out["replica_routing"] = "round-robin per request from a random offset (Envoy's ext_proc cluster)"
            out["shared_store"] = self.store.config(states)
        return out

    # ---- scrapes ----------------------------------------------------------------------------
    def _schedule(self, replica: _Replica, app: EppApp, state: _PodScrapes, at: float, *, idle: bool) -> None:
        assert self._events is not None
        state.pending += 1
        state.idle = idle
        generation = state.pending
        self._events.at(at, TIMER, lambda: self._scrape(replica, app, state, generation))

    def _scrape(self, replica: _Replica, app: EppApp, state: _PodScrapes, generation: int) -> None:
        if generation != state.pending:
            return  # replaced by a wake
        assert self._events is not None
        state.pending += 1  # nothing queued until the page is recorded
        state.idle = False  # a scrape in flight is not a sleep a routed request could end
        page, sent_at = state.pod.page(), self._epp_clock()
        self._events.at(
            self._events.now + self._age * self._ts,
            TIMER,
            lambda: self._record(replica, app, state, page, sent_at),
        )

    def _record(
        self, replica: _Replica, app: EppApp, state: _PodScrapes, page: bytes, sent_at: float
    ) -> None:
        metrics = app.scraper.record_page(replica.endpoints[state.address], page, state.speed, sent_at)
        delay, state.interval = app.scraper.next_delay(state.address, state.interval, state.previous, metrics)
        state.previous = metrics
        next_at = max(self._epp_clock(), sent_at + delay)  # the live loop sleeps delay - elapsed
        self._schedule(replica, app, state, next_at * self._ts, idle=delay > app.scraper.cadence.fast_s)

    def _wake(self, replica: _Replica, address: str) -> None:
        """A request was routed to `address`: end its idle sleep (Scraper.wake)."""
        state = replica.scrapes.get(address)
        if state is None or not state.idle or self._events is None:
            return
        self._schedule(replica, replica.pool_of[address], state, self._events.now, idle=False)

    # ---- requests ---------------------------------------------------------------------------
    def route(self, index: int, req: TraceRequest, body: bytes) -> Routed:
        model = req.body.get("model")
        pool = self._routes.get(model) if isinstance(model, str) else None
        if pool is None or not isinstance(model, str):  # BBR's answer for a model no pool serves
            return Routed(None, 404, "model_not_found")
        headers = {
            ":method": "POST",
            ":path": "/v1/chat/completions" if "messages" in req.body else "/v1/completions",
            "x-request-id": f"req-{index}",
            **req.headers,
            MODEL_HEADER: model,
        }
        replica = self._replicas[self._turn % len(self._replicas)]
        self._turn += 1
        app = replica.apps[pool]
        processor = EppProcessor(app.ctx)
        if self._parsers:
            decision = processor.on_prepared(*self._through_worker(index, app, headers, body))
        else:
            decision = processor.on_request(headers, body)
        outcome = run_now(decision)
        if isinstance(outcome, Park):
            flow = app.flow
            assert isinstance(flow, VirtualFlow)

            def later(answer: Callable[[Routed], None]) -> None:
                flow.park(decision, outcome, lambda final: answer(self._answer(processor, final)))

            return Routed(None, later=later)
        return self._answer(processor, outcome)

    def _through_worker(
        self, index: int, app: EppApp, headers: dict[str, str], body: bytes
    ) -> tuple[dict[str, str], bytes, Any]:
        """What the deciding process receives from a worker for this request: the worker's
        parse (epp/requestcontrol/parse.py `WorkerParser`, with the settings the app sends its workers) and
        the REQUEST frame encoded and decoded as the Unix socket carries it (extproc/ipc.py)."""
        settings = self._settings.get(id(app))
        if settings is None:
            settings = self._settings[id(app)] = {"parse": app.ctx.parse_hints().to_wire()}
        prepared = self._parsers[index % len(self._parsers)](headers, body, settings)
        (frame,) = ipc.FrameDecoder().feed(ipc.encode([ipc.REQUEST, index, headers, body, prepared]))
        _, _, wire_headers, wire_body, wire_prepared = frame
        return wire_headers, wire_body, wire_prepared

    def _answer(self, processor: EppProcessor, outcome: RequestRoute | ErrorResponse) -> Routed:
        """The EPP's answer as the loop takes it: a refusal's status, or the pod and callbacks."""
        if isinstance(outcome, ErrorResponse):
            return Routed(None, outcome.status, outcome.code)
        address = outcome.set_headers[DESTINATION_HEADER].split(",", 1)[0]

        def on_response(status: int) -> None:
            processor.on_response_headers({":status": str(status), SERVED_HEADER: address})

        return Routed(self._by_address[address], on_response=on_response, on_close=processor.on_close)

    def flow_outcomes(self) -> dict[str, dict[str, int]]:
        """Requests that left each pool's flow-control queue, per band and outcome (its metrics)."""
        counts: dict[str, dict[str, int]] = {}
        for app in (a for r in self._replicas for a in r.apps.values()):
            for metric in app.flow.metrics.outcomes.collect():
                for sample in metric.samples:
                    if sample.name.endswith("_total") and sample.value:
                        band = counts.setdefault(sample.labels["band"], {})
                        outcome = sample.labels["outcome"]
                        band[outcome] = band.get(outcome, 0) + int(sample.value)
        return counts
