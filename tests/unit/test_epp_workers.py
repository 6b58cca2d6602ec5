"""The multi-core EPP's worker link (extproc/ipc.py, extproc/remote.py, epp/workers/processes.py): the
frames, the decisions equal to one process's, and a worker's death releasing its streams."""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import grpc
import pytest

from epp.datalayer import prefix_index as prefix_module
from epp.datalayer.endpoint_records import Endpoint, Metrics
from epp.datalayer.pool import Pool
from epp.requestcontrol.context import EppContext
from epp.requestcontrol.header_policy import HeaderPolicy
from epp.requestcontrol.parse import WorkerParser
from epp.requestcontrol.processor import EppProcessor
from epp.requestcontrol.telemetry import Telemetry
from epp.scheduling.weighted import WeightedScheduler
from epp.workers.processes import parse_workers, resolve_workers, usable_cpus
from extproc import ipc
from extproc.errors import ErrorResponse
from extproc.headers import DECISION_HEADER, DESTINATION_HEADER
from extproc.remote import ProcessorHost, RemoteProcessor, SchedulerLink
from extproc.stream import ExtProcStream, RequestRoute, StreamAbort
from gateway.config import ConfigError, parse_config
from tests.unit.extproc_helpers import POST, body_msgs, headers_msg
from tests.waiting import until

CONFIG = parse_config(
    {"pools": [{"name": "llama", "models": [{"name": "llama", "adapters": ["sql", "chat"]}]}]}
)
PODS = [f"10.0.0.{i}:8000" for i in range(1, 5)]
ADAPTERS = {PODS[0]: {"sql", "chat"}, PODS[1]: {"sql"}, PODS[2]: {"chat"}, PODS[3]: set()}


class Clock:
    """One virtual clock per picture: both paths decide at the same instants."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def make_ctx(clock: Clock) -> EppContext:
    pool = Pool([Endpoint(a, frozenset({"llama"}), frozenset(ADAPTERS[a])) for a in PODS], clock=clock)
    for i, address in enumerate(PODS):
        pool.record_metrics(address, Metrics(waiting=0.0, kv_usage=0.05 * i, scraped_at=clock()))
    return EppContext(
        "llama", pool, WeightedScheduler(CONFIG.scheduler_profiles()), lambda: CONFIG, Telemetry("llama")
    )


def request_body(rng: random.Random) -> bytes:
    """Chat or completions, under the base model or one of its adapters, with one of a few
    shared prefixes (or none): the prefix index and adapter placement both matter."""
    prefix = rng.choice(["You are a helpful assistant. " * 20, "Summarise this document: " * 30, ""])
    words = (
        f"{rng.choice(['alpha', 'beta', 'gamma', 'delta'])}{rng.randint(0, 99)}"
        for _ in range(rng.randint(50, 800))
    )
    text = prefix + " ".join(words)
    model = rng.choice(["llama", "llama", "sql", "chat"])
    if rng.random() < 0.3:
        return json.dumps({"model": model, "prompt": text, "max_tokens": 32}).encode()
    return json.dumps(
        {"model": model, "messages": [{"role": "user", "content": text}], "max_tokens": 64}
    ).encode()


def settings_of(ctx: EppContext) -> Callable[[], dict[str, Any]]:
    """What the EPP sends its workers (epp/app.py): the body limit and the parse's hints."""
    return lambda: {"max_body_bytes": CONFIG.bbr.max_body_bytes, "parse": ctx.parse_hints().to_wire()}


class ParsedByTheWorker(EppProcessor):
    """The scheduling process's processor where every request must come parsed."""

    async def on_request(self, headers: dict[str, str], body: bytes) -> RequestRoute | ErrorResponse:
        assert not body, "a request with a body reached the scheduling process unparsed"
        return await super().on_request(headers, body)


async def linked(
    tmp_path: Path, ctx: EppContext, processor: type[EppProcessor] = EppProcessor
) -> tuple[ProcessorHost, SchedulerLink]:
    host = ProcessorHost(lambda: processor(ctx), settings_of(ctx))
    await host.start(str(tmp_path / "decide.sock"))
    link = SchedulerLink(host.path)
    await link.connect()
    return host, link


