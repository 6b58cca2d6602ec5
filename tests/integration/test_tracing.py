"""Tracing through the real Envoy: BBR and EPP decision spans reach an OTLP/gRPC receiver, in
the client's trace, and the model server receives a traceparent of that trace."""

from __future__ import annotations

import secrets
from collections.abc import Iterator

import httpx
import pytest

from devstack.launch import FAST_FLEET, LocalGateway, pool_name_for, start_local_gateway
from tests.fakes.otlp_receiver import OtlpReceiver, ReceivedSpan
from tests.integration.conftest import chat
from tests.waiting import until

LLAMA = "llama-3.1-8b-instruct"


@pytest.fixture(scope="module")
def receiver() -> Iterator[OtlpReceiver]:
    r = OtlpReceiver()
    r.start()
    try:
        yield r
    finally:
        r.stop()


def _traced(
    tmp_path_factory: pytest.TempPathFactory, receiver: OtlpReceiver, single_hop: bool
) -> Iterator[LocalGateway]:
    with pytest.MonkeyPatch.context() as env:
        env.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")  # the SDK's batch delay (5 s by default)
        env.delenv("OTEL_SDK_DISABLED", raising=False)
        gw = start_local_gateway(
            tmp_path_factory.mktemp("traced"),
            fleet=FAST_FLEET,
            config_extra={"tracing": {"enabled": True, "endpoint": f"http://127.0.0.1:{receiver.port}"}},
            single_hop=single_hop,
        )
    try:
        yield gw
    finally:
        gw.stop()


@pytest.fixture(scope="module")
def traced_gateway(
    tmp_path_factory: pytest.TempPathFactory, receiver: OtlpReceiver
) -> Iterator[LocalGateway]:
    yield from _traced(tmp_path_factory, receiver, single_hop=False)


@pytest.fixture(scope="module")
def traced_single_hop(
    tmp_path_factory: pytest.TempPathFactory, receiver: OtlpReceiver
) -> Iterator[LocalGateway]:
    yield from _traced(tmp_path_factory, receiver, single_hop=True)


def format_trace(spans: list[ReceivedSpan]) -> str:
    """One span per block, parents first: what docs/observability.md shows."""
    by_id = {s.span_id: s for s in spans}

    def depth(s: ReceivedSpan) -> int:
        return 0 if s.parent_span_id not in by_id else 1 + depth(by_id[s.parent_span_id])

    lines = []
    for s in sorted(spans, key=depth):
        pad = "  " * depth(s)
        lines.append(
            f"{pad}{s.name}  service={s.service} trace={s.trace_id} span={s.span_id} "
            f"parent={s.parent_span_id or '-'} status={s.status_code} duration={s.duration_ms:.3f}ms"
        )
        lines += [f"{pad}  {k} = {v!r}" for k, v in sorted(s.attributes.items())]
    return "\n".join(lines)


def _traceparent() -> tuple[str, str, str]:
    trace_id, parent = secrets.token_hex(16), secrets.token_hex(8)
    return trace_id, parent, f"00-{trace_id}-{parent}-01"


async def _spans(receiver: OtlpReceiver, trace_id: str, names: set[str]) -> dict[str, ReceivedSpan]:
    await until(lambda: names <= {s.name for s in receiver.spans(trace_id)}, f"spans {names}", within=30)
    return {s.name: s for s in receiver.spans(trace_id)}


async def test_one_request_is_traced_from_client_to_model_server(
    traced_gateway: LocalGateway, receiver: OtlpReceiver
) -> None:
    trace_id, client_span, traceparent = _traceparent()
    async with traced_gateway.client() as client:
        r = await client.post(
            "/v1/chat/completions", json=chat("sql-lora"), headers={"traceparent": traceparent}
        )
    assert r.status_code == 200, r.text
    spans = await _spans(receiver, trace_id, {"bbr.route", "epp.schedule"})
    print("\n" + format_trace(list(spans.values())))  # the trace shown in docs/observability.md
    bbr, epp = spans["bbr.route"], spans["epp.schedule"]
    pool = pool_name_for(LLAMA)

    assert bbr.parent_span_id == client_span  # continued from the client's traceparent
    assert bbr.service == "inference-gateway-bbr"
    assert bbr.attributes == {
        "gen_ai.request.model": "sql-lora",
        "gateway.model": "sql-lora",
        "gateway.base_model": LLAMA,
        "gateway.adapter": "sql-lora",
        "gateway.pool": pool,
        "gateway.rewritten": False,
        "gateway.outcome": "routed",
    }

    assert epp.parent_span_id == bbr.span_id  # BBR's header mutation carried its span on
    assert epp.service == "inference-gateway-epp"
    a = epp.attributes
    pod = next(p for p in traced_gateway.pods if p["name"] == r.headers["x-modelsim-pod"])
    assert a["gateway.endpoint"] == pod["address"] == a["gateway.destination"]
    assert (a["gateway.pool"], a["gen_ai.request.model"], a["gateway.target_model"]) == (
        pool,
        "sql-lora",
        LLAMA,
    )
    assert a["gateway.adapter"] == "sql-lora"
    assert a["gateway.profile"] == "default"
    assert a["gateway.candidates"] == len(traced_gateway.pods_of(LLAMA)) == 2
    assert a["gateway.outcome"] == "routed"
    assert 0 < a["gateway.scheduling_time_ms"] < 1000
    scores = {k.removeprefix("gateway.score."): v for k, v in a.items() if k.startswith("gateway.score.")}
    assert {"total", "predicted-ttft", "kv-cache", "precise-prefix-cache"} <= set(scores), scores
    assert epp.status_code == 0

    # The model server got the EPP's span as its parent: same trace, one hop further.
    async with httpx.AsyncClient(base_url=f"http://{pod['address']}") as sim:
        state = (await sim.get("/sim/state")).json()
    assert f"00-{trace_id}-{epp.span_id}-01" in state["recent_traceparents"]


