"""One lean Redis connection that runs one Lua script: the shared-state loop's round trip.

redis-py's asyncio client spends most of such a call in per-call machinery on the event loop
(connection checkout, retry wrapper, a task per timed write, timeout contexts, an awaited
read per reply element without hiredis): bench/micro/shared_state_bench.py measures it. Here the
command is encoded into one bytes object, written with one `transport.write`, and the reply
is parsed by hiredis (C) in `data_received`; a timer per call bounds the wait. One command is
in flight at a time (the caller awaits each). A timeout or a lost connection closes the
connection (a late reply would answer the wrong call) and the next call connects again, so a
restarted Redis is picked up by the caller's own cadence. EVALSHA first; a Redis that does
not know the script (restarted, flushed) gets it once with EVAL.

`Subscription` is the same lean connection in subscribe mode: the shared state's pushed picks
arrive on it as they are published.

The URL is read by redis-py's own parser (`redis://`, `rediss://`, `unix://`, user,
password, db, `ssl_cert_reqs` / `ssl_ca_certs` for TLS).
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import ssl
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, cast

import hiredis
from redis.connection import SSLConnection, parse_url
from redis.exceptions import ResponseError


def encode_command(parts: Sequence[bytes]) -> bytes:
    """A RESP array of bulk strings (what Redis reads as one command)."""
    return b"*%d\r\n" % len(parts) + b"".join([b"$%d\r\n%b\r\n" % (len(p), p) for p in parts])


def _ssl_context(params: dict[str, Any]) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=params.get("ssl_ca_certs"))
    if str(params.get("ssl_cert_reqs", "required")).lower() in ("none", "cert_none"):
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    return context


class _Protocol(asyncio.Protocol):
    """Feeds bytes to hiredis and hands each complete reply to the oldest waiting call; a
    reply no call waits for (a subscribed channel's message) goes to `on_push`."""

    def __init__(self, on_push: Callable[[Any], None] | None = None) -> None:
        self.reader = hiredis.Reader(replyError=ResponseError)
        self.waiting: deque[asyncio.Future[Any]] = deque()
        self.transport: asyncio.Transport | None = None
        self.on_push = on_push
        self.lost = asyncio.Event()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's are not subclasses

    def data_received(self, data: bytes) -> None:
        try:
            self.reader.feed(data)
            while (reply := self.reader.gets()) is not False:
                if self.waiting:
                    future = self.waiting.popleft()
                    if not future.done():
                        future.set_result(reply)
                elif self.on_push is not None:
                    self.on_push(reply)
        except hiredis.ProtocolError as exc:
            self._fail(ConnectionError(f"redis protocol error: {exc}"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self._fail(ConnectionError(f"redis connection lost: {exc or 'closed by the server'}"))

    def _fail(self, exc: Exception) -> None:
        self.lost.set()
        while self.waiting:
            future = self.waiting.popleft()
            if not future.done():
                future.set_exception(exc)
        if self.transport is not None:
            self.transport.abort()
            self.transport = None

    def close(self) -> None:
        self._fail(ConnectionError("redis connection closed"))


def _expire(future: asyncio.Future[Any], timeout_s: float) -> None:
    if not future.done():
        future.set_exception(TimeoutError(f"no redis reply within {timeout_s * 1000:.0f} ms"))


class ScriptConnection:
    """Runs `script` on the Redis at `url`; every wait (connect, each reply) bounded by `timeout_s`."""

    def __init__(self, url: str, script: str, timeout_s: float) -> None:
        self._params = parse_url(url)
        self._script = script.encode()
        self._sha = hashlib.sha1(self._script).hexdigest().encode()
        self._timeout = timeout_s
        self._protocol: _Protocol | None = None

    async def evalsha(self, keys: Sequence[bytes], args: Sequence[bytes]) -> Any:
        """The script's reply; raises ResponseError for a script error, OSError or
        TimeoutError when Redis cannot be reached or answered too late."""
        tail = [b"%d" % len(keys), *keys, *args]
        reply = await self.request(encode_command([b"EVALSHA", self._sha, *tail]))
        if isinstance(reply, ResponseError) and str(reply).startswith("NOSCRIPT"):
            reply = await self.request(encode_command([b"EVAL", self._script, *tail]))
        if isinstance(reply, ResponseError):
            raise reply
        return reply

    async def request(self, command: bytes) -> Any:
        """Send one encoded command and wait for its reply (an error reply is returned as a
        ResponseError, not raised)."""
        protocol = self._protocol
        if protocol is None or protocol.transport is None:
            protocol = await self._connect()
        return await self._send(protocol, command)

    async def _send(self, protocol: _Protocol, command: bytes) -> Any:
        transport = protocol.transport
        if transport is None:
            raise ConnectionError("redis connection lost")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        protocol.waiting.append(future)
        transport.write(command)
        timer = loop.call_later(self._timeout, _expire, future, self._timeout)
        try:
            return await future
        except BaseException:  # timed out, lost, or the caller cancelled: the stream is out of step
            protocol.close()
            if self._protocol is protocol:
                self._protocol = None
            raise
        finally:
            timer.cancel()

    async def _connect(self, on_push: Callable[[Any], None] | None = None) -> _Protocol:
        self.close()
        loop = asyncio.get_running_loop()
        params = self._params
        factory = functools.partial(_Protocol, on_push)
        if "path" in params:
            connecting = loop.create_unix_connection(factory, params["path"])
        else:
            tls = _ssl_context(params) if params.get("connection_class") is SSLConnection else None
            connecting = loop.create_connection(
                factory, params.get("host", "localhost"), params.get("port", 6379), ssl=tls
            )
        _, protocol = await asyncio.wait_for(connecting, self._timeout)
        try:
            setup: list[list[bytes]] = []
            if params.get("password") is not None:
                user = params.get("username")
                auth = [user.encode()] if user else []
                setup.append([b"AUTH", *auth, str(params["password"]).encode()])
            if params.get("db"):
                setup.append([b"SELECT", b"%d" % int(params["db"])])
            for command in setup:
                reply = await self._send(protocol, encode_command(command))
                if isinstance(reply, ResponseError):
                    raise reply
        except BaseException:
            protocol.close()
            raise
        self._protocol = protocol
        return protocol

    def close(self) -> None:
        if self._protocol is not None:
            self._protocol.close()
            self._protocol = None


class Subscription:
    """One connection subscribed to `channel`: each message's payload goes to `on_message`
    on the event loop as it arrives (no task, no queue). Same URL handling and timeouts as
    `ScriptConnection`, whose connect it reuses."""

    def __init__(
        self, url: str, channel: bytes, timeout_s: float, on_message: Callable[[bytes], None]
    ) -> None:
        self._connection = ScriptConnection(url, "", timeout_s)
        self._channel = channel
        self._on_message = on_message

    def _push(self, reply: Any) -> None:
        if (
            isinstance(reply, list)
            and len(reply) == 3
            and reply[0] == b"message"
            and isinstance(reply[2], bytes)
        ):
            self._on_message(reply[2])

    async def run(self) -> None:
        """Subscribe, then deliver until the connection is lost: raises ConnectionError then
        (OSError or TimeoutError when Redis cannot be reached), for the caller to retry."""
        protocol = await self._connection._connect(on_push=self._push)
        try:
            reply = await self._connection._send(protocol, encode_command([b"SUBSCRIBE", self._channel]))
            if isinstance(reply, ResponseError):
                raise reply
            await protocol.lost.wait()
        finally:
            self._connection.close()
        raise ConnectionError("redis subscription lost")

    def close(self) -> None:
        self._connection.close()
