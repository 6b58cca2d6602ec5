"""OpenTelemetry spans for the gateway's routing decisions (BBR and EPP), off by default.

Each service builds one `Tracing` at start. Off (the default), `begin` returns None and the
processors skip every other tracing step, so a request pays one attribute test and the SDK is
never imported. On, a decision span continues the W3C `traceparent` the request carries (the
client's, or the one the previous filter set) and `finish` returns the `traceparent` /
`tracestate` headers to set on the upstream request: the EPP's span becomes the child of
BBR's, and the model server receives the EPP's span as its parent. Spans leave through the
SDK's batch processor (export runs on its own thread, never on the request path) to an
OTLP/gRPC collector.

On: `tracing.enabled: true` in the config, or the standard `OTEL_TRACES_EXPORTER=otlp`;
`OTEL_SDK_DISABLED=true` turns it off whatever else says. A config field left unset falls back
to the variable the SDK reads itself (OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT,
OTEL_TRACES_SAMPLER[_ARG], OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES, OTEL_BSP_*).
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Union

from extproc.errors import ErrorResponse
from extproc.stream import RequestRoute
from gateway.config import GatewayConfig, TracingConfig

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Span

log = logging.getLogger(__name__)

# What OpenTelemetry accepts as an attribute value.
AttributeValue = Union[str, bool, int, float, Sequence[str], Sequence[int], Sequence[float]]  # noqa: UP007
Attributes = Mapping[str, AttributeValue]


def tracing_wanted(config: TracingConfig, environ: Mapping[str, str] = os.environ) -> bool:
    """The config's switch or the standard exporter variable; the SDK's kill switch wins."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporters = {e.strip().lower() for e in environ.get("OTEL_TRACES_EXPORTER", "").split(",")}
    return config.enabled or "otlp" in exporters


class Tracing:
    """One service's tracer; `Tracing()` is the disabled one."""

    def __init__(self, provider: TracerProvider | None = None, scope: str = "inference-gateway") -> None:
        self._provider = provider
        self.enabled = provider is not None
        if provider is not None:  # the SDK is imported only when tracing is on
            from opentelemetry import trace
            from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

            self._tracer = provider.get_tracer(scope)
            self._propagator = TraceContextTextMapPropagator()
            self._in_context = trace.set_span_in_context
            self._error = trace.StatusCode.ERROR

    @classmethod
    def from_config(
        cls, config: TracingConfig, service: str, environ: Mapping[str, str] = os.environ
    ) -> Tracing:
        """`service` names the process (`inference-gateway-epp`) unless config or env name it."""
        if not tracing_wanted(config, environ):
            return cls()
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

        resource: dict[str, str] = {}
        if config.service_name is not None:
            resource["service.name"] = config.service_name
        elif "OTEL_SERVICE_NAME" not in environ:
            resource["service.name"] = service
        sampler = None if config.sample_ratio is None else ParentBased(TraceIdRatioBased(config.sample_ratio))
        provider = TracerProvider(resource=Resource.create(resource), sampler=sampler)
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=config.endpoint)))
        log.info("tracing on: OTLP/gRPC to %s", config.endpoint or "the OTEL_EXPORTER_OTLP_* endpoint")
        return cls(provider, scope=service)

    def begin(self, name: str, headers: Mapping[str, str]) -> Span | None:
        """Start a decision span continuing the request's trace; None when tracing is off."""
        if not self.enabled:
            return None
        return self._tracer.start_span(name, context=self._propagator.extract(headers))

    def finish(
        self, span: Span, describe: Callable[[], Attributes], error: str | None = None
    ) -> dict[str, str]:
        """End `span` (attributes built only if it is sampled) and return the trace headers that
        carry it to the next hop."""
        if span.is_recording():
            span.set_attributes(describe())
            if error is not None:
                span.set_status(self._error, error)
        span.end()
        carrier: dict[str, str] = {}
        self._propagator.inject(carrier, context=self._in_context(span))
        return carrier

    def finish_route(
        self,
        span: Span | None,
        outcome: RequestRoute | ErrorResponse,
        describe: Callable[[], Attributes],
    ) -> RequestRoute | ErrorResponse:
        """End a decision's span (if any) and, for a route, set the trace headers that make the
        next hop (the EPP, or the model server) continue from it. An error marks the span."""
        if span is None:
            return outcome
        error = outcome.code if isinstance(outcome, ErrorResponse) else None
        trace_headers = self.finish(span, describe, error)
        if isinstance(outcome, ErrorResponse):
            return outcome
        return dataclasses.replace(outcome, set_headers={**outcome.set_headers, **trace_headers})

    def warn_on_change(self, started_with: TracingConfig) -> Callable[[GatewayConfig], None]:
        """A config-store listener: tracing is set up once, so say when a reload changes it."""

        def check(config: GatewayConfig) -> None:
            if config.tracing != started_with:
                log.warning("the tracing settings changed; they take effect when the process restarts")

        return check

    def shutdown(self) -> None:
        """Flush spans still queued (on process stop)."""
        if self._provider is not None:
            self._provider.shutdown()