def test_frames_survive_any_cut_and_reject_garbage() -> None:
    messages: list[list[Any]] = [
        [ipc.REQUEST, 7, {"a": "b"}, b"x" * 1000],
        [ipc.CLOSE, 7, True],
        [ipc.HELLO, 42],
    ]
    wire = b"".join(ipc.encode(m) for m in messages)
    for cut in (1, 3, 5, 100, len(wire)):
        decoder = ipc.FrameDecoder()
        out = []
        for start in range(0, len(wire), cut):
            out += decoder.feed(wire[start : start + cut])
        assert out == messages
    with pytest.raises(ipc.FrameError):
        ipc.FrameDecoder(max_frame_bytes=10).feed(ipc.encode([ipc.REQUEST, 1, {}, b"y" * 100]))
    with pytest.raises(ipc.FrameError):
        ipc.FrameDecoder().feed(ipc.encode({"not": "a list"}))  # type: ignore[arg-type]


def test_decisions_round_trip_as_they_were() -> None:
    route = RequestRoute({"x-a": "1"}, ("x-b",), {"envoy.lb": {"d": "e"}}, True, b"{}")
    refusal = ErrorResponse(429, "later", "pool_saturated", {"retry-after": "1"})
    for outcome, message in ((route, ipc.route_message(3, route)), (refusal, ipc.refuse_message(3, refusal))):
        (decoded,) = ipc.FrameDecoder().feed(ipc.encode(message))
        assert ipc.decision_from(decoded) == outcome


async def test_picks_through_the_link_equal_the_picks_in_one_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Same requests, same order, same instants: the worker path (the worker parses and hashes,
    epp/requestcontrol/parse.py) decides what one process decides, because both parse with the same function
    and the scheduling process runs the same EppProcessor on the same picture. Prompts share
    prefixes and ask for adapters; neither path hashes a prompt a second time."""
    hashed_again: list[str] = []
    rehash = prefix_module.prompt_hashes

    def counted(model: str, *args: Any, **kwargs: Any) -> tuple[int, ...]:
        hashed_again.append(model)
        return rehash(model, *args, **kwargs)

    monkeypatch.setattr(prefix_module, "prompt_hashes", counted)
    rng = random.Random(7)
    plan = []  # (request body, how many earlier open requests end before it)
    for _ in range(120):
        plan.append((request_body(rng), rng.choice([0, 0, 0, 1, 2])))
    direct_clock, remote_clock = Clock(), Clock()
    direct_ctx, remote_ctx = make_ctx(direct_clock), make_ctx(remote_clock)
    host, link = await linked(tmp_path, remote_ctx, ParsedByTheWorker)

    async def run(clock: Clock, make: object) -> list[str]:
        picks: list[str] = []
        open_: list[Any] = []
        for i, (body, ending) in enumerate(plan):
            clock.now = 100.0 + i * 0.05
            for _ in range(min(ending, len(open_))):
                proc = open_.pop(0)
                answer = proc.on_response_headers({":status": "200"})
                if asyncio.iscoroutine(answer):
                    await answer
                proc.on_close(True)
            proc = make()  # type: ignore[operator]
            outcome = await proc.on_request({"x-request-id": f"r{i}"}, body)
            assert isinstance(outcome, RequestRoute)
            picks.append(outcome.set_headers[DESTINATION_HEADER])
            open_.append(proc)
        for proc in open_:
            proc.on_close(True)
        return picks

    direct = await run(direct_clock, lambda: EppProcessor(direct_ctx))
    parse = WorkerParser()
    remote = await run(remote_clock, lambda: RemoteProcessor(link, parse))
    assert remote == direct
    assert len(set(direct)) > 1  # the plan exercises more than one pod
    assert hashed_again == []  # every decision used the parse's hashes
    # The pictures learned the same prefix blocks.
    indexes = [cast(WeightedScheduler, c.scheduler).prefix_index for c in (direct_ctx, remote_ctx)]
    assert indexes[0].memory_entries() == indexes[1].memory_entries() > 0
    await until(lambda: remote_ctx.pool.inflight_total() == 0, "closes applied")
    assert direct_ctx.pool.inflight_total() == 0
    link.close()
    await host.stop()


BAD_REQUESTS: list[tuple[dict[str, str], bytes]] = [
    ({}, b"{not json"),
    ({}, b"\xff\xfe"),
    ({}, b"[1, 2]"),
    ({"x-gateway-model-name": "llama"}, b""),  # a POST without a body
    ({}, b'{"model": 5, "prompt": "hi"}'),
    ({}, b'{"model": "", "prompt": "hi"}'),
    ({}, b'{"model": "mistral", "prompt": "hi"}'),  # a model this pool does not serve
    ({}, b'{"model": "llama", "prompt": "hi", "stream": "yes"}'),
    ({}, b'{"model": "llama", "prompt": 7}'),
    ({}, b'{"model": "llama", "messages": "hi"}'),
    ({}, b'{"model": "sql", "prompt": "hi", "max_tokens": "many"}'),
    ({}, b'{"model": "llama", "input": "hi", "previous_response_id": 3}'),
]


async def test_bad_requests_get_the_same_errors_through_the_link(tmp_path: Path) -> None:
    """Malformed JSON, a missing body, bad fields, an unknown model: the worker's parse refuses
    them exactly as one process does (same status, message, code), and the scheduling process
    counts the refusal (its telemetry) as one process would."""
    direct_ctx, remote_ctx = make_ctx(Clock()), make_ctx(Clock())
    host, link = await linked(tmp_path, remote_ctx, ParsedByTheWorker)
    parse = WorkerParser()
    for headers, body in BAD_REQUESTS:
        direct = await EppProcessor(direct_ctx).on_request(dict(headers), body)
        remote = await RemoteProcessor(link, parse).on_request(dict(headers), body)
        assert isinstance(direct, ErrorResponse), body
        assert remote == direct, body
    assert remote_ctx.pool.inflight_total() == direct_ctx.pool.inflight_total() == 0
    link.close()
    await host.stop()


async def test_a_too_large_body_is_refused_by_the_worker_as_by_one_process(tmp_path: Path) -> None:
    """The body limit (bbr.maxRequestBodyBytes) holds in the worker's stream, with the same 413."""
    ctx = make_ctx(Clock())
    host = ProcessorHost(lambda: EppProcessor(ctx), lambda: {**settings_of(ctx)(), "max_body_bytes": 1000})
    await host.start(str(tmp_path / "decide.sock"))
    link = SchedulerLink(host.path)
    await link.connect()
    direct = EppProcessor(ctx)
    direct.max_body_bytes = 1000
    body = request_body(random.Random(3))
    assert len(body) > 1000
    answers = []
    for processor in (direct, RemoteProcessor(link, WorkerParser())):
        stream = ExtProcStream(processor)
        responses = []
        for msg in [headers_msg(POST), *body_msgs(body, chunk=400)]:
            responses += [r async for r in stream.handle(msg)]
        answers.append(responses)
    assert answers[0] == answers[1]
    assert answers[1][-1].immediate_response.status.code == 413
    assert host.open_streams == 0 and ctx.pool.inflight_total() == 0  # never reached the decider
    link.close()
    await host.stop()


