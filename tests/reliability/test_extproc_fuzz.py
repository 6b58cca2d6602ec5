"""Property-based fuzzing of the ext_proc servicers over real gRPC.

Whatever Envoy (or an attacker who reached the port) sends, each stream must end in a clear
outcome: a gRPC status (FAILED_PRECONDITION for protocol violations), an ImmediateResponse with
an OpenAI-style JSON error, or a correct forward. Never UNKNOWN/INTERNAL (an unhandled
exception), never a hang; and afterwards the service is SERVING with nothing left in flight.
"""

from __future__ import annotations

import json
import time
from typing import Any

import grpc
import pytest
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.reliability.conftest import record_figures
from tests.reliability.extproc_harness import (
    MAX_BODY,
    MODEL,
    OTHER_MODEL,
    SERVING,
    Services,
    exchange,
    health_status,
)
from tests.unit.extproc_helpers import POST, body_msgs, headers_msg, response_headers_msg, trailers_msg

CLEAR_CODES = {grpc.StatusCode.OK, grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.CANCELLED}
EXAMPLES = 150

header_names = st.sampled_from(
    [
        "x-gateway-model-name",
        "x-gateway-destination-endpoint",
        "x-gateway-inference-objective",
        "x-gateway-decision",
        "x-request-id",
        "content-length",
        "authorization",
    ]
) | st.from_regex(r"[a-z][a-z0-9-]{0,20}", fullmatch=True)
header_values = st.text(max_size=40) | st.builds(lambda n: "v" * n, st.integers(8_000, 70_000))
extra_headers = st.dictionaries(header_names, header_values, max_size=6)


def _chat(model: Any, content: str = "hi") -> bytes:
    return json.dumps({"model": model, "messages": [{"role": "user", "content": content}]}).encode()


json_leaves = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20)
json_values = st.recursive(
    json_leaves,
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=8), kids, max_size=4),
)
bodies = st.one_of(
    st.sampled_from([MODEL, OTHER_MODEL, "sql-lora", "no-such-model", ""]).map(_chat),
    json_values.map(_chat),  # `model` of any JSON type
    st.binary(max_size=300),  # garbage, invalid UTF-8
    st.integers(1, 200_000).map(lambda d: b"[" * d + b"]" * d),  # deep nesting
    st.integers(1, 200_000).map(lambda d: b'{"model":' + b"[" * d),  # deep and unterminated
    st.sampled_from([b'{"model": 1e999999}', b'{"model": "' + MODEL.encode() + b'", "max_tokens": 1e400}']),
    st.just(b'{"model": "\\ud800\\udfff\\ud800"}'),  # lone surrogates
    st.integers(MAX_BODY + 1, MAX_BODY * 3).map(lambda n: _chat(MODEL, "x" * n)),  # over the limit
    st.text(max_size=200).map(lambda t: _chat(MODEL, t)),
)


@st.composite
def well_formed(draw: st.DrawFn) -> list[pb.ProcessingRequest]:
    """What Envoy sends: headers, body chunks ending the stream (or trailers), response events."""
    headers = {**POST, **draw(extra_headers)}
    body = draw(bodies)
    msgs = [headers_msg(headers)]
    chunk = draw(st.integers(1, 70_000))
    if draw(st.booleans()):
        msgs += body_msgs(body, chunk)
    else:
        part = body_msgs(body, chunk)
        part[-1].request_body.end_of_stream = False
        msgs += [*part, trailers_msg()]
    if draw(st.booleans()):
        msgs.append(response_headers_msg(draw(st.sampled_from([200, 400, 500, 503]))))
        msgs.append(pb.ProcessingRequest(response_body=pb.HttpBody(body=b"{}", end_of_stream=True)))
    return msgs


def _event(draw: st.DrawFn) -> pb.ProcessingRequest:
    kind = draw(
        st.sampled_from(
            ["headers", "body", "trailers", "resp_headers", "resp_body", "resp_trailers", "empty"]
        )
    )
    if kind == "headers":
        return headers_msg({**POST, **draw(extra_headers)}, end_of_stream=draw(st.booleans()))
    if kind == "body":
        return pb.ProcessingRequest(
            request_body=pb.HttpBody(body=draw(bodies), end_of_stream=draw(st.booleans()))
        )
    if kind == "trailers":
        return trailers_msg()
    if kind == "resp_headers":
        return response_headers_msg(draw(st.integers(100, 599)))
    if kind == "resp_body":
        return pb.ProcessingRequest(
            response_body=pb.HttpBody(body=draw(st.binary(max_size=100)), end_of_stream=draw(st.booleans()))
        )
    if kind == "resp_trailers":
        return pb.ProcessingRequest(response_trailers=pb.HttpTrailers())
    return pb.ProcessingRequest()  # no message set at all


