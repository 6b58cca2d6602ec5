"""A minimal HTTP/1.1 keep-alive GET client for `/metrics`, on a raw asyncio protocol.

Why not httpx: measured on a 38 KB vLLM page (bench/micro/scrape_bench.py), an httpx GET costs
~1 ms of CPU, aiohttp ~0.2 ms and this client ~0.03 ms: a scrape is one small request on a
connection that stays open, so everything beyond "write the request, collect the body" is
overhead paid 20 times a second per pod. It handles exactly what a metrics endpoint can
send: `Content-Length` bodies, `Transfer-Encoding: chunked` bodies, and bodies delimited by
the server closing the connection; a timeout bounds the whole exchange. A connection that
failed, timed out, or was closed by the server is dropped and reopened on the next GET.
Plain `http://` only (callers fall back to a general client for anything else).
"""

from __future__ import annotations

import asyncio
from urllib.parse import urlsplit

MAX_HEADER_BYTES = 64 * 1024
MAX_BODY_BYTES = 16 * 1024 * 1024  # a metrics page is tens of KB; more is a broken exporter


class HttpError(Exception):
    """The GET failed: connection refused or lost, timeout, bad status, malformed response."""


def split_http_url(url: str) -> tuple[str, int, str]:
    """(host, port, path-with-query) of a plain http:// URL; ValueError otherwise."""
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        raise ValueError(f"not a plain http:// URL: {url!r}")
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    return parts.hostname, parts.port or 80, path


class _Response:
    """Incremental parser of one response in its connection's receive buffer;
    `feed` returns True once the body is complete."""

    __slots__ = ("_cursor", "body", "body_start", "chunked", "keep_alive", "length", "status", "until_close")

    def __init__(self) -> None:
        self.status = 0
        self.body_start = -1
        self.length = -1
        self.chunked = False
        self.until_close = False
        self.keep_alive = True
        self.body: bytes | None = None
        self._cursor = 0  # chunked: where the next chunk-size line starts

    def feed(self, buf: bytearray, filled: int) -> bool:
        """`buf[:filled]` is everything received so far for this response."""
        if self.body_start < 0:
            end = buf.find(b"\r\n\r\n", 0, filled)
            if end < 0:
                if filled > MAX_HEADER_BYTES:
                    raise HttpError("response headers too large")
                return False
            self._headers(bytes(buf[:end]))
            self.body_start = self._cursor = end + 4
        if self.chunked:
            return self._chunks(buf, filled)
        if self.until_close:
            if filled - self.body_start > MAX_BODY_BYTES:
                raise HttpError("response body too large")
            return False
        if filled - self.body_start >= self.length:
            self.body = bytes(
                memoryview(buf)[self.body_start : self.body_start + self.length]
            )  # one copy, not two
            return True
        return False

    def eof(self, buf: bytearray, filled: int) -> bool:
        """The server closed the connection: complete only for a close-delimited body."""
        if self.until_close and self.body_start >= 0:
            self.body = bytes(memoryview(buf)[self.body_start : filled])
            return True
        return False

    def _headers(self, block: bytes) -> None:
        lines = block.split(b"\r\n")
        status = lines[0].split(None, 2)
        if len(status) < 2 or not status[0].startswith(b"HTTP/1.") or not status[1].isdigit():
            raise HttpError(f"malformed status line {lines[0][:80]!r}")
        self.status = int(status[1])
        self.keep_alive = status[0] != b"HTTP/1.0"
        for line in lines[1:]:
            name, sep, value = line.partition(b":")
            if not sep:
                raise HttpError(f"malformed header line {line[:80]!r}")
            name = name.strip().lower()
            value = value.strip()
            if name == b"content-length":
                if not value.isdigit():
                    raise HttpError(f"bad Content-Length {value[:40]!r}")
                self.length = int(value)
                if self.length > MAX_BODY_BYTES:
                    raise HttpError("response body too large")
            elif name == b"transfer-encoding":
                self.chunked = value.lower().endswith(b"chunked")
            elif name == b"connection":
                token = value.lower()
                if token == b"close":
                    self.keep_alive = False
                elif token == b"keep-alive":
                    self.keep_alive = True
        if self.chunked:
            self.length = -1
        elif self.length < 0:
            self.until_close, self.keep_alive = True, False

    def _chunks(self, buf: bytearray, filled: int) -> bool:
        while True:
            eol = buf.find(b"\r\n", self._cursor, filled)
            if eol < 0:
                return False
            size = _chunk_size(buf, self._cursor, eol)
            if size == 0:
                if buf.find(b"\r\n\r\n", eol, filled) < 0:  # optional trailers end with an empty line
                    return False
                self._assemble(buf, eol)
                return True
            if eol + 2 + size + 2 > filled:
                return False
            if buf[eol + 2 + size : eol + 4 + size] != b"\r\n":
                raise HttpError("chunk not terminated by CRLF")
            self._cursor = eol + 4 + size
            if self._cursor - self.body_start > MAX_BODY_BYTES:
                raise HttpError("response body too large")

    def _assemble(self, buf: bytearray, last_eol: int) -> None:
        out = bytearray()
        pos = self.body_start
        while pos < last_eol:
            eol = buf.find(b"\r\n", pos)
            size = _chunk_size(buf, pos, eol)
            out += buf[eol + 2 : eol + 2 + size]
            pos = eol + 4 + size
        self.body = bytes(out)


def _chunk_size(buf: bytearray, start: int, eol: int) -> int:
    text = bytes(buf[start:eol]).split(b";", 1)[0].strip()
    try:
        return int(text, 16)
    except ValueError:
        raise HttpError(f"bad chunk size {text[:20]!r}") from None