async def test_a_workers_death_releases_every_stream_it_held(tmp_path: Path) -> None:
    ctx = make_ctx(Clock())
    host, link = await linked(tmp_path, ctx)
    procs = [RemoteProcessor(link) for _ in range(5)]
    for i, proc in enumerate(procs):
        assert isinstance(
            await proc.on_request({"x-request-id": f"r{i}"}, request_body(random.Random(i))), RequestRoute
        )
    assert ctx.pool.inflight_total() == 5
    assert host.open_streams == 5
    link.close()  # the worker's socket ends, as when the process is killed
    await until(lambda: ctx.pool.inflight_total() == 0, "in-flight released")
    assert host.open_streams == 0
    await host.stop()


async def test_a_close_while_deciding_cancels_the_decision_and_releases(tmp_path: Path) -> None:
    """Envoy gives up on a stream while the scheduling process still decides it (a flow-control
    wait): the decision is cancelled there, and nothing stays counted."""
    ctx = make_ctx(Clock())
    gate = asyncio.Event()
    closed: list[bool] = []

    class Slow(EppProcessor):
        async def on_request(self, headers: dict[str, str], body: bytes) -> RequestRoute | ErrorResponse:
            await gate.wait()
            return await super().on_request(headers, body)

        def on_close(self, completed: bool) -> None:
            closed.append(completed)
            super().on_close(completed)

    host = ProcessorHost(lambda: Slow(ctx), lambda: {"max_body_bytes": 1 << 20})
    await host.start(str(tmp_path / "decide.sock"))
    link = SchedulerLink(host.path)
    await link.connect()
    proc = RemoteProcessor(link)
    task = asyncio.ensure_future(proc.on_request({}, request_body(random.Random(1))))
    await until(lambda: host.open_streams == 1, "the request reached the host")
    task.cancel()  # gRPC cancels the worker's stream handler
    with pytest.raises(asyncio.CancelledError):
        await task
    proc.on_close(False)
    await until(lambda: closed == [False], "the host closed the stream")
    gate.set()
    assert ctx.pool.inflight_total() == 0
    assert host.open_streams == 0
    link.close()
    await host.stop()


