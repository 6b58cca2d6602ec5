"""#54: a scorer with state of its own is one class in one module and one catalogue row.

`AwaitingFirstToken` below is that module's whole plugin: the request control's lifecycle
hooks (routed, first token, finished, aborted) keep its per-pod count, `prepare` reads it once
per decision and `score` ranks by it. Its profile names its own filters. Nothing else in the
EPP changes for it: no context field, no scheduler edit, no wiring in epp/app.py.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator, Sequence

import pytest

from epp.app import build_scheduler
from epp.datalayer.endpoint_records import Endpoint, EndpointState, Metrics
from epp.datalayer.pool import Pool
from epp.requestcontrol.context import EppContext
from epp.requestcontrol.header_policy import HeaderPolicy
from epp.requestcontrol.processor import EppProcessor
from epp.requestcontrol.telemetry import Telemetry
from epp.scheduling.plugins.base import ScorerPlugin
from epp.scheduling.request import InferenceRequest
from epp.scheduling.scorers import ScoringContext
from extproc.headers import DESTINATION_HEADER, SERVED_HEADER
from extproc.stream import RequestRoute
from gateway import plugin_catalogue
from gateway.config import GatewayConfig, parse_config
from gateway.plugin_catalogue import PluginRow

A, B = "10.0.0.1:8000", "10.0.0.2:8000"


class AwaitingFirstToken(ScorerPlugin):
    """1 / (1 + requests this EPP sent to the pod whose response has not begun).

    State: request id -> pod, from `on_routed` until its first token, its end or its abort.
    """

    def __init__(self, row: PluginRow) -> None:
        super().__init__(row)
        self.awaiting: dict[str, str] = {}
        self._counts: list[int] = []

    def on_routed(self, request: InferenceRequest, address: str) -> None:
        self.awaiting[request.request_id] = address

    def on_first_token(self, request: InferenceRequest, address: str) -> None:
        self.awaiting.pop(request.request_id, None)

    def on_finished(self, request: InferenceRequest, address: str) -> None:
        self.awaiting.pop(request.request_id, None)

    def prepare(
        self, request: InferenceRequest, candidates: Sequence[EndpointState], ctx: ScoringContext
    ) -> None:
        per_pod = Counter(self.awaiting.values())
        self._counts = [per_pod[c.address] for c in candidates]

    def score(
        self, request: InferenceRequest, candidates: Sequence[EndpointState], ctx: ScoringContext
    ) -> list[float]:
        return [1.0 / (1.0 + n) for n in self._counts]


ROW = PluginRow("scorer", "awaiting-first-token", f"{__name__}:AwaitingFirstToken")


def config(filters: list[str] | None) -> GatewayConfig:
    waits: dict[str, object] = {"weights": {"awaiting-first-token": 1}}
    if filters is not None:
        waits["filters"] = filters
    return parse_config(
        {
            "pools": [{"name": "llama", "models": [{"name": "llama"}]}],
            "profiles": {"waits": waits},
            "defaultProfile": "waits",
        }
    )


@pytest.fixture
def row() -> Iterator[PluginRow]:
    with plugin_catalogue.add(ROW) as added:
        yield added


def make_ctx(cfg: GatewayConfig) -> EppContext:
    """Two pods; B's queue is over the saturation threshold (the `unsaturated` filter drops it)."""
    pool = Pool([Endpoint(A, frozenset({"llama"})), Endpoint(B, frozenset({"llama"}))])
    for address, waiting in ((A, 0.0), (B, 50.0)):
        pool.record_metrics(address, Metrics(waiting=waiting, scraped_at=pool.snapshot().taken_at))
    scheduler = build_scheduler(cfg)
    return EppContext(
        "llama", pool, scheduler, lambda: cfg, Telemetry("llama"), HeaderPolicy.from_config(cfg)
    )


def body(n: int) -> bytes:
    return json.dumps({"model": "llama", "messages": [{"role": "user", "content": f"q{n}"}]}).encode()