@st.composite
def arbitrary(draw: st.DrawFn) -> list[pb.ProcessingRequest]:
    """Out of order, duplicated, truncated (no end of stream): anything."""
    msgs = [_event(draw) for _ in range(draw(st.integers(0, 8)))]
    if draw(st.booleans()) and msgs:  # duplicate one message in place
        i = draw(st.integers(0, len(msgs) - 1))
        msgs.insert(i, msgs[i])
    return msgs


def check_outcome(responses: list[pb.ProcessingResponse], code: grpc.StatusCode) -> str | None:
    """None if the stream ended clearly, else what went wrong."""
    if code not in CLEAR_CODES:
        return f"stream ended with {code}"
    for r in responses:
        if r.HasField("immediate_response"):
            ir = r.immediate_response
            if not 400 <= ir.status.code < 600:
                return f"immediate response with status {ir.status.code}"
            error = json.loads(ir.body)["error"]
            if not (error["message"] and error["code"] and error["type"]):
                return f"incomplete JSON error {error}"
    return None


def check_forward(msgs: list[pb.ProcessingRequest], responses: list[pb.ProcessingResponse]) -> str | None:
    """A well-formed request that was not refused must be re-emitted byte for byte."""
    if any(r.HasField("immediate_response") for r in responses) or not responses:
        return None
    sent = b"".join(m.request_body.body for m in msgs if m.HasField("request_body"))
    emitted = b"".join(
        r.request_body.response.body_mutation.streamed_response.body
        for r in responses
        if r.HasField("request_body")
    )
    return None if emitted == sent else f"forwarded body differs ({len(emitted)} vs {len(sent)} bytes)"


def wait_settled(services: Services, which: str, timeout_s: float = 3.0) -> tuple[int, int]:
    servicer = services.servicer(which)
    deadline = time.monotonic() + timeout_s
    while True:
        active = services.loop.call(lambda: servicer.active_streams)
        inflight = services.loop.call(services.pool.inflight_total)
        if (active == 0 and inflight == 0) or time.monotonic() > deadline:
            return active, inflight
        time.sleep(0.02)


FUZZ_SETTINGS = settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.function_scoped_fixture,
    ],
)


@pytest.mark.parametrize("which", ["bbr", "epp"])
def test_fuzzed_streams_end_clearly_and_leave_the_service_healthy(services: Services, which: str) -> None:
    failures: list[str] = []
    counts = {"cases": 0, "refused": 0, "forwarded": 0, "grpc_error": 0, "cancelled": 0}

    @FUZZ_SETTINGS
    @given(
        msgs=st.one_of(well_formed(), arbitrary()),
        cancel_after=st.none() | st.integers(1, 3),
    )
    def run(msgs: list[pb.ProcessingRequest], cancel_after: int | None) -> None:
        responses, code = exchange(services.port(which), msgs, cancel_after=cancel_after)
        counts["cases"] += 1
        if code == grpc.StatusCode.CANCELLED:
            counts["cancelled"] += 1
        elif code != grpc.StatusCode.OK:
            counts["grpc_error"] += 1
        elif any(r.HasField("immediate_response") for r in responses):
            counts["refused"] += 1
        elif responses:
            counts["forwarded"] += 1
        problem = check_outcome(responses, code)
        if problem:
            failures.append(problem)
        assert problem is None, problem

    run()

    @FUZZ_SETTINGS
    @given(msgs=well_formed())
    def run_well_formed(msgs: list[pb.ProcessingRequest]) -> None:
        responses, code = exchange(services.port(which), msgs)
        counts["cases"] += 1
        counts["refused" if any(r.HasField("immediate_response") for r in responses) else "forwarded"] += 1
        problem = check_outcome(responses, code) or check_forward(msgs, responses)
        if code != grpc.StatusCode.OK:
            problem = problem or f"well-formed stream ended with {code}"
        if problem:
            failures.append(problem)
        assert problem is None, problem

    run_well_formed()
    active, inflight = wait_settled(services, which)
    record_figures(f"extproc_fuzz_{which}", {**counts, "crashes": len(failures)})
    assert failures == []
    assert counts["refused"] > 0 and counts["forwarded"] > 0 and counts["grpc_error"] > 0
    assert (active, inflight) == (0, 0)
    assert health_status(services.port(which)) == SERVING