async def test_no_link_fails_the_stream_with_unavailable_at_once(tmp_path: Path) -> None:
    link = SchedulerLink(str(tmp_path / "nobody.sock"))
    with pytest.raises(OSError):
        await link.connect()
    with pytest.raises(StreamAbort) as caught:
        await RemoteProcessor(link).on_request({}, b"{}")
    assert caught.value.code is grpc.StatusCode.UNAVAILABLE


async def test_a_lost_link_fails_the_waiting_streams(tmp_path: Path) -> None:
    ctx = make_ctx(Clock())
    gate = asyncio.Event()

    class Stuck(EppProcessor):
        async def on_request(self, headers: dict[str, str], body: bytes) -> RequestRoute | ErrorResponse:
            await gate.wait()
            raise AssertionError("not reached")

    host = ProcessorHost(lambda: Stuck(ctx), lambda: {"max_body_bytes": 1 << 20})
    await host.start(str(tmp_path / "decide.sock"))
    link = SchedulerLink(host.path)
    await link.connect()
    task = asyncio.ensure_future(RemoteProcessor(link).on_request({}, b"{}"))
    await until(lambda: host.open_streams == 1, "the request reached the host")
    await host.stop()  # the scheduling process goes away mid-decision
    with pytest.raises(StreamAbort) as caught:
        await task
    assert caught.value.code is grpc.StatusCode.UNAVAILABLE


def test_workers_setting_and_flag() -> None:
    assert resolve_workers("auto") == usable_cpus() >= 1
    assert resolve_workers(3) == 3
    assert parse_workers("auto") == "auto" and parse_workers("2") == 2
    for bad in ("0", "many", "-1"):
        with pytest.raises(ValueError):
            parse_workers(bad)
    pools = [{"name": "p", "models": [{"name": "m"}], "epp": {"workers": "auto"}}]
    assert parse_config({"pools": pools}).pool("p").epp.workers == "auto"
    for wrong in (0, 1000, "some"):
        with pytest.raises(ConfigError):
            parse_config({"pools": [{**pools[0], "epp": {"workers": wrong}}]})


def test_usable_cpus_reads_the_cgroup_quota(tmp_path: Path) -> None:
    unlimited = usable_cpus(tmp_path / "absent")
    v2 = tmp_path / "v2"
    v2.mkdir()
    (v2 / "cpu.max").write_text("150000 100000\n")
    assert usable_cpus(v2) == min(2, unlimited)
    (v2 / "cpu.max").write_text("max 100000\n")
    assert usable_cpus(v2) == unlimited
    v1 = tmp_path / "v1" / "cpu"
    v1.mkdir(parents=True)
    (v1 / "cpu.cfs_quota_us").write_text("50000\n")
    (v1 / "cpu.cfs_period_us").write_text("100000\n")
    assert usable_cpus(v1.parent) == 1
    (v1 / "cpu.cfs_quota_us").write_text("-1\n")
    assert usable_cpus(v1.parent) == unlimited


async def test_response_headers_wait_for_an_answer_only_when_the_decision_has_one(tmp_path: Path) -> None:
    """A client that asked for the decision header gets it through the worker; other requests'
    response headers are only reported (no round trip before the response goes on)."""
    ctx = make_ctx(Clock())
    ctx.header_policy = HeaderPolicy(decision_header=True)
    host, link = await linked(tmp_path, ctx)
    asked, plain = RemoteProcessor(link), RemoteProcessor(link)
    await asked.on_request({"x-gateway-decision": "true"}, request_body(random.Random(1)))
    await plain.on_request({}, request_body(random.Random(2)))
    assert plain.on_response_headers({":status": "200"}) is None
    answer = asked.on_response_headers({":status": "200"})
    assert asyncio.iscoroutine(answer)
    explained = await answer
    assert explained is not None and explained[DECISION_HEADER].startswith("chosen=")
    asked.on_close(True)
    plain.on_close(True)
    await until(lambda: ctx.pool.inflight_total() == 0, "both closed")
    link.close()
    await host.stop()
