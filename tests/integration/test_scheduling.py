"""The EPP's scheduling through the real Envoy, on pods whose state the tests control, in both
modes of the request path (two-hop and single-hop).

Pods allow 2 running sequences, so requests sent straight to a pod (bypassing the gateway)
build a real queue that the EPP can only learn about by scraping `/metrics`.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Iterator

import httpx
import pytest
import yaml

from devstack.launch import LocalGateway, dev_trust, start_local_gateway
from tests.integration.busy_pods import busy, pod_address, pool_state, wait_for
from tests.integration.conftest import MODES, chat

MODEL = "llama-3.1-8b-instruct"
POOL = "llama-3-1-8b-instruct"
FLEET = {
    "time_scale": 5.0,
    "profiles": {"two-seqs": {"base": "h100-llama3.1-8b", "max_num_seqs": 2}},
    "pods": [
        {"name": "llama", "model": MODEL, "adapters": ["sql-lora"], "profile": "two-seqs", "replicas": 2}
    ],
}
PROFILES = {
    "sheddable": {"weights": {"queue": 1}, "priority": -1, "thresholds": {"queue": 1}},
}


def _patch(config: dict) -> None:
    """The tests read the EPP's choice (decision header) and may pick the sheddable profile."""
    config["profiles"] = PROFILES
    # On a loaded 2-core machine a scrape can come late; with the default 1 s the idle pod then
    # reads stale, the fresh filter leaves only the busy one and a request goes there (seen in
    # a CI run: 2 of 8). No test here is about staleness (tests/unit cover the filter).
    config["thresholds"] = {"staleAfterMs": 30_000}
    dev_trust(config)
    config["pools"][0]["models"][0]["objectives"] = ["sheddable"]


@pytest.fixture(scope="module", params=MODES)
def gateway(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LocalGateway]:
    """Both modes: decisions, admission, trusted headers and reloads are the pool's EPP either way."""
    gw = start_local_gateway(
        tmp_path_factory.mktemp(f"sched-{request.param}"),
        fleet=FLEET,
        config_patch=_patch,
        single_hop=request.param == "single-hop",
    )
    try:
        yield gw
    finally:
        gw.stop()


async def test_scraper_keeps_fresh_metrics_for_every_pod(gateway: LocalGateway) -> None:
    # Fresh: every pod is seen with metrics under a second old (scrapes run every 50 ms; a
    # loaded machine may delay one, so wait for the condition rather than sample it once).
    async def fresh() -> bool:
        state = await pool_state(gateway, POOL)
        return len(state) == 2 and all(
            p["healthy"] and p["metrics"] is not None and p["metrics_age_s"] < 1.0 for p in state.values()
        )

    await wait_for(fresh)
    for pod in (await pool_state(gateway, POOL)).values():
        assert pod["metrics"]["block_size"] == 16  # from vllm:cache_config_info


async def test_decision_header_explains_the_choice(gateway: LocalGateway) -> None:
    async with gateway.client() as client:
        r = await client.post(
            "/v1/chat/completions", json=chat(MODEL), headers={"x-gateway-decision": "true"}
        )
    assert r.status_code == 200
    decision = r.headers["x-gateway-decision"]
    # The chosen pod first, by address and by the name the answer carries, then the scores.
    served = r.headers["x-modelsim-pod"]
    chosen = pod_address(gateway, served)
    assert decision.startswith(f"chosen={chosen} pod={served}; profile=default; {chosen} "), decision
    for address in gateway.pods_of(MODEL):
        assert address in decision
    assert "kv-cache=" in decision and "predicted-ttft=" in decision and "total=" in decision


async def test_requests_avoid_the_pod_with_a_queue(gateway: LocalGateway) -> None:
    idle = pod_address(gateway, "llama-1")
    async with busy(gateway, "llama-0", 6), gateway.client() as client:
        served = []
        for i in range(8):
            r = await client.post("/v1/chat/completions", json=chat(MODEL, f"question {i}", max_tokens=2))
            assert r.status_code == 200
            served.append(r.headers["x-modelsim-pod"])
    assert served == ["llama-1"] * 8, served
    assert idle in gateway.pods_of(MODEL)


async def test_sheddable_traffic_gets_429_when_the_pool_is_saturated(gateway: LocalGateway) -> None:
    async with busy(gateway, "llama-0", 4), busy(gateway, "llama-1", 4), gateway.client() as client:
        shed = await client.post(
            "/v1/chat/completions", json=chat(MODEL), headers={"x-gateway-inference-objective": "sheddable"}
        )
        normal = await client.post("/v1/chat/completions", json=chat(MODEL, max_tokens=2))
    assert shed.status_code == 429
    assert int(shed.headers["retry-after"]) >= 1
    assert shed.json()["error"]["type"] == "rate_limit_error"
    assert normal.status_code == 200  # priority >= 0 still goes to the least-loaded pod


async def epp_metric(gw: LocalGateway, name: str, labels: str = "") -> float:
    async with httpx.AsyncClient() as c:
        text = (await c.get(f"http://127.0.0.1:{gw.epp_metrics_ports[POOL]}/metrics")).text
    for line in text.splitlines():
        if line.startswith(name + labels + " ") or (not labels and line.startswith(name + " ")):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


async def test_weights_reload_within_seconds_without_failing_requests(gateway: LocalGateway) -> None:
    config = yaml.safe_load(gateway.config_path.read_text())
    failures: list[int] = []
    stop = asyncio.Event()

    async def steady_traffic() -> None:
        async with gateway.client() as client:
            while not stop.is_set():
                r = await client.post("/v1/chat/completions", json=chat(MODEL, max_tokens=2))
                if r.status_code != 200:
                    failures.append(r.status_code)

    traffic = asyncio.create_task(steady_traffic())
    try:
        config["profiles"]["default"] = {"weights": {"queue": 1, "running-requests": 5}}
        gateway.config_path.write_text(yaml.safe_dump(config, sort_keys=False))

        async def new_weights_in_force() -> bool:
            async with gateway.client() as client:
                r = await client.post(
                    "/v1/chat/completions", json=chat(MODEL), headers={"x-gateway-decision": "1"}
                )
            return "running-requests=" in r.headers.get("x-gateway-decision", "")

        await wait_for(new_weights_in_force, timeout_s=5)

        rejected_before = await epp_metric(gateway, "gateway_config_reloads_total", '{result="rejected"}')
        config["profiles"]["default"] = {"weights": {"no-such-scorer": 1}}
        gateway.config_path.write_text(yaml.safe_dump(config, sort_keys=False))

        async def rejected() -> bool:
            return (
                await epp_metric(gateway, "gateway_config_reloads_total", '{result="rejected"}')
                > rejected_before
            )

        await wait_for(rejected, timeout_s=5)
        async with gateway.client() as client:
            r = await client.post(
                "/v1/chat/completions", json=chat(MODEL), headers={"x-gateway-decision": "1"}
            )
        assert r.status_code == 200
        assert "running-requests=" in r.headers["x-gateway-decision"]  # the last good weights stay
    finally:
        stop.set()
        await traffic
    assert failures == []


def test_client_helper_uses_the_generated_ca(gateway: LocalGateway) -> None:
    ctx = ssl.create_default_context(cafile=str(gateway.certs.ca))
    with httpx.Client(verify=ctx) as c:
        assert c.get(gateway.url + "/v1/models").status_code == 200
