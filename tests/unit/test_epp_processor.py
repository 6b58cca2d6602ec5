"""The EPP's request lifecycle on one stream: parse, pick, account exactly once."""

from __future__ import annotations

import json

import pytest

from epp.app import build_scheduler
from epp.datalayer.endpoint_records import Endpoint, Metrics
from epp.datalayer.pool import Pool
from epp.datalayer.tokenizer import PoolTokenizers
from epp.requestcontrol.booking import Booking
from epp.requestcontrol.context import EppContext
from epp.requestcontrol.header_policy import HeaderPolicy
from epp.requestcontrol.processor import EppProcessor
from epp.requestcontrol.telemetry import Telemetry
from epp.scheduling.request import parse_request
from epp.scheduling.weighted import WeightedScheduler
from extproc.errors import ErrorResponse
from extproc.headers import DESTINATION_HEADER
from extproc.stream import RequestRoute
from gateway.config import parse_config
from modelsim.build_tokenizer import OUT as SHIPPED_TOKENIZER

CONFIG = parse_config(
    {
        "pools": [
            {"name": "llama", "models": [{"name": "llama", "adapters": ["sql"]}], "fallbackEndpoints": 1},
            {"name": "qwen", "models": [{"name": "qwen"}]},
        ]
    }
)
A, B = "10.0.0.1:8000", "10.0.0.2:8000"


def make_ctx() -> EppContext:
    pool = Pool(
        [
            Endpoint(A, frozenset({"llama"}), frozenset({"sql"})),
            Endpoint(B, frozenset({"llama"}), frozenset({"other"})),
        ]
    )
    for address, waiting in ((A, 0.0), (B, 3.0)):
        pool.record_metrics(address, Metrics(waiting=waiting, scraped_at=pool.snapshot().taken_at))
    ctx = EppContext(
        "llama", pool, WeightedScheduler(CONFIG.scheduler_profiles()), lambda: CONFIG, Telemetry("llama")
    )
    ctx.fallback_endpoints = 1
    return ctx


def body(model: str = "llama", **extra: object) -> bytes:
    return json.dumps({"model": model, "messages": [{"role": "user", "content": "hi"}], **extra}).encode()


async def test_routes_to_the_best_pod_with_a_fallback_and_accounts_once() -> None:
    ctx = make_ctx()
    proc = EppProcessor(ctx)
    route = await proc.on_request({"x-gateway-model-name": "llama"}, body())
    assert isinstance(route, RequestRoute)
    assert route.set_headers[DESTINATION_HEADER] == f"{A},{B}"  # best first, then the fallback
    assert route.metadata == {"envoy.lb": {DESTINATION_HEADER: f"{A},{B}"}}
    assert route.clear_route_cache
    assert ctx.pool.inflight_total() == 1
    proc.on_response_headers({":status": "200"})
    proc.on_close(True)
    proc.on_close(False)  # a second close must not decrement again
    assert ctx.pool.inflight_total() == 0


async def test_abort_before_any_response_still_returns_the_slot() -> None:
    ctx = make_ctx()
    proc = EppProcessor(ctx)
    await proc.on_request({}, body())
    proc.on_close(False)
    assert ctx.pool.inflight_total() == 0


async def test_adapter_requests_only_go_to_pods_that_have_it() -> None:
    ctx = make_ctx()
    ctx.pool.record_metrics(A, Metrics(waiting=9.0, scraped_at=ctx.pool.snapshot().taken_at))
    route = await EppProcessor(ctx).on_request({}, body("sql"))
    assert isinstance(route, RequestRoute)
    assert route.set_headers[DESTINATION_HEADER] == A  # B lacks the adapter, however idle


@pytest.mark.parametrize(
    ("payload", "status", "code"),
    [
        (b"", 400, "missing_body"),
        (b"{not json", 400, "invalid_json"),
        (body("qwen"), 404, "model_not_found"),  # another pool's model
        (body(max_tokens="many"), 400, "invalid_request"),
        (json.dumps({"model": "llama", "messages": "nope"}).encode(), 400, "invalid_request"),
    ],
)
async def test_bad_requests_are_refused_without_accounting(payload: bytes, status: int, code: str) -> None:
    ctx = make_ctx()
    proc = EppProcessor(ctx)
    result = await proc.on_request({"x-gateway-model-name": "llama"}, payload)
    assert isinstance(result, ErrorResponse)
    assert (result.status, result.code) == (status, code)
    proc.on_close(False)
    assert ctx.pool.inflight_total() == 0


async def test_no_serving_endpoint_is_503() -> None:
    ctx = make_ctx()
    ctx.pool.set_endpoints([])
    result = await EppProcessor(ctx).on_request({}, body())
    assert isinstance(result, ErrorResponse) and result.status == 503


