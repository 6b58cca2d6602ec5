"""Token counting from response bodies, chunk by chunk."""

from __future__ import annotations

import json

from globalrouter.ratelimit import tenant_of
from globalrouter.usage import UsageMeter, prompt_token_estimate


def test_json_usage_across_chunks() -> None:
    body = json.dumps(
        {"choices": [], "usage": {"prompt_tokens": 11, "completion_tokens": 5, "total_tokens": 16}}
    )
    meter = UsageMeter(streaming=False, prompt_estimate=99)
    raw = body.encode()
    meter.feed(raw[:10], False)
    meter.feed(raw[10:], True)
    assert meter.tokens == 16


def test_sse_usage_chunk_wins_over_counting() -> None:
    events = [{"choices": [{"delta": {"content": "x"}}]} for _ in range(3)]
    events.append({"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}})
    stream = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"
    meter = UsageMeter(streaming=True, prompt_estimate=50)
    raw = stream.encode()
    for i in range(0, len(raw), 13):  # split mid-line
        meter.feed(raw[i : i + 13], False)
    meter.feed(b"", True)
    assert meter.tokens == 10


def test_sse_without_usage_counts_events_plus_prompt_estimate() -> None:
    stream = "".join(f"data: {json.dumps({'choices': [{'delta': {'content': 'x'}}]})}\n\n" for _ in range(4))
    meter = UsageMeter(streaming=True, prompt_estimate=20)
    meter.feed(stream.encode() + b"data: [DONE]\n\n", True)
    assert meter.tokens == 24


def test_garbage_body_falls_back_to_the_estimate() -> None:
    meter = UsageMeter(streaming=False, prompt_estimate=12)
    meter.feed(b"<html>oops", True)
    assert meter.tokens == 12
    assert prompt_token_estimate(b"x" * 400) == 100


def test_tenant_identity() -> None:
    assert tenant_of({"x-tenant": "acme"}, "x-tenant") == "acme"
    keyed = tenant_of({"authorization": "Bearer sk-secret"}, "x-tenant")
    assert keyed.startswith("key-") and "secret" not in keyed
    assert keyed == tenant_of({"authorization": "bearer  sk-secret"}, "x-tenant")
    assert tenant_of({}, "x-tenant") == "anonymous"
