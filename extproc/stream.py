"""One ext_proc stream: the per-request state machine both services share.

Envoy runs the request body in FULL_DUPLEX_STREAMED mode: it sends the request headers,
then body chunks (and possibly trailers). We hold the headers until the body is complete,
hand the whole request to the service's `Processor`, then answer with a headers response
(header changes, corrected content-length, routing metadata) followed by the body
re-emitted in chunks of at most 1 MiB (`messages.MAX_CHUNK_BYTES`).

BUFFERED mode is supported too, because Envoy honours `failure_mode_allow` (FailOpen) only
there: headers are acknowledged at once, the whole body arrives in one message, and the
routing decision rides on the body response. The stream learns the mode from the
`protocol_config` Envoy sends with its first message. Response events, when Envoy is configured
to send them, are passed on for accounting and acknowledged unchanged; in
FULL_DUPLEX_STREAMED response mode (the mode Envoy AI Gateway and kgateway configure for
InferencePool routes) each body chunk is handed back as a streamed response, since Envoy then
forwards only what the processor returns.

`Processor.on_close` runs exactly once per stream, whatever happens (normal end, client
abort, Envoy reset, protocol error): that is where in-flight accounting is returned. The EPP's
routes ask for response trailers so that Envoy keeps the stream until the HTTP response ends
(see `gateway.envoy.routes.pool_processing_mode`); an HTTP/1.1 answer without trailers sends no
further message, so Envoy closing the stream is the only end-of-response signal.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import grpc
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

from extproc import messages
from extproc.errors import ErrorResponse, too_large
from extproc.headers import SERVED_HEADER

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class RequestRoute:
    """A processor's answer for a request it lets through."""

    set_headers: dict[str, str] = field(default_factory=dict)
    remove_headers: tuple[str, ...] = ()
    metadata: dict[str, dict[str, str]] = field(default_factory=dict)
    clear_route_cache: bool = False
    body: bytes | None = None  # a replacement body; None forwards the original


class Processor(Protocol):
    """What a service implements; one instance per stream (see `ProcessorFactory`)."""

    max_body_bytes: int

    async def on_request(self, headers: dict[str, str], body: bytes) -> RequestRoute | ErrorResponse: ...

    def on_response_headers(
        self, headers: dict[str, str]
    ) -> dict[str, str] | Awaitable[dict[str, str] | None] | None:
        """Observe the response status; may return headers to set on the response (or an
        awaitable of them: a worker asks the deciding process, extproc/remote.py). The
        endpoint that served the request, when the gateway reports it, is under
        `SERVED_HEADER` (as the reference EPP hands it to its plugins)."""
        ...

    def on_response_body(self, chunk: bytes, end_of_stream: bool) -> None: ...

    def on_close(self, completed: bool) -> None:
        """Always called once. `completed`: a response event carried end of stream (False on
        abort, reset or protocol error, and also for a normal end that sent no further event)."""
        ...


ProcessorFactory = Callable[[], Processor]


class RequestOnlyProcessor:
    """Base for processors that act on the request alone (BBR, benchmark pickers): the
    response hooks acknowledge and account nothing."""

    max_body_bytes: int

    def on_response_headers(self, headers: dict[str, str]) -> dict[str, str] | None:
        return None

    def on_response_body(self, chunk: bytes, end_of_stream: bool) -> None:
        return None

    def on_close(self, completed: bool) -> None:
        return None


class _Phase(enum.Enum):
    EXPECT_HEADERS = "expect_headers"
    COLLECTING_BODY = "collecting_body"
    FORWARDED = "forwarded"  # request answered; only response events may follow
    REFUSED = "refused"  # immediate response sent


class ProtocolViolation(Exception):
    """Envoy (or a fuzzer) sent a message that makes no sense in the current phase."""