async def test_a_request_without_traceparent_starts_a_trace_the_model_server_joins(
    traced_gateway: LocalGateway, receiver: OtlpReceiver
) -> None:
    async with traced_gateway.client() as client:
        r = await client.post("/v1/chat/completions", json=chat(LLAMA, "no trace context"))
    assert r.status_code == 200, r.text
    pod = next(p for p in traced_gateway.pods if p["name"] == r.headers["x-modelsim-pod"])
    async with httpx.AsyncClient(base_url=f"http://{pod['address']}") as sim:
        latest = (await sim.get("/sim/state")).json()["recent_traceparents"][-1]
    _, trace_id, parent, _ = latest.split("-")
    spans = await _spans(receiver, trace_id, {"bbr.route", "epp.schedule"})
    assert spans["bbr.route"].parent_span_id == ""  # a new root
    assert spans["epp.schedule"].span_id == parent


async def test_a_refused_request_is_an_error_span_with_its_reason(
    traced_gateway: LocalGateway, receiver: OtlpReceiver
) -> None:
    trace_id, client_span, traceparent = _traceparent()
    async with traced_gateway.client() as client:
        r = await client.post(
            "/v1/chat/completions", json=chat("no-such-model"), headers={"traceparent": traceparent}
        )
    assert r.status_code == 404
    spans = await _spans(receiver, trace_id, {"bbr.route"})
    bbr = spans["bbr.route"]
    assert bbr.parent_span_id == client_span
    assert bbr.status_code == 2  # STATUS_CODE_ERROR
    assert bbr.attributes["gateway.outcome"] == "model_not_found"
    assert bbr.attributes["http.response.status_code"] == 404
    assert "epp.schedule" not in spans  # BBR answered; no pool was asked


async def test_single_hop_is_one_span_with_the_routing_and_the_decision(
    traced_single_hop: LocalGateway, receiver: OtlpReceiver
) -> None:
    trace_id, client_span, traceparent = _traceparent()
    async with traced_single_hop.client() as client:
        r = await client.post(
            "/v1/chat/completions", json=chat("sql-lora"), headers={"traceparent": traceparent}
        )
        refused_trace, _, refused_parent = _traceparent()
        refused = await client.post(
            "/v1/chat/completions", json=chat("no-such-model"), headers={"traceparent": refused_parent}
        )
    assert r.status_code == 200, r.text
    assert refused.status_code == 404
    spans = await _spans(receiver, trace_id, {"epp.schedule"})
    assert set(spans) == {"epp.schedule"}  # no BBR hop, so no BBR span
    epp = spans["epp.schedule"]
    assert epp.parent_span_id == client_span and epp.service == "inference-gateway-epp"
    a = epp.attributes
    pod = next(p for p in traced_single_hop.pods if p["name"] == r.headers["x-modelsim-pod"])
    assert a["gateway.endpoint"] == pod["address"] == a["gateway.destination"]
    assert (a["gen_ai.request.model"], a["gateway.model"], a["gateway.target_model"]) == (
        "sql-lora",
        "sql-lora",
        LLAMA,
    )
    assert (a["gateway.pool"], a["gateway.adapter"], a["gateway.rewritten"]) == (
        pool_name_for(LLAMA),
        "sql-lora",
        False,
    )
    assert a["gateway.outcome"] == "routed" and "gateway.score.total" in a
    async with httpx.AsyncClient(base_url=f"http://{pod['address']}") as sim:
        state = (await sim.get("/sim/state")).json()
    assert f"00-{trace_id}-{epp.span_id}-01" in state["recent_traceparents"]
    refusal = (await _spans(receiver, refused_trace, {"epp.schedule"}))["epp.schedule"]
    assert refusal.status_code == 2  # STATUS_CODE_ERROR
    assert refusal.attributes["gateway.outcome"] == "model_not_found"
    assert refusal.attributes["http.response.status_code"] == 404
