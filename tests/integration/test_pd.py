"""Disaggregated prefill/decode through the real Envoy: the EPP names a prefill pod for a long
prompt, the decode pod's sidecar runs the prefill there and the decode locally; a short prompt
stays aggregated; a client cannot name a prefiller; the sidecar refuses one outside its
allow-list; a failing prefill or decode pod gives a clear JSON error and leaves nothing in
flight on either pod."""

from __future__ import annotations

import ssl
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from devstack.launch import LocalGateway, dev_trust
from devstack.pd import PD_FLEET, PD_MODEL, PD_POOL, allow_file_text, start_pd_gateway
from tests.reliability.gateway_helpers import debug_pool, metric_value, pod_fault, wait_for

FLEET = {**PD_FLEET, "time_scale": 10.0}
SHORT_PROMPT = "Hello!"


def long_prompt(topic: str) -> str:
    """~2,000 tokens no pod has cached yet (a cached prompt rightly stays on its decode pod)."""
    return f"please summarise the report on {topic} carefully " * 200


@pytest.fixture(scope="module", params=["single-hop", "two-hop"])
def gw(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalGateway]:
    """Both request paths: the one EPP for every pool, and BBR then the pool's EPP."""
    gw = start_pd_gateway(
        tmp_path_factory.mktemp(f"pd-{request.param}"),
        fleet=FLEET,
        config_patch=dev_trust,
        single_hop=request.param == "single-hop",
    )
    try:
        yield gw
    finally:
        gw.stop()


def body(content: str, **extra: Any) -> dict[str, Any]:
    return {"model": PD_MODEL, "messages": [{"role": "user", "content": content}], "max_tokens": 4, **extra}


def served(gw: LocalGateway, role: str) -> dict[str, int]:
    """Requests each pod of `role` finished (its engine's TTFT count), by pod name."""
    out = {}
    for p in gw.pods:
        if p["role"] == role:
            out[p["name"]] = httpx.get(f"http://{p['address']}/sim/state", timeout=5).json()["ttft_count"]
    return out


def settled(gw: LocalGateway) -> bool:
    """Nothing in flight at the EPP on any pod, and no engine running or queueing a request."""
    if any(e["inflight_requests"] for e in debug_pool(gw, PD_POOL).values()):
        return False
    states = [httpx.get(f"http://{p['address']}/sim/state", timeout=5).json() for p in gw.pods]
    return all(s["running"] == 0 and s["waiting"] == 0 for s in states)


def assert_settled(gw: LocalGateway) -> None:
    wait_for(lambda: settled(gw), 20, "in-flight back to 0 on every pod")
    text = httpx.get(f"http://127.0.0.1:{gw.epp_metrics_ports[PD_POOL]}/metrics", timeout=5).text
    assert metric_value(text, "inference_objective_running_requests", model_name=PD_MODEL) == 0


def post(gw: LocalGateway, payload: dict[str, Any], **headers: str) -> httpx.Response:
    with httpx.Client(
        base_url=gw.url, verify=ssl.create_default_context(cafile=gw.certs.ca), timeout=30
    ) as c:
        return c.post("/v1/chat/completions", json=payload, headers={"x-gateway-decision": "true", **headers})


def test_a_long_prompt_is_prefilled_on_the_chosen_prefill_pod_then_decoded(gw: LocalGateway) -> None:
    before = served(gw, "prefill")
    r = post(gw, body(long_prompt("first")))
    assert r.status_code == 200, r.text
    decision = r.headers["x-gateway-decision"]
    prefill = decision.split(" prefill=", 1)[1].split(";", 1)[0]
    pods = {p["address"]: p for p in gw.pods}
    assert pods[prefill]["role"] == "prefill"
    decode = next(p for p in gw.pods if p.get("sidecar") == decision.split("chosen=", 1)[1].split(" ", 1)[0])
    assert r.headers["x-modelsim-pod"] == decode["name"]  # the decode pod answered
    after = served(gw, "prefill")
    assert after[pods[prefill]["name"]] == before[pods[prefill]["name"]] + 1  # exactly that pod prefilled
    assert sum(after.values()) == sum(before.values()) + 1
    page = httpx.get(f"http://{decode['address']}/metrics", timeout=5).text
    assert metric_value(page, "vllm:external_prefix_cache_hits_total") > 0  # its KV came from the prefill pod
    assert r.json()["usage"]["completion_tokens"] == 4
    assert_settled(gw)


def test_a_streamed_long_prompt_takes_the_same_path(gw: LocalGateway) -> None:
    before = sum(served(gw, "prefill").values())
    with httpx.Client(
        base_url=gw.url, verify=ssl.create_default_context(cafile=gw.certs.ca), timeout=30
    ) as c:
        r = c.post("/v1/chat/completions", json=body(long_prompt("streamed"), stream=True))
    assert r.status_code == 200 and r.text.endswith("data: [DONE]\n\n")
    assert sum(served(gw, "prefill").values()) == before + 1
    assert_settled(gw)


def test_a_short_prompt_stays_aggregated_and_clients_cannot_name_a_prefiller(gw: LocalGateway) -> None:
    before = served(gw, "prefill")
    prefill = next(p["address"] for p in gw.pods if p["role"] == "prefill")
    r = post(gw, body(SHORT_PROMPT))
    assert r.status_code == 200 and " prefill=" not in r.headers["x-gateway-decision"]
    # A client-sent prefiller header never reaches the sidecar: Envoy strips it.
    r = post(
        gw, body(SHORT_PROMPT), **{"x-prefiller-host-port": prefill, "x-prefiller-url": f"http://{prefill}"}
    )
    assert r.status_code == 200
    assert served(gw, "prefill") == before
    assert_settled(gw)


def test_the_sidecar_refuses_a_prefiller_outside_its_allow_list(gw: LocalGateway) -> None:
    allow = gw.workdir / "pd-allow.txt"
    allow.write_text("# no prefill pod allowed\n")
    try:
        before = served(gw, "prefill")
        r = post(gw, body(long_prompt("refused")))
        assert r.status_code == 403, r.text
        assert "not a pod of this pool" in r.json()["error"]["message"]
        assert served(gw, "prefill") == before  # the sidecar sent nothing there
    finally:
        allow.write_text(allow_file_text(gw.pods))
    assert_settled(gw)


@pytest.mark.parametrize("side", ["prefill", "decode"])
def test_a_failing_pod_gives_a_clear_error_and_nothing_stays_in_flight(gw: LocalGateway, side: str) -> None:
    names = [p["name"] for p in gw.pods if p["role"] == side]
    for name in names:
        pod_fault(gw, name, error_rate=1.0)
    try:
        r = post(gw, body(long_prompt(f"failing-{side}")))
        assert r.status_code in (500, 502), r.text
        message = r.json()["error"]["message"]
        assert ("prefill pod" in message) if side == "prefill" else ("fault injection" in message)
    finally:
        for name in names:
            pod_fault(gw, name, error_rate=0.0)
    assert_settled(gw)
