"""The scraper's hand-written HTTP/1.1 client against scripted raw-socket servers."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import pytest

from epp.datalayer.metrics_http import HttpError, MetricsHttpClient, split_http_url

PAGE = b"vllm:num_requests_waiting 3\n" * 500  # 14 KB: arrives in several reads

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@asynccontextmanager
async def serve(handler: Handler) -> AsyncIterator[tuple[int, list[int]]]:
    """A loopback server running `handler` per connection; yields (port, [connections])."""
    connections: list[int] = []

    async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(1)
        try:
            await handler(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(on_connect, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield port, connections
    finally:
        server.close()
        await server.wait_closed()


async def read_request(reader: asyncio.StreamReader) -> bytes:
    return await reader.readuntil(b"\r\n\r\n")


def content_length(body: bytes, extra: bytes = b"") -> bytes:
    return (
        b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n%s\r\n" % (len(body), extra)
        + body
    )


async def keep_alive_handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while True:
        request = await read_request(reader)
        assert request.startswith(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1:")
        response = content_length(PAGE)
        for i in range(0, len(response), 4000):  # the body arrives in pieces
            writer.write(response[i : i + 4000])
            await writer.drain()


async def test_content_length_bodies_over_one_kept_alive_connection() -> None:
    async with serve(keep_alive_handler) as (port, connections):
        client = MetricsHttpClient(timeout_s=5)
        for _ in range(3):
            assert await client.get("127.0.0.1", port, "/metrics") == PAGE
        assert client.connects == 1 and len(connections) == 1
        await client.aclose()


async def test_chunked_bodies_with_extensions_and_trailers() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            await read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
            for i in range(0, len(PAGE), 3000):
                piece = PAGE[i : i + 3000]
                writer.write(b"%x;ext=1\r\n" % len(piece))
                await writer.drain()
                writer.write(piece + b"\r\n")
                await writer.drain()
            writer.write(b"0\r\nX-Trailer: yes\r\n\r\n")
            await writer.drain()

    async with serve(handler) as (port, _):
        client = MetricsHttpClient(timeout_s=5)
        assert await client.get("127.0.0.1", port, "/metrics") == PAGE
        assert await client.get("127.0.0.1", port, "/metrics") == PAGE  # the connection stays usable
        assert client.connects == 1
        await client.aclose()


async def test_a_body_delimited_by_the_server_closing() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n" + PAGE)
        await writer.drain()

    async with serve(handler) as (port, connections):
        client = MetricsHttpClient(timeout_s=5)
        assert await client.get("127.0.0.1", port, "/metrics") == PAGE
        assert await client.get("127.0.0.1", port, "/metrics") == PAGE  # reconnected
        assert client.connects == 2 and len(connections) == 2
        await client.aclose()


async def test_a_kept_alive_connection_the_server_dropped_is_replaced_transparently() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(content_length(PAGE))  # claims keep-alive, then closes while idle
        await writer.drain()

    async with serve(handler) as (port, _):
        client = MetricsHttpClient(timeout_s=5)
        assert await client.get("127.0.0.1", port, "/metrics") == PAGE
        for _ in range(200):  # wait until the client has seen the close
            if next(iter(client._idle.values())).closed:
                break
            await asyncio.sleep(0.01)
        assert await client.get("127.0.0.1", port, "/metrics") == PAGE
        assert client.connects == 2
        await client.aclose()


async def test_a_silent_server_times_out_within_the_deadline_and_the_next_get_reconnects() -> None:
    requests = 0

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal requests
        while True:
            await read_request(reader)
            requests += 1
            if requests == 1:
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\npartial")  # then nothing
                await writer.drain()
            else:
                writer.write(content_length(PAGE))
                await writer.drain()

    async with serve(handler) as (port, _):
        client = MetricsHttpClient(timeout_s=0.2)
        loop = asyncio.get_running_loop()
        started = loop.time()
        with pytest.raises(HttpError, match="timed out"):
            await client.get("127.0.0.1", port, "/metrics")
        assert loop.time() - started < 5.0  # bounded by the timeout, not hanging
        assert await client.get("127.0.0.1", port, "/metrics", timeout_s=5) == PAGE
        assert client.connects == 2
        await client.aclose()


@pytest.mark.parametrize(
    ("response", "message"),
    [
        (b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 4\r\n\r\nbusy", "HTTP 503"),
        (b"SSH-2.0-OpenSSH\r\n\r\n", "malformed status line"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: lots\r\n\r\n", "bad Content-Length"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", "bad chunk size"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabcXY", "not terminated"),
        (b"HTTP/1.1 200 OK\r\nX: " + b"a" * 70_000, "headers too large"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 99999999999\r\n\r\n", "too large"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort", "closed by the server"),
    ],
)
async def test_bad_responses_are_clear_errors(response: bytes, message: str) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(response)
        await writer.drain()
        await asyncio.sleep(0.05)

    async with serve(handler) as (port, _):
        client = MetricsHttpClient(timeout_s=5)
        with pytest.raises(HttpError, match=message):
            await client.get("127.0.0.1", port, "/metrics")
        await client.aclose()


async def test_a_refused_connection_is_an_http_error() -> None:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # nothing listens there any more
    with pytest.raises(HttpError, match="connect"):
        await MetricsHttpClient(timeout_s=2).get("127.0.0.1", port, "/metrics")


def test_only_plain_http_urls_are_split() -> None:
    assert split_http_url("http://10.0.0.1:9100/metrics?x=1") == ("10.0.0.1", 9100, "/metrics?x=1")
    assert split_http_url("http://[::1]:8000/metrics") == ("::1", 8000, "/metrics")
    with pytest.raises(ValueError, match="plain http"):
        split_http_url("https://10.0.0.1/metrics")
