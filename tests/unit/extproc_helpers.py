"""Build ext_proc requests the way Envoy sends them, for driving servicers in tests."""

from __future__ import annotations

from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb


def headers_msg(headers: dict[str, str], *, end_of_stream: bool = False) -> pb.ProcessingRequest:
    hm = base_pb2.HeaderMap(
        headers=[base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in headers.items()]
    )
    return pb.ProcessingRequest(request_headers=pb.HttpHeaders(headers=hm, end_of_stream=end_of_stream))


def body_msgs(body: bytes, chunk: int = 16_384) -> list[pb.ProcessingRequest]:
    if not body:
        return [pb.ProcessingRequest(request_body=pb.HttpBody(body=b"", end_of_stream=True))]
    out = []
    for start in range(0, len(body), chunk):
        part = body[start : start + chunk]
        out.append(
            pb.ProcessingRequest(
                request_body=pb.HttpBody(body=part, end_of_stream=start + chunk >= len(body))
            )
        )
    return out


def trailers_msg() -> pb.ProcessingRequest:
    return pb.ProcessingRequest(request_trailers=pb.HttpTrailers())


def response_headers_msg(status: int = 200) -> pb.ProcessingRequest:
    hm = base_pb2.HeaderMap(headers=[base_pb2.HeaderValue(key=":status", raw_value=str(status).encode())])
    return pb.ProcessingRequest(response_headers=pb.HttpHeaders(headers=hm))


POST = {":method": "POST", ":path": "/v1/chat/completions", "content-type": "application/json"}


def set_headers_of(resp: pb.ProcessingResponse) -> dict[str, str]:
    mutation = resp.request_headers.response.header_mutation
    return {h.header.key: h.header.raw_value.decode() for h in mutation.set_headers}


def streamed_body_of(responses: list[pb.ProcessingResponse]) -> tuple[bytes, list[int], bool]:
    """Concatenated re-emitted body, chunk sizes, and whether the last chunk ended the stream."""
    chunks = [
        r.request_body.response.body_mutation.streamed_response
        for r in responses
        if r.HasField("request_body")
    ]
    return (
        b"".join(c.body for c in chunks),
        [len(c.body) for c in chunks],
        bool(chunks and chunks[-1].end_of_stream),
    )