async def test_decision_is_explained_on_the_response_only_when_asked_and_allowed() -> None:
    ctx = make_ctx()
    refused = EppProcessor(ctx)  # the default policy keeps the fleet's topology to itself
    await refused.on_request({"x-gateway-decision": "true"}, body())
    assert refused.on_response_headers({":status": "200"}) is None
    refused.on_close(True)  # its pick no longer occupies 10.0.0.1 (the ledger)
    ctx.header_policy = HeaderPolicy(decision_header=True)
    asked = EppProcessor(ctx)
    await asked.on_request({"x-gateway-decision": "true"}, body())
    explained = asked.on_response_headers({":status": "200"})
    # 10.0.0.2's total is within the tie band of 10.0.0.1's, which was picked last: the
    # near-equal pods rotate, and the header names the chosen one first with its scores.
    assert explained is not None and explained["x-gateway-decision"].startswith(
        "chosen=10.0.0.2:8000; profile=default; 10.0.0.2:8000"
    )
    quiet = EppProcessor(ctx)
    await quiet.on_request({}, body())
    assert quiet.on_response_headers({":status": "200"}) is None


async def test_the_decision_header_names_the_chosen_pod_first_even_on_a_tie() -> None:
    """Two idle pods score the same: only the header's head tells which one won."""
    pool = Pool([Endpoint(a, frozenset({"llama"}), name=n) for a, n in ((A, "llama-0"), (B, "llama-1"))])
    for address in (A, B):
        pool.record_metrics(address, Metrics(scraped_at=pool.snapshot().taken_at))
    ctx = EppContext(
        "llama", pool, WeightedScheduler(CONFIG.scheduler_profiles()), lambda: CONFIG, Telemetry("llama")
    )
    ctx.header_policy = HeaderPolicy(decision_header=True)
    proc = EppProcessor(ctx)
    route = await proc.on_request({"x-gateway-decision": "true"}, body())
    assert isinstance(route, RequestRoute)
    chosen = route.set_headers[DESTINATION_HEADER]
    explained = proc.on_response_headers({":status": "200"})
    assert explained is not None
    name = {A: "llama-0", B: "llama-1"}[chosen]
    assert explained["x-gateway-decision"].startswith(
        f"chosen={chosen} pod={name}; profile=default; {chosen} "
    )


async def test_body_less_request_passes_through_untouched() -> None:
    result = await EppProcessor(make_ctx()).on_request({":method": "GET"}, b"")
    assert result == RequestRoute()


async def test_a_retry_to_the_fallback_moves_the_inflight_slot_there() -> None:
    """In-flight count, tokens and the ledger's commitment all move to the pod that served."""
    ctx = make_ctx()
    proc = EppProcessor(ctx)
    await proc.on_request({}, body())  # destination A,B
    proc.on_response_headers({":status": "200", "x-gateway-destination-endpoint-served": B})
    snapshot = {e.address: e for e in ctx.pool.snapshot().endpoints}
    assert {a: e.inflight_requests for a, e in snapshot.items()} == {A: 0, B: 1}
    assert snapshot[A].inflight_tokens == 0 and snapshot[B].inflight_tokens > 0
    assert [len(ctx.pool.ledger(a) or ()) for a in (A, B)] == [0, 1]
    proc.on_close(True)
    assert ctx.pool.inflight_total() == 0
    assert [len(ctx.pool.ledger(a) or ()) for a in (A, B)] == [0, 0]


async def test_any_model_is_scheduled_on_a_pool_that_accepts_any() -> None:
    config = parse_config(
        {"pools": [{"name": "llama", "models": [{"name": "llama"}], "acceptAnyModel": True}]}
    )
    ctx = make_ctx()
    ctx.config = lambda: config
    route = await EppProcessor(ctx).on_request({}, body("conformance-fake-model"))
    assert isinstance(route, RequestRoute) and route.set_headers[DESTINATION_HEADER].split(",")[0] in (A, B)
    refused = await EppProcessor(make_ctx()).on_request({}, body("conformance-fake-model"))
    assert isinstance(refused, ErrorResponse) and refused.status == 404


async def test_conformance_mode_narrows_the_pool_and_reports_the_served_endpoint() -> None:
    ctx = make_ctx()
    ctx.conformance_test_mode = True
    proc = EppProcessor(ctx)
    route = await proc.on_request({"test-epp-endpoint-selection": B}, body())
    assert isinstance(route, RequestRoute) and route.set_headers[DESTINATION_HEADER] == B  # not the better A
    extra = proc.on_response_headers({":status": "200", "x-gateway-destination-endpoint-served": B})
    assert extra == {"x-conformance-test-served-endpoint": B}
    proc.on_close(True)
    off = EppProcessor(make_ctx())  # outside test mode the header means nothing
    route = await off.on_request({"test-epp-endpoint-selection": B}, body())
    assert isinstance(route, RequestRoute) and route.set_headers[DESTINATION_HEADER].startswith(A)


