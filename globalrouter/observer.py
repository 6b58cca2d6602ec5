"""The observer: a second ext_proc filter that watches responses for the router filter.

Why a second filter: Envoy ignores `mode_override` when a filter's request body mode is
FULL_DUPLEX_STREAMED (which the router filter needs), so the router filter cannot switch on
response bodies per request; and two ext_proc filters both processing one response lost body
data in our tests. So the router filter handles only the request, and this filter (request
events skipped) handles only the response: headers always (passive health), the streamed
body only on the `x-global-meter` route variant, whose per-route override turns bodies on
(read after the router filter chose the route). It learns the member, tenant and prompt
estimate from the router filter's dynamic metadata, forwarded by Envoy, so it works
whichever router replica serves this stream.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator

from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

from extproc import messages
from globalrouter.processor import ROUTE_NAMESPACE, UPSTREAM_HEADER, RouterContext
from globalrouter.usage import UsageMeter

log = logging.getLogger(__name__)


class ObserverStream:
    def __init__(self, ctx: RouterContext) -> None:
        self._ctx = ctx
        self._member = ""
        self._tenant = ""
        self._saw_headers = False
        self._meter: UsageMeter | None = None
        self._charged = False

    def handle(self, msg: pb.ProcessingRequest) -> list[pb.ProcessingResponse]:
        kind = msg.WhichOneof("request")
        if kind == "response_headers":
            self._on_headers(msg)
            return [messages.continue_response_headers()]
        if kind == "response_body":
            if self._meter is not None:
                self._meter.feed(msg.response_body.body, msg.response_body.end_of_stream)
                if msg.response_body.end_of_stream:
                    self._charge()
            return [messages.continue_response_body()]
        if kind == "response_trailers":
            self._charge()
            return [messages.continue_response_trailers()]
        # Request events only reach us if the filter is misconfigured: let them through untouched.
        if kind == "request_headers":
            return [messages.request_headers_response({}, (), clear_route_cache=False)]
        if kind == "request_body":
            return [pb.ProcessingResponse(request_body=pb.BodyResponse())]
        return [messages.request_trailers_response()]

    def _on_headers(self, msg: pb.ProcessingRequest) -> None:
        fields = msg.metadata_context.filter_metadata[ROUTE_NAMESPACE].fields

        def text(key: str) -> str:
            return fields[key].string_value if key in fields else ""

        self._member, self._tenant = text("member"), text("tenant")
        if not self._member or self._saw_headers:
            return  # a reply the router filter did not route (e.g. Envoy's own error)
        self._saw_headers = True
        headers = messages.headers_to_dict(msg.response_headers)
        status = int(headers[":status"]) if headers.get(":status", "").isdigit() else 0
        book, now = self._ctx.book, self._ctx.clock()
        try:
            book.observe_ttft(self._member, time.time() - float(text("routed_unix_ms")) / 1000)
        except ValueError:
            pass
        served_by = book.member_at(headers.get(UPSTREAM_HEADER, ""))
        if served_by is not None and served_by != self._member:
            # Envoy could not reach the chosen member and retried on another one.
            self._outcome(self._member, False, now, hard=True)
            self._outcome(served_by, status < 500, now)
        else:
            self._outcome(self._member, 0 < status < 500, now)
        if text("metered") != "1" or not 200 <= status < 300:
            return
        prompt = text("prompt_tokens")
        streaming = (
            headers.get("content-type", "").startswith("text/event-stream") or text("streaming") == "1"
        )
        self._meter = UsageMeter(streaming=streaming, prompt_estimate=int(prompt) if prompt.isdigit() else 0)
        if msg.response_headers.end_of_stream:
            self._meter.feed(b"", True)
            self._charge()

    def _outcome(self, member: str, ok: bool, now: float, *, hard: bool = False) -> None:
        self._ctx.book.record_outcome(member, ok, now, hard=hard)
        self._ctx.telemetry.outcomes.labels(member, "true" if ok else "false").inc()

    def _charge(self) -> None:
        """Charge once; also on close, so an aborted stream still pays for what it got."""
        if self._charged or self._meter is None or self._ctx.limiter is None:
            return
        self._charged = True
        if not self._meter.done:
            self._meter.feed(b"", True)
        tokens = self._meter.tokens
        self._ctx.telemetry.tokens.inc(tokens)
        self._ctx.spawn(self._ctx.limiter.charge_tokens(self._tenant, tokens))

    def close(self) -> None:
        self._charge()


async def observe(
    ctx: RouterContext, requests: AsyncIterator[pb.ProcessingRequest]
) -> AsyncIterator[pb.ProcessingResponse]:
    stream = ObserverStream(ctx)
    try:
        async for msg in requests:
            for response in stream.handle(msg):
                yield response
    finally:
        try:
            stream.close()
        except Exception:
            log.exception("observer: close failed")
