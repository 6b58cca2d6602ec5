"""Tracing switches and decision spans, with the SDK's in-memory exporter (no network)."""

from __future__ import annotations

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from bbr.router import BodyRouter
from bbr.service import BbrProcessor
from epp.datalayer.endpoint_records import Endpoint
from epp.datalayer.pool import Pool
from epp.requestcontrol.processor import EppProcessor
from extproc.errors import ErrorResponse
from extproc.stream import RequestRoute
from gateway.config import TracingConfig, parse_config
from gateway.tracing import Tracing, tracing_wanted
from tests.unit.test_epp_processor import CONFIG, body, make_ctx

TRACE_ID, CLIENT_SPAN = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
CLIENT = {"traceparent": f"00-{TRACE_ID}-{CLIENT_SPAN}-01", "x-gateway-model-name": "llama"}


@pytest.mark.parametrize(
    ("enabled", "env", "wanted"),
    [
        (False, {}, False),
        (True, {}, True),
        (False, {"OTEL_TRACES_EXPORTER": "console, otlp"}, True),
        (False, {"OTEL_TRACES_EXPORTER": "none"}, False),
        (True, {"OTEL_SDK_DISABLED": "TRUE"}, False),
        (False, {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_SDK_DISABLED": "true"}, False),
    ],
)
def test_tracing_is_off_unless_config_or_standard_env_turn_it_on(
    enabled: bool, env: dict[str, str], wanted: bool
) -> None:
    config = TracingConfig(enabled=enabled)
    assert tracing_wanted(config, env) is wanted
    tracing = Tracing.from_config(config, "svc", env)
    assert tracing.enabled is wanted
    tracing.shutdown()


def test_disabled_tracing_starts_no_span() -> None:
    assert Tracing().begin("epp.schedule", CLIENT) is None


def in_memory() -> tuple[Tracing, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return Tracing(provider), exporter


async def test_epp_span_continues_the_trace_and_the_upstream_request_carries_it() -> None:
    tracing, exporter = in_memory()
    ctx = make_ctx()
    ctx.tracing = tracing
    route = await EppProcessor(ctx).on_request(CLIENT, body())
    assert isinstance(route, RequestRoute)
    (span,) = exporter.get_finished_spans()
    assert format(span.context.trace_id, "032x") == TRACE_ID
    assert span.parent is not None and format(span.parent.span_id, "016x") == CLIENT_SPAN
    assert route.set_headers["traceparent"] == f"00-{TRACE_ID}-{span.context.span_id:016x}-01"
    assert span.attributes is not None
    assert span.attributes["gateway.endpoint"] == "10.0.0.1:8000"
    assert span.attributes["gateway.candidates"] == 2


async def test_epp_refusal_is_an_error_span_with_the_reason() -> None:
    tracing, exporter = in_memory()
    ctx = make_ctx()
    ctx.tracing = tracing
    ctx.pool = Pool([Endpoint("10.0.0.3:8000", frozenset({"qwen"}), frozenset())])  # no llama pod
    refusal = await EppProcessor(ctx).on_request(CLIENT, body())
    assert isinstance(refusal, ErrorResponse)
    (span,) = exporter.get_finished_spans()
    assert span.status.status_code is StatusCode.ERROR
    assert span.attributes is not None
    assert span.attributes["gateway.outcome"] == refusal.code == "no_endpoint_available"
    assert span.attributes["gateway.candidates"] == 0
    assert span.attributes["gateway.refusal_reason"]


async def test_bbr_span_names_the_rewrite_and_an_unsampled_trace_still_propagates() -> None:
    tracing, exporter = in_memory()
    proc = BbrProcessor(BodyRouter(lambda: CONFIG), lambda: CONFIG, tracing)
    route = await proc.on_request(CLIENT, body("sql"))
    assert isinstance(route, RequestRoute)
    (span,) = exporter.get_finished_spans()
    assert span.attributes is not None
    assert dict(span.attributes) == {
        "gen_ai.request.model": "sql",
        "gateway.model": "sql",
        "gateway.base_model": "llama",
        "gateway.adapter": "sql",
        "gateway.pool": "llama",
        "gateway.rewritten": False,
        "gateway.outcome": "routed",
    }
    unsampled = {"traceparent": f"00-{TRACE_ID}-{CLIENT_SPAN}-00"}
    route = await proc.on_request(unsampled, body("sql"))
    assert isinstance(route, RequestRoute)
    assert len(exporter.get_finished_spans()) == 1  # not recorded ...
    assert route.set_headers["traceparent"].startswith(f"00-{TRACE_ID}-")  # ... but passed on
    assert route.set_headers["traceparent"].endswith("-00")


def test_a_reload_that_changes_tracing_is_logged_as_needing_a_restart(
    caplog: pytest.LogCaptureFixture,
) -> None:
    base = {"pools": [{"name": "p", "models": [{"name": "m"}]}]}
    started = parse_config(base)
    check = Tracing().warn_on_change(started.tracing)
    check(parse_config(base))
    assert not caplog.records
    check(parse_config({**base, "tracing": {"enabled": True}}))
    assert "restarts" in caplog.text


def test_the_otlp_protos_are_opentelemetry_protos_own() -> None:
    """xds-protos ships an older copy of opentelemetry/proto/*; if it was installed over
    opentelemetry-proto, the OTLP exporter cannot even be imported (the Makefile installs
    opentelemetry-proto last for that reason)."""
    from opentelemetry.proto.common.v1 import common_pb2

    assert hasattr(common_pb2, "InstrumentationScope"), "opentelemetry-proto's files were overwritten"