class _StaleConnection(Exception):
    """A reused connection was closed by the server before it sent a byte of the response."""


RECEIVE_BUFFER_BYTES = 64 * 1024  # per connection, grown by doubling for larger pages


class _Connection(asyncio.BufferedProtocol):
    """One kept-alive connection. The transport reads straight into a receive buffer that
    lives as long as the connection: no allocation per read or per scrape beyond the body."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.response: _Response | None = None
        self.waiter: asyncio.Future[_Response] | None = None
        self.closed = False
        self.lost_by_peer = False  # the server closed it (not a timeout or our own close)
        self.rx = bytearray(RECEIVE_BUFFER_BYTES)
        self.filled = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def start(self, response: _Response, waiter: asyncio.Future[_Response]) -> None:
        self.response, self.waiter, self.filled = response, waiter, 0

    def get_buffer(self, sizehint: int) -> memoryview:
        if self.filled >= len(self.rx):
            if len(self.rx) > MAX_HEADER_BYTES + MAX_BODY_BYTES:
                self._fail(HttpError("response too large"))
                self.filled = 0  # discard: the connection is being aborted
            else:
                self.rx.extend(bytes(len(self.rx)))  # double; the response so far is kept
        return memoryview(self.rx)[self.filled :]

    def buffer_updated(self, nbytes: int) -> None:
        self.filled += nbytes
        response, waiter = self.response, self.waiter
        if response is None or waiter is None or waiter.done():
            self._fail(HttpError("unsolicited data from the server"))
            return
        try:
            complete = response.feed(self.rx, self.filled)
        except HttpError as exc:
            self._fail(exc)
            return
        if complete:
            self.response = None
            waiter.set_result(response)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed:
            self.lost_by_peer = True
        self.closed = True
        response, waiter = self.response, self.waiter
        if waiter is not None and not waiter.done():
            if response is not None and response.eof(self.rx, self.filled):
                waiter.set_result(response)
            else:
                waiter.set_exception(HttpError(f"connection closed by the server{f': {exc}' if exc else ''}"))

    def _fail(self, exc: HttpError) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(exc)
        self.close()

    def closed_silently(self) -> bool:
        return self.lost_by_peer and self.filled == 0

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.abort()


class MetricsHttpClient:
    """GET bodies over one kept-alive connection per (host, port).

    Built for the scraper's pattern: each pod's loop issues one GET at a time. A second
    concurrent GET to the same server opens its own connection rather than queueing.
    """

    def __init__(self, timeout_s: float = 0.5) -> None:
        self.timeout_s = timeout_s
        self._idle: dict[tuple[str, int], _Connection] = {}
        self._requests: dict[tuple[str, int, str], bytes] = {}
        self.connects = 0  # connections opened (reconnects included): for tests and benchmarks

    async def get(self, host: str, port: int, path: str, timeout_s: float | None = None) -> bytes:
        """The body of a 2xx response; HttpError for anything else (never hangs past the timeout).

        A kept-alive connection the server closed while idle fails before any byte arrives;
        that GET is retried once on a fresh connection (within the same deadline).
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + (self.timeout_s if timeout_s is None else timeout_s)
        key = (host, port)
        conn = self._idle.pop(key, None)
        if conn is not None and (conn.closed or conn.transport is None or conn.transport.is_closing()):
            conn = None
        if conn is not None:
            try:
                return await self._exchange(loop, conn, key, path, deadline)
            except _StaleConnection:
                pass
        conn = await self._connect(loop, host, port, deadline)
        try:
            return await self._exchange(loop, conn, key, path, deadline)
        except _StaleConnection:
            raise HttpError(f"{host}:{port} closed the connection without answering") from None

    async def _connect(
        self, loop: asyncio.AbstractEventLoop, host: str, port: int, deadline: float
    ) -> _Connection:
        try:
            async with asyncio.timeout_at(deadline):
                _, conn = await loop.create_connection(_Connection, host, port)
        except TimeoutError:
            raise HttpError(f"connect to {host}:{port} timed out") from None
        except OSError as exc:
            raise HttpError(f"connect to {host}:{port} failed: {exc}") from None
        self.connects += 1
        return conn

    async def _exchange(
        self,
        loop: asyncio.AbstractEventLoop,
        conn: _Connection,
        key: tuple[str, int],
        path: str,
        deadline: float,
    ) -> bytes:
        request = self._requests.get((*key, path))
        if request is None:
            request = f"GET {path} HTTP/1.1\r\nHost: {key[0]}:{key[1]}\r\nAccept: text/plain\r\n\r\n".encode()
            if len(self._requests) < 65_536:
                self._requests[(*key, path)] = request
        waiter: asyncio.Future[_Response] = loop.create_future()
        response = _Response()
        conn.start(response, waiter)
        conn.transport.write(request)  # type: ignore[union-attr]
        timer = loop.call_at(deadline, _expire, waiter)
        try:
            await waiter
        except HttpError:
            conn.close()  # a half-read response leaves the connection unusable
            if conn.closed_silently():
                raise _StaleConnection from None
            raise
        except BaseException:
            conn.close()
            raise
        finally:
            timer.cancel()
        if response.keep_alive and not conn.closed and key not in self._idle:
            self._idle[key] = conn
        else:
            conn.close()
        if not 200 <= response.status < 300:
            raise HttpError(f"HTTP {response.status}")
        assert response.body is not None
        return response.body

    async def aclose(self) -> None:
        for conn in self._idle.values():
            conn.close()
        self._idle.clear()


def _expire(waiter: asyncio.Future[_Response]) -> None:
    if not waiter.done():
        waiter.set_exception(HttpError("timed out"))
