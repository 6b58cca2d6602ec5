"""Hostile request bodies get vLLM's answer, a 400 (or 404) with an OpenAI-style error, never a 500.

The pod runs in its own process (the fleet CLI), so the synchronous client and hypothesis's
synchronous runner never block the event loop that serves it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from devstack.launch import Proc, start_fleet

MODEL, ADAPTER = "llama", "llama-sql"
PATHS = ["/v1/chat/completions", "/v1/completions", "/tokenize", "/sim/probe", "/sim/probe-fleet"]
FLEET = {
    "time_scale": 50.0,
    "pods": [{"name": "llama", "model": MODEL, "adapters": [ADAPTER], "profile": "h100-llama3.1-8b"}],
}
JSON = {"content-type": "application/json"}
SURROGATE = "\ud800"


@pytest.fixture(scope="module")
def pod(tmp_path_factory: pytest.TempPathFactory) -> Iterator[httpx.Client]:
    proc: Proc
    proc, pods = start_fleet(Path(tmp_path_factory.mktemp("hostile")), FLEET)
    try:
        with httpx.Client(base_url=f"http://{pods[0]['address']}", timeout=30) as client:
            yield client
    finally:
        proc.stop()


def assert_vllm_answer(r: httpx.Response) -> None:
    """A success, or vLLM's error shape with a 4xx status: never a server error."""
    assert r.status_code < 500, (r.status_code, r.text[:300])
    if r.status_code == 200:
        return
    assert r.status_code in (400, 404), r.text[:300]
    assert r.headers["content-type"].startswith("application/json")
    error = r.json()["error"]
    assert error["code"] == r.status_code and error["message"]
    assert error["type"] == {400: "BadRequestError", 404: "NotFoundError"}[r.status_code]


def chat(**extra: object) -> dict[str, object]:
    return {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], **extra}


def completion(**extra: object) -> dict[str, object]:
    return {"model": MODEL, "prompt": "hi", **extra}


# Each must be a 400 on every path that reads it (the generation paths read them all).
BAD_REQUESTS = [
    pytest.param(chat(messages=[{"role": "user", "content": f"a {SURROGATE} b"}]), id="surrogate-content"),
    pytest.param(chat(messages=[{"role": SURROGATE, "content": "x"}]), id="surrogate-role"),
    pytest.param(
        chat(messages=[{"role": "user", "content": [{"type": "text", "text": "\udfff"}]}]),
        id="surrogate-content-part",
    ),
    pytest.param(completion(prompt=f"\udc00{SURROGATE}x"), id="surrogate-prompt"),
    pytest.param(completion(prompt=[f"x{SURROGATE}"]), id="surrogate-prompt-list"),
    pytest.param(completion(prompt=[10**30]), id="huge-token-id"),
    pytest.param(completion(prompt=[-1]), id="negative-token-id"),
    pytest.param(completion(prompt=[1, True]), id="bool-token-id"),
    pytest.param(chat(messages=[[[[[[]]]]]]), id="nested-garbage-messages"),
    pytest.param(
        chat(messages=[{"role": "user", "content": [{"type": "text", "text": "a"}, 5]}]), id="bad-part"
    ),
    pytest.param(chat(messages=[{"role": "user", "content": {"a": [1, {"b": None}]}}]), id="content-object"),
    pytest.param(completion(prompt={"nested": [{"deep": [1, 2, {"x": "y"}]}]}), id="prompt-object"),
]
# 400 on the generation paths; the read-only paths ignore these fields.
BAD_GENERATION = [
    pytest.param(completion(seed=10**30), id="huge-seed"),
    pytest.param(completion(seed=-(10**30)), id="huge-negative-seed"),
    pytest.param(completion(max_tokens=10**30), id="huge-max-tokens"),
    pytest.param(chat(max_completion_tokens=2**62), id="max-completion-tokens-beyond-context"),
    pytest.param(completion(max_tokens=1.5), id="float-max-tokens"),
    pytest.param(completion(max_tokens="8"), id="string-max-tokens"),
    pytest.param(completion(max_tokens=0), id="zero-max-tokens"),
    pytest.param(completion(n=[1]), id="list-n"),
    pytest.param(completion(stream={"yes": True}), id="object-stream"),
    pytest.param(completion(stream=True, stream_options=[1]), id="list-stream-options"),
    pytest.param(completion(stream=True, stream_options={"include_usage": "yes"}), id="string-include-usage"),
]


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("body", BAD_REQUESTS)
def test_malformed_prompts_are_400_on_every_path(pod: httpx.Client, path: str, body: dict) -> None:
    if path == "/v1/completions" and "messages" in body:
        body = {**body, "prompt": body["messages"]}  # the same garbage where a completion reads it
    if path == "/v1/chat/completions" and "prompt" in body:
        body = {**body, "messages": body["prompt"]}
    r = pod.post(path, content=json.dumps(body).encode(), headers=JSON)
    assert r.status_code == 400, r.text[:300]
    assert_vllm_answer(r)


