"""Only the OpenAI inference API reaches the model servers (listener.paths, on by default).

A path outside the allow-list is Envoy's own JSON 404, another method than POST on an inference
path (or than GET on /v1/models) its JSON 405, a header over the limit its JSON 431: neither
BBR nor an EPP runs and no pod sees the request, however the path is spelt. `allowAllPaths:
true` is the explicit opt-out. "Nothing reached a pod" is measured on both sides of Envoy: its
pool clusters' upstream request counters (every request to a pod goes through one), the EPPs'
routed-request counters, and the pods' own count of every request they routed.
"""

from __future__ import annotations

import http.client
import json
import re
import ssl
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from devstack.launch import LocalGateway, start_local_gateway
from extproc.errors import is_anthropic_path
from gateway.config import API_PATHS, MODELS_PATH
from tests.integration.conftest import FAST_FLEET, chat
from tests.reliability.gateway_helpers import metric_value
from tests.security.conftest import HEADERS_KB, LLAMA

# vLLM's admin and auxiliary endpoints, modelsim's own, and the usual server paths.
NOT_SERVED = [
    "/v1/load_lora_adapter",
    "/v1/unload_lora_adapter",
    "/reset_prefix_cache",
    "/sleep",
    "/wake_up",
    "/collective_rpc",
    "/tokenize",
    "/detokenize",
    "/sim/probe",
    "/sim/probe-fleet",
    "/sim/fault",
    "/metrics",
    "/health",
    "/version",
]
# Spellings that must not sneak a path past the exact match (sent byte for byte).
TRICKS = [
    "/v1/chat/completions/../../sleep",
    "/v1/chat/completions/%2e%2e/%2e%2e/sleep",
    "/v1/chat/completions%2F..%2F..%2Fsleep",
    "//sleep",
    "/v1/chat/completions/",
    "/v1/chat/completionsX",
    "/V1/CHAT/COMPLETIONS",
    "/v1/chat/completions/../load_lora_adapter",
]
BODY = {"model": LLAMA, "prompt": "x", "lora_name": "evil", "lora_path": "/tmp/evil"}
INFERENCE_PATHS = [p for p in API_PATHS if p != MODELS_PATH]
OTHER_METHODS = ("PUT", "PATCH", "DELETE", "HEAD", "OPTIONS")


def upstream_requests(gw: LocalGateway) -> int:
    """Requests Envoy sent to any model server (every pool and fallback cluster)."""
    text = httpx.get(f"http://127.0.0.1:{gw.admin_port}/stats", timeout=5).text
    counts = re.findall(r"^cluster\.(?:pool|fallback)-[^.]+\.upstream_rq_total: (\d+)$", text, re.M)
    assert counts, "no pool cluster counters"
    return sum(int(c) for c in counts)


def pod_requests(gw: LocalGateway) -> float:
    """Requests the pods' HTTP apps saw on the API paths, whatever their answer (modelsim)."""
    total = 0.0
    for pod in gw.pods:
        text = httpx.get(f"http://{pod['address']}/metrics", timeout=5).text
        total += sum(metric_value(text, "modelsim_http_requests_total", path=path) for path in API_PATHS)
    return total


def nothing_reached_a_pod(gw: LocalGateway) -> tuple[float, ...]:
    """The counters that move when a request gets past Envoy (compare before and after)."""
    return float(upstream_requests(gw)), routed_by_epps(gw), pod_requests(gw)


def routed_by_epps(gw: LocalGateway) -> float:
    total = 0.0
    for port in gw.epp_metrics_ports.values():
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
        total += metric_value(text, "inference_objective_request_total")
    return total


def raw_request(
    gw: LocalGateway, method: str, path: str, body: dict[str, Any] | None
) -> tuple[int, dict, bytes]:
    """One HTTPS request whose path goes out exactly as given (httpx would normalise it)."""
    context = ssl.create_default_context(cafile=str(gw.certs.ca))
    conn = http.client.HTTPSConnection("127.0.0.1", gw.listen_port, context=context, timeout=30)
    try:
        payload = json.dumps(body).encode() if body is not None else None
        headers = {"content-type": "application/json"} if body is not None else {}
        conn.request(method, path, body=payload, headers=headers)
        r = conn.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        conn.close()


def assert_envoy_404(status: int, headers: dict, body: bytes) -> None:
    assert status == 404, body[:300]
    assert headers["content-type"] == "application/json"
    assert "x-modelsim-pod" not in headers  # a pod's answer would carry it
    error = json.loads(body)["error"]
    assert error["code"] == "not_found" and error["type"] == "invalid_request_error"
    assert "/v1/chat/completions" in error["message"]  # says what is served


@pytest.fixture(scope="module")
def open_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalGateway]:
    """The opt-out: an operator who needs the model servers' other endpoints through Envoy."""

    def allow_all(config: dict[str, Any]) -> None:
        config["listener"] = {"allowAllPaths": True}

    gw = start_local_gateway(tmp_path_factory.mktemp("openpaths"), fleet=FAST_FLEET, config_patch=allow_all)
    try:
        yield gw
    finally:
        gw.stop()


