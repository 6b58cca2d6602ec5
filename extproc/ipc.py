"""The framed protocol between ext_proc worker processes and the process that decides.

A worker (extproc/remote.py `RemoteProcessor`) does the per-stream protocol work: gRPC, the
ext_proc messages, body accumulation, header maps. What the decision needs crosses a Unix domain
socket as one frame per event: a 4-byte big-endian length, then a msgpack array whose first item
is the message kind. The deciding process runs the service's own `Processor` per stream id
(extproc/remote.py `ProcessorHost`), so the decision code is the single process's, unchanged.

Worker -> decider: HELLO(pid), REQUEST(sid, headers, body, prepared: the service's
request-local step done in the worker, e.g. the EPP's parsed body (epp/requestcontrol/parse.py), or None),
RESPONSE_HEADERS(sid, headers,
wants_reply), CLOSE(sid, completed). Decider -> worker: SETTINGS({max_body_bytes, ...: what the service's step reads}), ROUTE(sid,
..., answers_headers: whether the worker must wait for HEADERS_REPLY),
REFUSE(sid, status, message, code, headers), HEADERS_REPLY(sid, headers | None),
FAILED(sid, message) (the decision raised: the worker fails that stream with a gRPC status).
"""

from __future__ import annotations

import struct
from typing import Any

import msgpack

from extproc.errors import ErrorResponse
from extproc.stream import RequestRoute

HELLO = 1
REQUEST = 2
RESPONSE_HEADERS = 3
CLOSE = 4
SETTINGS = 10
ROUTE = 11
REFUSE = 12
HEADERS_REPLY = 13
FAILED = 14

_LENGTH = struct.Struct(">I")
# A request body rides in one frame: the largest the config accepts (bbr.maxBodyBytes) plus
# headers; anything above this is a broken peer, not a request.
MAX_FRAME_BYTES = 256 * 1024 * 1024


class FrameError(Exception):
    """The peer sent bytes that are not a frame of this protocol: drop the connection."""


def encode(message: list[Any]) -> bytes:
    payload: bytes = msgpack.packb(message, use_bin_type=True)
    return _LENGTH.pack(len(payload)) + payload


class FrameDecoder:
    """Bytes in (as they arrive, in any cut), whole messages out."""

    def __init__(self, max_frame_bytes: int = MAX_FRAME_BYTES) -> None:
        self._buffer = bytearray()
        self._max = max_frame_bytes

    def feed(self, data: bytes) -> list[list[Any]]:
        self._buffer += data
        out: list[list[Any]] = []
        buf = self._buffer
        start = 0
        while len(buf) - start >= _LENGTH.size:
            (size,) = _LENGTH.unpack_from(buf, start)
            if size > self._max:
                raise FrameError(f"frame of {size} bytes exceeds the limit of {self._max}")
            end = start + _LENGTH.size + size
            if len(buf) < end:
                break
            try:
                message = msgpack.unpackb(memoryview(buf)[start + _LENGTH.size : end], raw=False)
            except (ValueError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError) as exc:
                raise FrameError(f"undecodable frame: {exc}") from None
            if not isinstance(message, list) or not message or not isinstance(message[0], int):
                raise FrameError("a frame must be a list starting with its kind")
            out.append(message)
            start = end
        if start:
            del buf[:start]
        return out


def route_message(sid: int, route: RequestRoute, answers_headers: bool = True) -> list[Any]:
    """`answers_headers`: the processor may set response headers (the worker then awaits its
    answer to RESPONSE_HEADERS; otherwise it only reports them)."""
    return [
        ROUTE,
        sid,
        route.set_headers,
        list(route.remove_headers),
        route.metadata,
        route.clear_route_cache,
        route.body,
        answers_headers,
    ]


def refuse_message(sid: int, error: ErrorResponse) -> list[Any]:
    return [REFUSE, sid, error.status, error.message, error.code, error.headers]


def decision_from(message: list[Any]) -> RequestRoute | ErrorResponse:
    """A ROUTE or REFUSE message as the processor's answer it carries."""
    if message[0] == ROUTE:
        _, _, set_headers, remove, metadata, clear, body, _ = message
        return RequestRoute(
            set_headers=set_headers,
            remove_headers=tuple(remove),
            metadata=metadata,
            clear_route_cache=clear,
            body=body,
        )
    if message[0] == REFUSE:
        _, _, status, text, code, headers = message
        return ErrorResponse(status, text, code, headers)
    raise FrameError(f"message kind {message[0]} is not a decision")