@pytest.mark.parametrize("body", BAD_GENERATION)
def test_bad_generation_fields_are_400(pod: httpx.Client, body: dict) -> None:
    path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
    r = pod.post(path, content=json.dumps(body).encode(), headers=JSON)
    assert r.status_code == 400, r.text[:300]
    assert_vllm_answer(r)


@pytest.mark.parametrize(
    "raw",
    [
        pytest.param(b"[" * 100_000 + b"]" * 100_000, id="100k-nested-arrays"),
        pytest.param(
            b'{"model": "llama", "prompt": ' + b"[" * 50_000 + b"]" * 50_000 + b"}", id="nested-prompt"
        ),
        pytest.param(b'{"model": "llama", "prompt": "x", "max_tokens": 1e400}', id="inf-max-tokens"),
        pytest.param(b'{"model": "llama", "prompt": "\xff\xfe"}', id="invalid-utf8"),
        pytest.param(b'{"model": "\\ud800", "prompt": "x"}', id="surrogate-model"),
        pytest.param(b"\x00" * 100, id="nul-bytes"),
    ],
)
@pytest.mark.parametrize("path", PATHS)
def test_raw_garbage_is_never_a_500(pod: httpx.Client, path: str, raw: bytes) -> None:
    r = pod.post(path, content=raw, headers=JSON)
    if path.startswith("/v1/") or b"max_tokens" not in raw:  # read-only paths ignore max_tokens
        assert r.status_code in (400, 404), r.text[:300]
    assert_vllm_answer(r)


def test_a_request_without_max_tokens_is_served(pod: httpx.Client) -> None:
    """The simulator picks a seeded output length (once a TypeError made this a 500)."""
    for body, path in ((chat(seed=7), "/v1/chat/completions"), (completion(), "/v1/completions")):
        r = pod.post(path, json=body)
        assert r.status_code == 200, r.text[:300]
        assert r.json()["usage"]["completion_tokens"] >= 1


def test_generated_bodies_are_never_a_500(pod: httpx.Client) -> None:
    any_text = st.text(st.characters(codec=None, exclude_categories=()), max_size=12)  # surrogates too
    leaves = (
        st.none()
        | st.booleans()
        | st.integers(min_value=-(2**70), max_value=2**70)
        | st.floats(allow_nan=False)
        | any_text
    )
    values = st.recursive(
        leaves, lambda k: st.lists(k, max_size=3) | st.dictionaries(any_text, k, max_size=3), max_leaves=10
    )
    messages = st.lists(
        st.fixed_dictionaries({"role": any_text | values, "content": any_text | values}), max_size=3
    )
    body = st.fixed_dictionaries(
        {"model": st.sampled_from([MODEL, ADAPTER, "nope"]) | values},
        optional={
            "messages": messages | values,
            "prompt": any_text | st.lists(st.integers(-5, 200_000), max_size=4) | values,
            "max_tokens": st.integers(-3, 8) | st.just(10**12) | values,
            "max_completion_tokens": st.integers(-3, 8) | values,
            "seed": st.integers(-(2**65), 2**65) | values,
            "n": st.integers(-1, 2) | values,
            "stream": st.booleans() | values,
            "stream_options": st.fixed_dictionaries({"include_usage": st.booleans() | values}) | values,
        },
    )
    seen: dict[int, int] = {}

    @settings(max_examples=150, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(path=st.sampled_from(PATHS), payload=body)
    # Random bodies are rarely valid: one explicit valid and one hostile case keep the "both
    # kinds were generated" check from depending on luck.
    @example(
        path="/v1/chat/completions", payload={"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
    )
    @example(path="/v1/completions", payload={"model": MODEL, "prompt": "\ud800"})
    def run(path: str, payload: dict) -> None:
        if payload.get("max_tokens") is None and payload.get("max_completion_tokens") is None:
            payload = {**payload, "max_tokens": 4}  # keep generations short: this is about parsing
        r = pod.post(path, content=json.dumps(payload).encode(), headers=JSON)
        seen[r.status_code] = seen.get(r.status_code, 0) + 1
        assert_vllm_answer(r)

    run()
    assert seen.get(200, 0) > 0 and seen.get(400, 0) > 0, seen  # both kinds were generated