def test_prompt_text_of_every_openai_shape() -> None:
    from epp.scheduling.request import prompt_text

    assert prompt_text({"input": "embed me"}) == "embed me"
    assert prompt_text({"input": ["a", "b"]}) == "ab"
    assert prompt_text({"input": [1, 2]}) == "1,2,"
    assert prompt_text({"instructions": "be brief", "input": "hi"}) == "system:be brief\nhi"
    items = [
        {"role": "user", "content": [{"type": "input_text", "text": "q1"}]},
        {"role": "user", "content": "q2"},
    ]
    assert prompt_text({"input": items}) == "user:q1\nuser:q2\n"
    assert prompt_text({"prompt": ["x", "y"]}) == "xy"


async def test_tokenized_request_counts_its_real_prompt_tokens() -> None:
    """With token ids (a model tokenizer, a profile reading them) the prompt size every scorer
    and the in-flight accounting use is the ids' count, not the chars / 4 estimate."""
    config = parse_config(
        {
            "profiles": {"default": {"weights": {"precise-prefix-cache": 3, "queue": 1}}},
            "pools": [{"name": "llama", "models": [{"name": "llama", "tokenizer": str(SHIPPED_TOKENIZER)}]}],
        }
    )
    ctx = make_ctx()
    ctx.scheduler = build_scheduler(config)
    ctx.tokenizers = PoolTokenizers()
    ctx.tokenizers.configure([("llama", str(SHIPPED_TOKENIZER))])
    # Punctuation and digits: the shipped BPE needs far more than chars / 4 tokens for them.
    data = {
        "model": "llama",
        "messages": [{"role": "user", "content": "(1, 2); [3, 4]! " * 20}],
        "max_tokens": 7,
    }
    ids = await ctx.tokenizers.token_ids("llama", data)
    assert ids is not None
    estimate = parse_request(
        data, request_id="r", target_model="llama", adapter=None, headers={}
    ).prompt_tokens
    assert len(ids) > 1.5 * estimate  # the two counts must differ for this test to mean anything
    proc = EppProcessor(ctx)
    route = await proc.on_request({"x-gateway-model-name": "llama"}, json.dumps(data).encode())
    assert isinstance(route, RequestRoute)
    address = route.set_headers[DESTINATION_HEADER].split(",")[0]
    inflight = {e.address: e.inflight_tokens for e in ctx.pool.snapshot().endpoints}
    assert inflight[address] == len(ids) + 7
    proc.on_close(True)
    assert all(e.inflight_tokens == 0 for e in ctx.pool.snapshot().endpoints)


async def test_an_adapter_request_holds_its_slot_on_the_pod_until_its_stream_closes() -> None:
    """Adapter placement counts each pod's adapters in flight (epp/datalayer/adapter_residency.py): one per
    routed request, released exactly once at the close, moved with a retry."""
    ctx = make_ctx()
    residency = ctx.scheduler.residency  # type: ignore[attr-defined]
    proc = EppProcessor(ctx)
    await proc.on_request({}, body("sql"))
    assert residency.in_flight(A) == {"sql": 1}
    proc.on_close(True)
    proc.on_close(False)
    assert residency.in_flight(A) == {}
    retried = EppProcessor(ctx)
    await retried.on_request({}, body("sql"))
    retried.on_response_headers({":status": "200", "x-gateway-destination-endpoint-served": B})
    assert residency.in_flight(A) == {} and residency.in_flight(B) == {"sql": 1}
    retried.on_close(True)
    assert residency.in_flight(B) == {}


async def test_a_booking_is_released_once_from_wherever_a_retry_moved_it() -> None:
    """#43: what a pick records (pool, ledger, scheduler) lives in one `Booking`, released
    exactly once, on the pod the request ended on."""
    ctx = make_ctx()
    data = json.loads(body())
    request = parse_request(data, request_id="r", target_model="llama", adapter=None, headers={})
    decision = ctx.scheduler.pick(request, ctx.pool.snapshot())
    booking = Booking.book(ctx, request, decision)
    assert booking.address == A and ctx.pool.inflight_total() == 1
    booking.move(B)
    assert booking.address == B and ctx.pool.inflight_total() == 1
    assert booking.release() and not booking.release()
    booking.move(A)  # after the release: nothing to move
    assert ctx.pool.inflight_total() == 0
    assert {e.address: e.inflight_requests for e in ctx.pool.snapshot().endpoints} == {A: 0, B: 0}
