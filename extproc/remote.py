"""One deciding process, many ext_proc worker processes (extproc/ipc.py has the wire format).

`ProcessorHost` runs in the process that holds the picture (the EPP's `EppApp`): one service
`Processor` per worker stream, fed the events the worker forwards, exactly as the in-process
`ExtProcStream` would feed it. A worker connection that ends (the worker exited or was killed)
closes every stream it held as Envoy's end of stream would (`on_close(False)`), so in-flight
accounting never outlives the process that carried the request.

`SchedulerLink` and `RemoteProcessor` run in a worker: the `Processor` the worker's
`ExtProcServicer` drives, forwarding each event and awaiting the answer. A service may give
the worker its request-local first step (`Prepare`, e.g. the EPP's parse): its result crosses
with the request and the deciding side's `PreparedProcessor.on_prepared` starts after it. A worker that cannot
reach the deciding process fails the stream with UNAVAILABLE at once (never waits for it).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, cast, runtime_checkable

import grpc

from extproc import ipc
from extproc.errors import ErrorResponse
from extproc.stream import Processor, ProcessorFactory, RequestRoute, StreamAbort

log = logging.getLogger(__name__)


class _Connection(asyncio.Protocol):
    """Frames in and out of one socket; `on_message` gets each decoded message."""

    def __init__(self, on_message: Callable[[list[Any]], None], on_lost: Callable[[], None]) -> None:
        self._decoder = ipc.FrameDecoder()
        self._on_message = on_message
        self._on_lost = on_lost
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        try:
            messages = self._decoder.feed(data)
        except ipc.FrameError as exc:
            log.error("ext_proc worker link: %s; closing it", exc)
            if self.transport is not None:
                self.transport.abort()
            return
        for message in messages:
            self._on_message(message)

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self._on_lost()

    def send(self, message: list[Any]) -> bool:
        if self.transport is None or self.transport.is_closing():
            return False
        self.transport.write(ipc.encode(message))
        return True


# --- the deciding process -------------------------------------------------------------------


class _WorkerSession:
    """One worker's connection: its open streams, each with the service's own processor."""

    def __init__(self, host: ProcessorHost) -> None:
        self._host = host
        self.pid = 0
        self.requests = 0  # decisions asked for over this connection
        self._streams: dict[int, Processor] = {}
        self._pending: dict[int, asyncio.Task[RequestRoute | ErrorResponse]] = {}
        self.conn = _Connection(self._on_message, self._on_lost)

    @property
    def open_streams(self) -> int:
        return len(self._streams)

    def _on_message(self, message: list[Any]) -> None:
        kind = message[0]
        try:
            if kind == ipc.REQUEST:
                self._on_request(message[1], message[2], message[3], message[4] if len(message) > 4 else None)
            elif kind == ipc.RESPONSE_HEADERS:
                self._on_response_headers(message[1], message[2], bool(message[3]))
            elif kind == ipc.CLOSE:
                self._on_close(message[1], bool(message[2]))
            elif kind == ipc.HELLO:
                self.pid = int(message[1])
                self._host.on_hello(self)
            else:
                raise ipc.FrameError(f"unknown message kind {kind}")
        except (IndexError, TypeError, ValueError, ipc.FrameError) as exc:
            log.error("ext_proc worker %d sent a malformed message (%s); closing its link", self.pid, exc)
            if self.conn.transport is not None:
                self.conn.transport.abort()

    def _on_request(self, sid: int, headers: dict[str, str], body: bytes, prepared: Any) -> None:
        if sid in self._streams:
            raise ipc.FrameError(f"stream {sid} asked twice")
        processor = self._host.factory()
        self._streams[sid] = processor
        self.requests += 1
        if prepared is not None and isinstance(processor, PreparedProcessor):
            decision = processor.on_prepared(headers, body, prepared)
        else:
            decision = processor.on_request(headers, body)
        task = asyncio.get_running_loop().create_task(decision)
        self._pending[sid] = task
        task.add_done_callback(lambda t: self._answer(sid, t))

    def _answer(self, sid: int, task: asyncio.Task[RequestRoute | ErrorResponse]) -> None:
        self._pending.pop(sid, None)
        if task.cancelled():  # the stream closed while it was being decided
            return
        exc = task.exception()
        if exc is not None:
            log.error("deciding stream %d of worker %d failed", sid, self.pid, exc_info=exc)
            self.conn.send([ipc.FAILED, sid, f"the decision failed: {type(exc).__name__}"])
            return
        outcome = task.result()
        if isinstance(outcome, ErrorResponse):
            self.conn.send(ipc.refuse_message(sid, outcome))
        else:
            processor = self._streams.get(sid)
            answers = getattr(processor, "answers_response_headers", True)  # unknown: ask
            self.conn.send(ipc.route_message(sid, outcome, answers))

    def _on_response_headers(self, sid: int, headers: dict[str, str], wants_reply: bool) -> None:
        processor = self._streams.get(sid)
        extra = None
        if processor is not None:
            answer = processor.on_response_headers(headers)
            if not isinstance(answer, dict) and answer is not None:
                raise ipc.FrameError("a deciding processor must answer response headers at once")
            extra = answer
        if wants_reply:
            self.conn.send([ipc.HEADERS_REPLY, sid, extra])

    def _on_close(self, sid: int, completed: bool) -> None:
        processor = self._streams.pop(sid, None)
        if processor is None:
            return
        task = self._pending.pop(sid, None)
        if task is not None and not task.done():
            # Envoy gave up while the request was being decided (e.g. waiting in the flow
            # queue): cancel it, as the in-process stream's cancellation would, then close.
            task.cancel()
            task.add_done_callback(lambda _: _close(processor, completed))
            return
        _close(processor, completed)

    def _on_lost(self) -> None:
        """The worker is gone: every stream it held ends now."""
        streams = list(self._streams)
        if streams:
            log.warning(
                "ext_proc worker %d left with %d open stream(s): releasing them", self.pid, len(streams)
            )
        for sid in streams:
            self._on_close(sid, False)
        self._host.on_lost(self)


@runtime_checkable
class PreparedProcessor(Protocol):
    """A processor whose request-local first step (parsing the body) may run in the worker:
    `on_prepared` gets the worker's result (`Prepare`'s) beside the headers and body, and
    decides exactly as `on_request` would after doing that step itself."""

    async def on_prepared(
        self, headers: dict[str, str], body: bytes, prepared: Any
    ) -> RequestRoute | ErrorResponse: ...


# A worker's request-local step: (headers, body, the deciding process's settings) -> what
# crosses the link beside them (msgpack-able), or None to send the request as it is.
Prepare = Callable[[dict[str, str], bytes, dict[str, Any]], Any]


def _close(processor: Processor, completed: bool) -> None:
    try:
        processor.on_close(completed)
    except Exception:  # accounting must never take the link down with it
        log.exception("on_close failed")


class ProcessorHost:
    """The deciding side: a Unix socket that workers connect to; `factory` makes the service's
    processor for each stream (the same factory its in-process `ExtProcServicer` would use)."""

    def __init__(self, factory: ProcessorFactory, settings: Callable[[], dict[str, Any]]) -> None:
        self.factory = factory
        self._settings = settings
        self.sessions: set[_WorkerSession] = set()
        self._server: asyncio.AbstractServer | None = None
        self.path = ""

    async def start(self, path: str) -> None:
        self.path = path
        loop = asyncio.get_running_loop()
        self._server = await loop.create_unix_server(self._accept, path)

    def _accept(self) -> _Connection:
        session = _WorkerSession(self)
        self.sessions.add(session)
        return session.conn

    def on_hello(self, session: _WorkerSession) -> None:
        session.conn.send([ipc.SETTINGS, self._settings()])

    def on_lost(self, session: _WorkerSession) -> None:
        self.sessions.discard(session)

    def push_settings(self) -> None:
        """Tell every worker the settings it applies itself (a reload changed them)."""
        settings = self._settings()
        for session in self.sessions:
            session.conn.send([ipc.SETTINGS, settings])

    @property
    def open_streams(self) -> int:
        return sum(s.open_streams for s in self.sessions)

    def debug(self) -> list[dict[str, int]]:
        return sorted(
            ({"pid": s.pid, "requests": s.requests, "open_streams": s.open_streams} for s in self.sessions),
            key=lambda d: d["pid"],
        )

    async def stop(self) -> None:
        """Close the socket and every link (their open streams are released)."""
        if self._server is not None:
            self._server.close()
        for session in list(self.sessions):
            if session.conn.transport is not None:
                session.conn.transport.abort()
        for _ in range(100):  # connection_lost runs on a later loop turn: its releases first
            if not self.sessions:
                break
            await asyncio.sleep(0.01)
        if self.path:
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass


# --- a worker ---------------------------------------------------------------------------------


class SchedulerUnavailable(Exception):
    """The link to the deciding process is down."""


class SchedulerLink:
    """A worker's one connection to the deciding process: requests out, answers back by
    stream id. `connected` while up; `on_change(up)` is told when that changes (health)."""

    def __init__(self, path: str, on_change: Callable[[bool], None] | None = None) -> None:
        self.path = path
        self.max_body_bytes = 0  # until the first SETTINGS: nothing is accepted
        self.settings: dict[str, Any] = {}  # the last SETTINGS (a new object at each change)
        self._ids = itertools.count(1)
        self._waiting: dict[int, asyncio.Future[list[Any]]] = {}
        self._conn: _Connection | None = None
        self._lost = asyncio.Event()
        self._ready = asyncio.Event()
        self._on_change = on_change

    @property
    def connected(self) -> bool:
        return self._ready.is_set()

    def next_id(self) -> int:
        return next(self._ids)

    async def connect(self) -> None:
        """One attempt; raises OSError when the socket is not there. Returns once SETTINGS came."""
        loop = asyncio.get_running_loop()
        self._lost.clear()
        conn = _Connection(self._on_message, self._on_lost)
        await loop.create_unix_connection(lambda: conn, self.path)
        self._conn = conn
        conn.send([ipc.HELLO, os.getpid()])
        lost = asyncio.ensure_future(self._lost.wait())
        ready = asyncio.ensure_future(self._ready.wait())
        await asyncio.wait([lost, ready], return_when=asyncio.FIRST_COMPLETED)
        lost.cancel()
        ready.cancel()
        if not self._ready.is_set():
            raise OSError("the deciding process closed the link before its settings")

    async def wait_connected(self) -> None:
        await self._ready.wait()

    async def wait_lost(self) -> None:
        await self._lost.wait()

    def close(self) -> None:
        if self._conn is not None and self._conn.transport is not None:
            self._conn.transport.close()

    def _on_message(self, message: list[Any]) -> None:
        kind = message[0]
        if kind == ipc.SETTINGS:
            self.settings = message[1]
            self.max_body_bytes = int(message[1]["max_body_bytes"])
            if not self._ready.is_set():
                self._ready.set()
                if self._on_change is not None:
                    self._on_change(True)
            return
        future = self._waiting.pop(message[1], None)
        if future is not None and not future.done():
            future.set_result(message)

    def _on_lost(self) -> None:
        was_up = self._ready.is_set()
        self._ready.clear()
        self._conn = None
        waiting, self._waiting = self._waiting, {}
        for future in waiting.values():
            if not future.done():
                future.set_exception(SchedulerUnavailable("the link to the deciding process was lost"))
        self._lost.set()
        if was_up and self._on_change is not None:
            self._on_change(False)

    def send(self, message: list[Any]) -> None:
        if self._conn is None or not self._ready.is_set() or not self._conn.send(message):
            raise SchedulerUnavailable("no link to the deciding process")

    async def call(self, sid: int, message: list[Any]) -> list[Any]:
        """Send `message` about stream `sid` and await the answer about it."""
        self.send(message)
        future: asyncio.Future[list[Any]] = asyncio.get_running_loop().create_future()
        self._waiting[sid] = future
        try:
            return await future
        finally:
            self._waiting.pop(sid, None)


UNREACHABLE = "the EPP worker cannot reach its scheduling process"


class RemoteProcessor:
    """A worker stream's processor: every event goes to the deciding process."""

    def __init__(self, link: SchedulerLink, prepare: Prepare | None = None) -> None:
        self._link = link
        self._prepare = prepare  # the service's request-local step, run here (PreparedProcessor)
        self.max_body_bytes = link.max_body_bytes
        self._sid = 0  # set once the request was handed over
        self._answers_headers = False  # the decision said response headers may get an answer

    async def on_request(self, headers: dict[str, str], body: bytes) -> RequestRoute | ErrorResponse:
        sid = self._link.next_id()
        prepared = self._prepare(headers, body, self._link.settings) if self._prepare is not None else None
        try:
            self._sid = sid
            answer = await self._link.call(sid, [ipc.REQUEST, sid, headers, body, prepared])
        except SchedulerUnavailable:
            self._sid = 0  # nothing to close there
            raise StreamAbort(grpc.StatusCode.UNAVAILABLE, UNREACHABLE) from None
        if answer[0] == ipc.FAILED:
            raise StreamAbort(grpc.StatusCode.INTERNAL, str(answer[2]))
        if answer[0] == ipc.ROUTE:
            self._answers_headers = bool(answer[7])
        return ipc.decision_from(answer)

    def on_response_headers(
        self, headers: dict[str, str]
    ) -> dict[str, str] | Awaitable[dict[str, str] | None] | None:
        """Reported in order (a retry's move, the prefill slot's release happen there before
        the close); awaited only when the decision may answer with headers."""
        if not self._sid:
            return None
        if not self._answers_headers:
            try:
                self._link.send([ipc.RESPONSE_HEADERS, self._sid, headers, False])
            except SchedulerUnavailable:  # the request's accounting ended with the link
                pass
            return None
        return self._answered_headers(headers)

    async def _answered_headers(self, headers: dict[str, str]) -> dict[str, str] | None:
        try:
            answer = await self._link.call(self._sid, [ipc.RESPONSE_HEADERS, self._sid, headers, True])
        except SchedulerUnavailable:
            return None
        extra: dict[str, str] | None = answer[2]
        return extra

    def on_response_body(self, chunk: bytes, end_of_stream: bool) -> None:
        return None

    def on_close(self, completed: bool) -> None:
        if not self._sid:
            return
        sid, self._sid = self._sid, 0
        try:
            self._link.send([ipc.CLOSE, sid, completed])
        except SchedulerUnavailable:  # released there when the link dropped
            pass