class StreamAbort(Exception):
    """A processor cannot serve this stream (a worker lost its deciding process): the stream
    ends with this gRPC status, and Envoy applies the route's failure mode."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class ExtProcStream:
    """Drive one stream: feed it ProcessingRequests, it yields ProcessingResponses."""

    def __init__(self, processor: Processor) -> None:
        self.processor = processor
        self._phase = _Phase.EXPECT_HEADERS
        self._headers: dict[str, str] = {}
        self._chunks: list[bytes] = []
        self._size = 0
        self._buffered = False
        self._duplex_response = False  # response bodies in FULL_DUPLEX_STREAMED: echo each chunk
        self.completed = False

    async def handle(self, msg: pb.ProcessingRequest) -> AsyncIterator[pb.ProcessingResponse]:
        if msg.HasField("protocol_config"):
            modes = processing_mode_pb2.ProcessingMode
            self._buffered = msg.protocol_config.request_body_mode == modes.BUFFERED
            self._duplex_response = msg.protocol_config.response_body_mode == modes.FULL_DUPLEX_STREAMED
        kind = msg.WhichOneof("request")
        if self._phase is _Phase.REFUSED:
            return  # Envoy may still flush queued chunks after an immediate response
        if kind == "request_headers":
            async for r in self._on_request_headers(msg.request_headers):
                yield r
        elif kind == "request_body":
            async for r in self._on_request_body(msg.request_body):
                yield r
        elif kind == "request_trailers":
            async for r in self._on_request_trailers():
                yield r
        elif kind in ("response_headers", "response_body", "response_trailers"):
            for r in await self._on_response(msg, kind):
                yield r
        else:
            raise ProtocolViolation(f"unsupported ext_proc message {kind!r}")

    async def _on_response(self, msg: pb.ProcessingRequest, kind: str) -> list[pb.ProcessingResponse]:
        """Acknowledge response events; only a forwarded request's are the processor's business.

        A response before our request phase finished is a local reply from an earlier filter
        (e.g. BBR refusing a body): it still passes through this filter's encoder path.
        """
        forwarded = self._phase is _Phase.FORWARDED
        if kind == "response_headers":
            extra = None
            if forwarded:
                headers = messages.headers_to_dict(msg.response_headers)
                # What the gateway reports, never what the upstream sent under that name.
                headers.pop(SERVED_HEADER, None)
                served = messages.served_endpoint(msg)
                if served:
                    headers[SERVED_HEADER] = served
                answer = self.processor.on_response_headers(headers)
                extra = await answer if isinstance(answer, Awaitable) else answer
                self.completed = self.completed or msg.response_headers.end_of_stream
            return [messages.continue_response_headers(extra)]
        if kind == "response_body":
            body = msg.response_body
            if forwarded:
                self.processor.on_response_body(body.body, body.end_of_stream)
                self.completed = self.completed or body.end_of_stream
            if self._duplex_response:
                return [messages.echo_response_body(body.body, body.end_of_stream)]
            return [messages.continue_response_body()]
        if forwarded:
            self.completed = True
        return [messages.continue_response_trailers()]

    def _expect(self, phase: _Phase, kind: str) -> None:
        if self._phase is not phase:
            raise ProtocolViolation(f"{kind} received in phase {self._phase.value}")

    async def _on_request_headers(self, headers: pb.HttpHeaders) -> AsyncIterator[pb.ProcessingResponse]:
        self._expect(_Phase.EXPECT_HEADERS, "request_headers")
        self._headers = messages.headers_to_dict(headers)
        if headers.end_of_stream:  # e.g. a GET: no body will follow
            async for r in self._finish_request(trailers_follow=False, has_body=False):
                yield r
        else:
            self._phase = _Phase.COLLECTING_BODY
            if self._buffered:  # the decision waits for the buffered body
                yield messages.request_headers_response({}, (), clear_route_cache=False)

    async def _on_request_body(self, body: pb.HttpBody) -> AsyncIterator[pb.ProcessingResponse]:
        self._expect(_Phase.COLLECTING_BODY, "request_body")
        data = body.body  # each read of a bytes field copies it out of the (upb) message: once
        self._size += len(data)
        limit = self.processor.max_body_bytes
        if self._size > limit:
            self._chunks.clear()
            self._phase = _Phase.REFUSED
            yield messages.immediate_response(too_large(limit), self._headers.get(":path"))
            return
        if data:
            self._chunks.append(data)
        if body.end_of_stream:
            async for r in self._finish_request(trailers_follow=False, has_body=True):
                yield r

    async def _on_request_trailers(self) -> AsyncIterator[pb.ProcessingResponse]:
        self._expect(_Phase.COLLECTING_BODY, "request_trailers")
        async for r in self._finish_request(trailers_follow=True, has_body=True):
            yield r
        if self._phase is _Phase.FORWARDED:
            yield messages.request_trailers_response()

    async def _finish_request(
        self, *, trailers_follow: bool, has_body: bool
    ) -> AsyncIterator[pb.ProcessingResponse]:
        body = b"".join(self._chunks)
        self._chunks.clear()
        outcome = await self.processor.on_request(self._headers, body)
        if isinstance(outcome, ErrorResponse):
            self._phase = _Phase.REFUSED
            yield messages.immediate_response(outcome, self._headers.get(":path"))
            return
        self._phase = _Phase.FORWARDED
        if self._buffered and has_body:
            yield messages.buffered_body_response(
                outcome.set_headers,
                outcome.remove_headers,
                clear_route_cache=outcome.clear_route_cache,
                metadata=outcome.metadata,
                body=outcome.body,
            )
            return
        out_body = body if outcome.body is None else outcome.body
        set_headers = dict(outcome.set_headers)
        if has_body:
            set_headers["content-length"] = str(len(out_body))
        yield messages.request_headers_response(
            set_headers,
            outcome.remove_headers,
            clear_route_cache=outcome.clear_route_cache,
            metadata=outcome.metadata,
        )
        if has_body:
            for r in messages.streamed_body_responses(out_body, trailers_follow=trailers_follow):
                yield r

    @property
    def echoes_response_body(self) -> bool:
        """Response bodies come here in FULL_DUPLEX_STREAMED mode and must be handed back."""
        return self._duplex_response

    @property
    def refused(self) -> bool:
        return self._phase is _Phase.REFUSED

    @property
    def forwarded(self) -> bool:
        """The request was answered: only response events (or Envoy's close) may follow."""
        return self._phase is _Phase.FORWARDED


def _message(read: Any) -> pb.ProcessingRequest | None:
    """A `context.read()` result: the message, or None at the end of the stream."""
    return None if read is grpc.aio.EOF else read


class ExtProcServicer:
    """The gRPC `ExternalProcessor` service: one `ExtProcStream` per call.

    Once a request is forwarded, its stream is held until Envoy closes it at the end of the
    response, which can be minutes for a streamed answer. `release_held` (on drain) ends those
    streams with an OK status rather than letting the server's grace period cancel them:
    Envoy takes a clean close as "no more processing" and the response carries on, whereas a
    cancelled stream is a gRPC error, which Envoy answers by resetting the response.
    """

    def __init__(self, factory: ProcessorFactory, *, name: str) -> None:
        self._factory = factory
        self._name = name
        self.active_streams = 0
        self._held: set[asyncio.Future[Any]] = set()
        self._draining = False

    async def Process(
        self, request_iterator: AsyncIterator[pb.ProcessingRequest], context: grpc.aio.ServicerContext
    ) -> None:
        """One stream, read and written through the call's `context` (`read` / `write`) rather
        than the request iterator and an async generator of responses: one layer less per
        message each way (docs/benchmarks/costs.md, "The request path's own cost")."""
        stream = ExtProcStream(self._factory())
        self.active_streams += 1
        read, write = context.read, context.write
        try:
            while True:
                if stream.forwarded:
                    msg = await self._next_held(read, releasable=not stream.echoes_response_body)
                else:
                    msg = await read()
                if msg is None or msg is grpc.aio.EOF:
                    return
                async for response in stream.handle(msg):
                    await write(response)
                if stream.refused:
                    return
        except ProtocolViolation as exc:
            log.warning("%s: ext_proc protocol violation: %s", self._name, exc)
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
        except StreamAbort as exc:
            await context.abort(exc.code, exc.message)
        finally:
            self.active_streams -= 1
            try:
                stream.processor.on_close(stream.completed)
            except Exception:  # accounting must never take the stream down with it
                log.exception("%s: on_close failed", self._name)

    async def _next_held(
        self, read: Callable[[], Awaitable[Any]], *, releasable: bool = True
    ) -> pb.ProcessingRequest | None:
        """The next response event of a forwarded request; None once Envoy ends the stream or
        the service drains. A stream that hands response bodies back (FULL_DUPLEX_STREAMED) is
        not releasable: ending it early would cut the response, so it runs until Envoy ends it
        or the server's grace period does."""
        if self._draining and releasable:
            return None
        waiter: asyncio.Future[Any] = asyncio.ensure_future(read())
        if not releasable:
            return _message(await waiter)
        self._held.add(waiter)
        try:
            return _message(await waiter)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if self._draining and waiter.cancelled() and task is not None and not task.cancelling():
                return None  # released by `release_held`, not cancelled by gRPC
            raise
        finally:
            self._held.discard(waiter)

    @property
    def held_streams(self) -> int:
        """Streams of forwarded requests waiting for their response to end."""
        return len(self._held)

    def release_held(self) -> int:
        """Drain: end every stream that only waits for its response to end, and any that gets
        there from now on. Returns how many were released."""
        self._draining = True
        held = list(self._held)
        for waiter in held:
            waiter.cancel()
        return len(held)
