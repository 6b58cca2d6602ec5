"""The shared ext_proc state machine, driven with the messages Envoy sends."""

from __future__ import annotations

import json

import grpc
import pytest
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc

from extproc.errors import ErrorResponse, bad_request
from extproc.messages import MAX_CHUNK_BYTES
from extproc.server import start_grpc_service
from extproc.stream import ExtProcServicer, ExtProcStream, ProtocolViolation, RequestRoute
from tests.unit.extproc_helpers import (
    POST,
    body_msgs,
    headers_msg,
    response_headers_msg,
    set_headers_of,
    streamed_body_of,
    trailers_msg,
)


class Recorder:
    """A processor that records what the stream layer hands it."""

    def __init__(
        self, *, limit: int = 10 * 1024 * 1024, answer: RequestRoute | ErrorResponse | None = None
    ) -> None:
        self.max_body_bytes = limit
        self.answer = answer or RequestRoute(set_headers={"x-test": "1"}, clear_route_cache=True)
        self.requests: list[tuple[dict[str, str], bytes]] = []
        self.response_headers: list[dict[str, str]] = []
        self.closed: list[bool] = []

    async def on_request(self, headers: dict[str, str], body: bytes) -> RequestRoute | ErrorResponse:
        self.requests.append((headers, body))
        return self.answer

    def on_response_headers(self, headers: dict[str, str]) -> dict[str, str] | None:
        self.response_headers.append(headers)
        return None

    def on_response_body(self, chunk: bytes, end_of_stream: bool) -> None:
        return None

    def on_close(self, completed: bool) -> None:
        self.closed.append(completed)


async def drive(stream: ExtProcStream, msgs: list[pb.ProcessingRequest]) -> list[pb.ProcessingResponse]:
    out = []
    for m in msgs:
        async for r in stream.handle(m):
            out.append(r)
    return out