def test_admin_and_auxiliary_paths_never_reach_a_pod(gateway: LocalGateway) -> None:
    before, routed = upstream_requests(gateway), routed_by_epps(gateway)
    sent = 0
    for path in NOT_SERVED:
        for method, body in (("POST", BODY), ("GET", None)):
            assert_envoy_404(*raw_request(gateway, method, path, body))
            sent += 1
    for path in TRICKS:
        assert_envoy_404(*raw_request(gateway, "POST", path, BODY))
        sent += 1
    assert sent == 2 * len(NOT_SERVED) + len(TRICKS)
    assert upstream_requests(gateway) == before, "a request reached a model server"
    assert routed_by_epps(gateway) == routed, "an EPP routed a request"


def test_the_inference_api_is_served_with_any_query_string(gateway: LocalGateway) -> None:
    before = upstream_requests(gateway)
    status, headers, body = raw_request(
        gateway, "POST", "/v1/chat/completions?api-version=2024-10-21", chat(LLAMA)
    )
    assert status == 200, body[:300]
    assert headers["x-modelsim-pod"].startswith("llama-")
    status, _, body = raw_request(gateway, "POST", "/v1/completions", {**BODY, "max_tokens": 2})
    assert status == 200, body[:300]
    assert upstream_requests(gateway) == before + 2  # the counter does see what reaches pods
    status, _, body = raw_request(gateway, "GET", "/v1/models", None)
    assert status == 200 and LLAMA in {m["id"] for m in json.loads(body)["data"]}


def test_allow_all_paths_lets_the_other_endpoints_through(open_gateway: LocalGateway) -> None:
    before = upstream_requests(open_gateway)
    status, headers, body = raw_request(open_gateway, "POST", "/tokenize", BODY)
    assert status == 200 and json.loads(body)["count"] == 1, body[:300]
    assert headers["x-modelsim-pod"].startswith("llama-")
    status, _, body = raw_request(open_gateway, "POST", "/sim/probe", BODY)
    assert status == 200 and "predicted_ttft_s" in json.loads(body), body[:300]
    status, _, body = raw_request(open_gateway, "POST", "/v1/load_lora_adapter", BODY)
    assert status == 404 and b"Not Found" in body  # the pod's own answer: modelsim has no such route
    assert upstream_requests(open_gateway) == before + 3
    status, _, body = raw_request(open_gateway, "POST", "/v1/chat/completions", chat(LLAMA))
    assert status == 200, body[:300]


def assert_envoy_405(
    status: int, headers: dict, body: bytes, method: str, allowed: str, path: str = MODELS_PATH
) -> None:
    assert status == 405, body[:300]
    assert headers["allow"] == allowed
    assert "x-modelsim-pod" not in headers
    assert headers["content-type"] == "application/json"
    if method == "HEAD":  # a HEAD answer has no body
        return
    if is_anthropic_path(path):  # Anthropic's Messages API: its error shape, which has no code
        answer = json.loads(body)
        assert answer["type"] == "error" and answer["error"]["type"] == "invalid_request_error"
        assert allowed in answer["error"]["message"]
        return
    error = json.loads(body)["error"]
    assert error["code"] == "method_not_allowed" and allowed in error["message"]


def test_only_post_reaches_the_inference_paths(gateway: LocalGateway) -> None:
    before = nothing_reached_a_pod(gateway)
    for path in INFERENCE_PATHS:
        for method in ("GET", *OTHER_METHODS):
            assert_envoy_405(*raw_request(gateway, method, path, BODY), method, "POST", path)
    for method in ("POST", "PUT", "DELETE"):
        assert_envoy_405(*raw_request(gateway, method, MODELS_PATH, None), method, "GET")
    assert nothing_reached_a_pod(gateway) == before, "a request reached a model server"
    status, _, body = raw_request(gateway, "POST", "/v1/completions", {**BODY, "max_tokens": 2})
    assert status == 200, body[:300]
    assert pod_requests(gateway) == before[2] + 1  # the pods' counter does see what reaches them


def test_an_oversized_header_is_the_gateway_json_431(gateway: LocalGateway) -> None:
    """9 KB in one header: under Envoy's old 60 KiB default it reached the pod, whose plain-text
    400 came back; the default limit (8 KiB) is below what the model servers accept. Over
    HTTP/2 Envoy's codec resets the stream instead (no status to send): no pod sees it either."""
    assert HEADERS_KB * 1024 < 9 * 1024
    before = nothing_reached_a_pod(gateway)
    big = {"x-big": "v" * 9 * 1024}
    tls = ssl.create_default_context(cafile=str(gateway.certs.ca))
    with httpx.Client(base_url=gateway.url, verify=tls, timeout=30) as client:
        r = client.post("/v1/chat/completions", json=chat(LLAMA), headers=big)
    assert r.status_code == 431, r.text
    assert r.headers["content-type"] == "application/json" and "x-modelsim-pod" not in r.headers
    assert r.json()["error"]["code"] == "request_header_fields_too_large"
    with httpx.Client(base_url=gateway.url, verify=tls, http2=True, timeout=30) as client:
        with pytest.raises(httpx.RemoteProtocolError):
            client.post("/v1/chat/completions", json=chat(LLAMA), headers=big)
    assert nothing_reached_a_pod(gateway) == before, "a request reached a model server"