async def route(ctx: EppContext, n: int) -> tuple[EppProcessor, str]:
    proc = EppProcessor(ctx)
    out = await proc.on_request({"x-request-id": f"r{n}"}, body(n))
    assert isinstance(out, RequestRoute)
    return proc, out.set_headers[DESTINATION_HEADER].split(",")[0]


def plugin(ctx: EppContext) -> AwaitingFirstToken:
    found = ctx.scheduler.plugins.scorer("awaiting-first-token")  # type: ignore[attr-defined]
    assert isinstance(found, AwaitingFirstToken)
    return found


async def test_a_stateful_scorer_learns_from_the_hooks_and_ranks_by_it(row: PluginRow) -> None:
    ctx = make_ctx(config(["serving"]))  # its own filters: no `unsaturated`, so B stays a candidate
    state = plugin(ctx)

    first, x = await route(ctx, 1)  # a tie: either pod
    assert state.awaiting == {"r1": x}
    y = B if x == A else A
    second, got = await route(ctx, 2)
    assert got == y  # x waits for a first token, y does not
    assert state.awaiting == {"r1": x, "r2": y}

    first.on_response_headers({":status": "200"})  # x's response began
    assert state.awaiting == {"r2": y}
    _, got = await route(ctx, 3)
    assert got == x

    second.on_close(False)  # aborted before any response: the plugin hears it (finished's default)
    first.on_close(True)
    assert state.awaiting == {"r3": x}
    _, got = await route(ctx, 4)
    assert got == y

    # A configuration reload rebuilds the scheduler; the plugin object, and what it learned, stay.
    ctx.scheduler = build_scheduler(ctx.config(), previous=ctx.scheduler)  # type: ignore[arg-type]
    assert plugin(ctx) is state and state.awaiting == {"r3": x, "r4": y}


async def test_without_its_own_filters_a_profile_runs_the_catalogues(row: PluginRow) -> None:
    ctx = make_ctx(config(None))
    for n in range(3):
        _, got = await route(ctx, n)
        assert got == A  # `unsaturated` left only A, however many requests wait there
    assert Counter(plugin(ctx).awaiting.values()) == {A: 3}


def test_a_profile_names_only_filters_of_the_catalogue(row: PluginRow) -> None:
    with pytest.raises(ValueError, match="unknown filter 'no-such-filter'"):
        config(["serving", "no-such-filter"])
    with pytest.raises(ValueError, match="named twice"):
        config(["serving", "serving"])


class Ledger(AwaitingFirstToken):
    """The same plugin, logging every hook it hears."""

    def __init__(self, row: PluginRow) -> None:
        super().__init__(row)
        self.heard: list[tuple[str, str, str]] = []

    def on_routed(self, request: InferenceRequest, address: str) -> None:
        self.heard.append(("routed", request.request_id, address))

    def on_first_token(self, request: InferenceRequest, address: str) -> None:
        self.heard.append(("first token", request.request_id, address))

    def on_finished(self, request: InferenceRequest, address: str) -> None:
        self.heard.append(("finished", request.request_id, address))

    def on_aborted(self, request: InferenceRequest, address: str) -> None:
        self.heard.append(("aborted", request.request_id, address))


async def test_a_retry_elsewhere_is_aborted_there_and_routed_on_the_pod_that_served() -> None:
    with plugin_catalogue.add(PluginRow("scorer", "awaiting-first-token", f"{__name__}:Ledger")):
        ctx = make_ctx(config(["serving"]))
        heard = plugin(ctx).heard  # type: ignore[attr-defined]
        proc, first = await route(ctx, 1)
        other = B if first == A else A
        proc.on_response_headers({":status": "200", SERVED_HEADER: other})  # Envoy retried there
        proc.on_close(True)
        failed, chosen = await route(ctx, 2)
        failed.on_response_headers({":status": "503"})
        failed.on_close(True)
    assert heard == [
        ("routed", "r1", first),
        ("aborted", "r1", first),
        ("routed", "r1", other),
        ("first token", "r1", other),
        ("finished", "r1", other),
        ("routed", "r2", chosen),
        ("aborted", "r2", chosen),  # a 5xx: no first token
    ]