@pytest.mark.parametrize("size", [0, 1, 61_999, 62_000, 62_001, 256 * 1024, 2 * 1024 * 1024])
async def test_body_is_collected_and_reemitted_in_bounded_chunks(size: int) -> None:
    body = bytes(range(256)) * (size // 256) + b"x" * (size % 256)
    rec = Recorder()
    stream = ExtProcStream(rec)
    responses = await drive(stream, [headers_msg(POST), *body_msgs(body, chunk=17_000)])
    assert rec.requests == [(POST, body)]
    assert responses[0].HasField("request_headers")
    headers = set_headers_of(responses[0])
    assert headers["content-length"] == str(size)
    assert headers["x-test"] == "1"
    assert responses[0].request_headers.response.clear_route_cache
    emitted, sizes, ended = streamed_body_of(responses)
    assert emitted == body
    assert all(s <= MAX_CHUNK_BYTES for s in sizes)
    assert ended


async def test_nothing_is_answered_before_the_body_ends() -> None:
    stream = ExtProcStream(Recorder())
    chunks = body_msgs(b"a" * 50_000, chunk=10_000)
    assert await drive(stream, [headers_msg(POST), *chunks[:-1]]) == []
    assert len(await drive(stream, chunks[-1:])) == 2


async def test_get_without_body_is_answered_at_headers() -> None:
    rec = Recorder()
    responses = await drive(
        ExtProcStream(rec), [headers_msg({":method": "GET", ":path": "/v1/models"}, end_of_stream=True)]
    )
    assert len(responses) == 1 and responses[0].HasField("request_headers")
    assert "content-length" not in set_headers_of(responses[0])
    assert rec.requests[0][1] == b""


async def test_trailers_end_the_body_and_are_acknowledged() -> None:
    body = b'{"model":"m"}'
    msgs = [headers_msg(POST), pb.ProcessingRequest(request_body=pb.HttpBody(body=body)), trailers_msg()]
    responses = await drive(ExtProcStream(Recorder()), msgs)
    emitted, _, ended = streamed_body_of(responses)
    assert emitted == body and not ended  # the trailers response ends the stream
    assert responses[-1].HasField("request_trailers")


async def test_replacement_body_fixes_content_length() -> None:
    rec = Recorder(answer=RequestRoute(body=b'{"model":"other"}'))
    responses = await drive(ExtProcStream(rec), [headers_msg(POST), *body_msgs(b'{"model":"m"}')])
    assert set_headers_of(responses[0])["content-length"] == str(len(b'{"model":"other"}'))
    assert streamed_body_of(responses)[0] == b'{"model":"other"}'


async def test_oversized_body_gets_413_json() -> None:
    stream = ExtProcStream(Recorder(limit=1000))
    responses = await drive(stream, [headers_msg(POST), *body_msgs(b"x" * 5000, chunk=600)])
    immediate = [r for r in responses if r.HasField("immediate_response")]
    assert len(immediate) == 1
    assert immediate[0].immediate_response.status.code == 413
    error = json.loads(immediate[0].immediate_response.body)["error"]
    assert error["code"] == "request_too_large" and error["type"] == "invalid_request_error"
    assert stream.refused


async def test_refusal_is_an_openai_json_error() -> None:
    rec = Recorder(answer=bad_request("nope", "invalid_json"))
    responses = await drive(ExtProcStream(rec), [headers_msg(POST), *body_msgs(b"{")])
    imm = responses[0].immediate_response
    assert imm.status.code == 400
    assert json.loads(imm.body) == {
        "error": {"message": "nope", "type": "invalid_request_error", "code": "invalid_json"}
    }
    headers = {h.header.key: h.header.raw_value.decode() for h in imm.headers.set_headers}
    assert headers["content-type"] == "application/json"


async def test_out_of_order_messages_are_protocol_violations() -> None:
    with pytest.raises(ProtocolViolation):
        await drive(ExtProcStream(Recorder()), body_msgs(b"{}"))
    with pytest.raises(ProtocolViolation):
        await drive(ExtProcStream(Recorder()), [headers_msg(POST), headers_msg(POST)])


async def test_local_reply_of_an_earlier_filter_is_acknowledged_not_accounted() -> None:
    rec = Recorder()
    responses = await drive(ExtProcStream(rec), [response_headers_msg(400)])
    assert [r.WhichOneof("response") for r in responses] == ["response_headers"]
    assert rec.response_headers == []


@pytest.fixture
async def grpc_recorders():
    recorders: list[Recorder] = []

    def factory() -> Recorder:
        recorders.append(Recorder())
        return recorders[-1]

    servicer = ExtProcServicer(factory, name="test")
    service = await start_grpc_service(servicer, host="127.0.0.1", port=0)
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{service.port}")
    yield pb_grpc.ExternalProcessorStub(channel), recorders, servicer
    await channel.close()
    await service.server.stop(0)


async def test_over_real_grpc_close_is_reported_once_and_completed(grpc_recorders) -> None:
    stub, recorders, servicer = grpc_recorders
    msgs = [headers_msg(POST), *body_msgs(b'{"model":"m"}'), response_headers_msg(200)]
    call = stub.Process(iter(msgs))
    kinds = [r.WhichOneof("response") async for r in call]
    assert kinds == ["request_headers", "request_body", "response_headers"]
    assert recorders[0].closed == [False]  # response body never ended: not a completed response
    assert recorders[0].response_headers[0][":status"] == "200"
    assert servicer.active_streams == 0


async def test_over_real_grpc_client_disconnect_mid_body_closes_once(grpc_recorders) -> None:
    stub, recorders, servicer = grpc_recorders
    call = stub.Process()
    await call.write(headers_msg(POST))
    await call.write(pb.ProcessingRequest(request_body=pb.HttpBody(body=b'{"model":')))
    call.cancel()
    for _ in range(100):
        if recorders and recorders[0].closed:
            break
        import asyncio

        await asyncio.sleep(0.01)
    assert recorders[0].closed == [False]
    assert recorders[0].requests == []  # never routed: the body never completed
    assert servicer.active_streams == 0


async def test_over_real_grpc_protocol_violation_is_failed_precondition(grpc_recorders) -> None:
    stub, recorders, _ = grpc_recorders
    call = stub.Process(iter(body_msgs(b"{}")))
    with pytest.raises(grpc.aio.AioRpcError) as err:
        async for _ in call:
            pass
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert recorders[0].closed == [False]


def protocol_config(mode: int) -> pb.ProtocolConfiguration:
    return pb.ProtocolConfiguration(request_body_mode=mode)


async def test_buffered_mode_answers_headers_at_once_and_decides_on_the_body() -> None:
    from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2

    rec = Recorder(
        answer=RequestRoute(
            set_headers={"x-dest": "10.0.0.1:80"}, metadata={"envoy.lb": {"k": "v"}}, clear_route_cache=True
        )
    )
    first = headers_msg(POST)
    first.protocol_config.CopyFrom(protocol_config(processing_mode_pb2.ProcessingMode.BUFFERED))
    stream = ExtProcStream(rec)
    at_headers = await drive(stream, [first])
    assert [r.WhichOneof("response") for r in at_headers] == ["request_headers"]
    assert set_headers_of(at_headers[0]) == {}
    body = b'{"model":"m"}'
    at_body = await drive(
        stream, [pb.ProcessingRequest(request_body=pb.HttpBody(body=body, end_of_stream=True))]
    )
    assert len(at_body) == 1 and at_body[0].HasField("request_body")
    common = at_body[0].request_body.response
    assert {h.header.key: h.header.raw_value.decode() for h in common.header_mutation.set_headers} == {
        "x-dest": "10.0.0.1:80"
    }
    assert common.clear_route_cache and not common.HasField("body_mutation")
    assert at_body[0].dynamic_metadata.fields["envoy.lb"].struct_value.fields["k"].string_value == "v"
    assert rec.requests == [(POST, body)]


async def test_over_real_grpc_drain_ends_held_streams_with_ok_and_closes_once(grpc_recorders) -> None:
    """A forwarded request's stream is held open (Envoy keeps it to the response's end);
    `release_held` ends it cleanly, so Envoy would carry on with the response, not reset it."""
    import asyncio

    stub, recorders, servicer = grpc_recorders
    call = stub.Process()
    for msg in [headers_msg(POST), *body_msgs(b'{"model":"m"}'), response_headers_msg(200)]:
        await call.write(msg)
    kinds = [(await call.read()).WhichOneof("response") for _ in range(3)]
    assert kinds == ["request_headers", "request_body", "response_headers"]
    for _ in range(500):  # the servicer now waits for the next response event
        if servicer.held_streams == 1:
            break
        await asyncio.sleep(0.01)
    assert servicer.release_held() == 1
    assert await call.read() == grpc.aio.EOF
    assert await call.code() == grpc.StatusCode.OK
    assert recorders[0].closed == [False]
    # Draining: a stream that gets forwarded from now on is released right away.
    late = stub.Process(iter([headers_msg(POST), *body_msgs(b'{"model":"m"}')]))
    assert [r.WhichOneof("response") async for r in late] == ["request_headers", "request_body"]
    assert await late.code() == grpc.StatusCode.OK
    assert recorders[1].closed == [False] and servicer.active_streams == 0


def _forwarded() -> list[pb.ProcessingRequest]:
    return [headers_msg(POST), *body_msgs(b'{"model":"m"}')]


async def test_served_endpoint_reaches_the_processor_from_metadata_or_attributes() -> None:
    from google.protobuf import struct_pb2

    from extproc.headers import SERVED_HEADER

    by_metadata = response_headers_msg(200)
    by_metadata.metadata_context.filter_metadata["envoy.lb"].update({SERVED_HEADER: "10.0.0.7:8000"})
    by_attribute = response_headers_msg(200)
    by_attribute.attributes["envoy.filters.http.ext_proc"].CopyFrom(
        struct_pb2.Struct(fields={"upstream.address": struct_pb2.Value(string_value="10.0.0.8:8000")})
    )
    spoofed = response_headers_msg(200)  # an upstream's header of that name is not a report
    spoofed.response_headers.headers.headers.add(key=SERVED_HEADER, raw_value=b"6.6.6.6:1")
    seen = []
    for msg in (by_metadata, by_attribute, spoofed):
        rec = Recorder()
        await drive(ExtProcStream(rec), [*_forwarded(), msg])
        seen.append(rec.response_headers[0].get(SERVED_HEADER))
    assert seen == ["10.0.0.7:8000", "10.0.0.8:8000", None]


async def test_full_duplex_response_body_is_echoed_chunk_by_chunk() -> None:
    from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2

    first = _forwarded()
    first[0].protocol_config.response_body_mode = processing_mode_pb2.ProcessingMode.FULL_DUPLEX_STREAMED
    chunks = [
        pb.ProcessingRequest(response_body=pb.HttpBody(body=b"data: 1\n\n", end_of_stream=False)),
        pb.ProcessingRequest(response_body=pb.HttpBody(body=b"data: 2\n\n", end_of_stream=True)),
    ]
    out = await drive(ExtProcStream(Recorder()), [*first, response_headers_msg(200), *chunks])
    echoed = [
        r.response_body.response.body_mutation.streamed_response for r in out if r.HasField("response_body")
    ]
    assert [(e.body, e.end_of_stream) for e in echoed] == [(b"data: 1\n\n", False), (b"data: 2\n\n", True)]


async def test_buffered_or_streamed_response_body_is_only_acknowledged() -> None:
    chunk = pb.ProcessingRequest(response_body=pb.HttpBody(body=b"x", end_of_stream=True))
    out = await drive(ExtProcStream(Recorder()), [*_forwarded(), response_headers_msg(200), chunk])
    body = [r.response_body for r in out if r.HasField("response_body")]
    assert len(body) == 1 and not body[0].HasField("response")


async def test_over_real_grpc_drain_keeps_streams_that_hand_response_bodies_back(grpc_recorders) -> None:
    """In FULL_DUPLEX_STREAMED response mode the body flows through the stream: a drain must
    not end it, or the response would be cut; it carries on to the last chunk."""
    import asyncio

    from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2

    stub, recorders, servicer = grpc_recorders
    call = stub.Process()
    first = _forwarded()
    first[0].protocol_config.response_body_mode = processing_mode_pb2.ProcessingMode.FULL_DUPLEX_STREAMED
    for msg in [*first, response_headers_msg(200)]:
        await call.write(msg)
    kinds = [(await call.read()).WhichOneof("response") for _ in range(3)]
    assert kinds == ["request_headers", "request_body", "response_headers"]
    await asyncio.sleep(0.05)
    assert servicer.release_held() == 0  # nothing releasable
    await call.write(pb.ProcessingRequest(response_body=pb.HttpBody(body=b"tail", end_of_stream=True)))
    echoed = await call.read()
    assert echoed.response_body.response.body_mutation.streamed_response.body == b"tail"
    await call.done_writing()
    assert await call.read() == grpc.aio.EOF
    assert recorders[0].closed == [True]


def test_an_empty_non_final_chunk_is_still_a_streamed_response() -> None:
    """Chunks are written into the response in place (extproc/messages.py): an empty one that
    does not end the body must still be a streamed response, not a bare CONTINUE."""
    from extproc import messages

    for resp, body in (
        (messages.echo_response_body(b"", False), "response_body"),
        (messages.echo_response_body(b"abc", True), "response_body"),
    ):
        mutation = getattr(resp, body).response.body_mutation
        assert mutation.HasField("streamed_response")
        assert mutation.streamed_response.body == (
            b"abc" if mutation.streamed_response.end_of_stream else b""
        )
