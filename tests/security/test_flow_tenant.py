"""The flow-control tenant through the real Envoy: a verified JWT claim counts, client headers do not.

Envoy's jwt_authn copies the `org` claim into `x-gateway-tenant-claim` after verifying the token;
the same header sent by a client is stripped first. Untrusted requests without the claim are one
tenant, `anonymous`, whatever tenant header they send. Both pods are saturated, so each request
waits (300 ms) in the EPP's standard band and times out, counted under its tenant.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from devstack.launch import LocalGateway, start_local_gateway
from extproc.headers import TENANT_CLAIM_HEADER
from tests.integration.busy_pods import busy
from tests.integration.conftest import chat
from tests.reliability.gateway_helpers import metric_value
from tests.security.test_jwt import AUDIENCE, GOOD_KEY, ISSUER, jwks, token

MODEL = "llama-3.1-8b-instruct"
POOL = "llama-3-1-8b-instruct"
FLEET = {
    "time_scale": 5.0,
    "profiles": {"two-seqs": {"base": "h100-llama3.1-8b", "max_num_seqs": 2}},
    "pods": [{"name": "llama", "model": MODEL, "profile": "two-seqs", "replicas": 2}],
}


def _patch(config: dict[str, Any]) -> None:
    config["thresholds"] = {"queue": 1}
    config["listener"] = {"jwt": {"issuer": ISSUER, "audiences": [AUDIENCE], "jwks": jwks(GOOD_KEY)}}
    config["flowControl"] = {"enabled": True, "tenantClaim": "org", "standard": {"maxWaitMs": 300}}


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalGateway]:
    gw = start_local_gateway(tmp_path_factory.mktemp("tenant"), fleet=FLEET, config_patch=_patch)
    try:
        yield gw
    finally:
        gw.stop()


def bearer(**claims: Any) -> dict[str, str]:
    return {"authorization": f"Bearer {token(**claims)}"}


async def test_only_the_verified_claim_names_the_tenant(gateway: LocalGateway) -> None:
    forged = {**bearer(), TENANT_CLAIM_HEADER: "acme", "x-gateway-tenant": "acme"}
    async with busy(gateway, "llama-0", 4), busy(gateway, "llama-1", 4), gateway.client() as client:
        replies = await asyncio.gather(
            client.post("/v1/chat/completions", json=chat(MODEL), headers=bearer(org="acme")),
            client.post("/v1/chat/completions", json=chat(MODEL), headers=forged),
        )
    assert [r.status_code for r in replies] == [429, 429]
    assert all(r.json()["error"]["code"] == "flow_control_timeout" for r in replies)
    async with httpx.AsyncClient() as c:
        text = (await c.get(f"http://127.0.0.1:{gateway.epp_metrics_ports[POOL]}/metrics")).text
    name = "inference_flow_control_outcomes_total"
    assert metric_value(text, name, band="standard", tenant="acme", outcome="timeout") == 1
    assert metric_value(text, name, band="standard", tenant="anonymous", outcome="timeout") == 1
