"""Request headers a client may not use on its own (epp/requestcontrol/header_policy.py), through the real Envoy.

The gateway requires a JWT; a token carrying `gateway_role: operator` makes the request trusted.
The model's own profile is sheddable (priority -1, saturated at 1 waiting request), and its
clients may additionally pick `lax` (same saturation, priority 0), whose priority they never get.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from devstack.launch import LocalGateway, start_local_gateway
from extproc.headers import CLAIM_HEADER
from tests.integration.busy_pods import busy
from tests.integration.conftest import chat
from tests.security.test_jwt import AUDIENCE, GOOD_KEY, ISSUER, jwks, token

MODEL = "llama-3.1-8b-instruct"
FLEET = {
    "time_scale": 5.0,
    "profiles": {"two-seqs": {"base": "h100-llama3.1-8b", "max_num_seqs": 2}},
    "pods": [{"name": "llama", "model": MODEL, "profile": "two-seqs", "replicas": 2}],
}
PROFILES = {
    "sheddable": {"weights": {"queue": 1}, "priority": -1, "thresholds": {"queue": 1}},
    "lax": {"weights": {"queue": 1}, "priority": 0, "thresholds": {"queue": 1}},
}
CLAIM = {"name": "gateway_role", "value": "operator"}
DECISION = {"x-gateway-decision": "true"}


def _patch(config: dict[str, Any]) -> None:
    config["profiles"] = PROFILES
    model = config["pools"][0]["models"][0]
    model["profile"], model["objectives"] = "sheddable", ["lax"]
    config["listener"] = {
        "jwt": {"issuer": ISSUER, "audiences": [AUDIENCE], "jwks": jwks(GOOD_KEY)},
        "trust": {"jwtClaim": CLAIM},
    }


@pytest.fixture(scope="module")
def trust_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalGateway]:
    gw = start_local_gateway(tmp_path_factory.mktemp("trust"), fleet=FLEET, config_patch=_patch)
    try:
        yield gw
    finally:
        gw.stop()


def auth(**claims: Any) -> dict[str, str]:
    return {"authorization": f"Bearer {token(**claims)}"}


TRUSTED = auth(gateway_role="operator")
UNTRUSTED = [
    pytest.param(auth(), id="no-claim"),
    pytest.param(auth(gateway_role="user"), id="other-claim-value"),
    pytest.param({**auth(), CLAIM_HEADER: "operator"}, id="forged-claim-header"),
    pytest.param({**auth(), "X-Gateway-Trusted-Claim": "operator"}, id="forged-claim-header-case"),
]


async def post(gw: LocalGateway, headers: dict[str, str], **extra: object) -> httpx.Response:
    async with gw.client() as client:
        return await client.post("/v1/chat/completions", json=chat(MODEL, **extra), headers=headers)


@pytest.mark.parametrize("headers", UNTRUSTED)
async def test_untrusted_clients_never_see_the_fleet(trust_gateway: LocalGateway, headers: dict) -> None:
    r = await post(trust_gateway, {**headers, **DECISION})
    assert r.status_code == 200, r.text
    assert "x-gateway-decision" not in r.headers
    assert not any(a in str(r.headers) for a in trust_gateway.pods_of(MODEL))


async def test_a_trusted_caller_gets_the_decision(trust_gateway: LocalGateway) -> None:
    r = await post(trust_gateway, {**TRUSTED, **DECISION})
    assert r.status_code == 200, r.text
    decision = r.headers["x-gateway-decision"]
    assert decision.startswith("chosen=") and "; profile=sheddable;" in decision
    assert all(a in decision for a in trust_gateway.pods_of(MODEL))


@pytest.mark.parametrize("headers", UNTRUSTED)
async def test_a_sheddable_model_stays_sheddable(trust_gateway: LocalGateway, headers: dict) -> None:
    async with busy(trust_gateway, "llama-0", 4), busy(trust_gateway, "llama-1", 4):
        answers = [
            await post(trust_gateway, {**headers, "x-gateway-inference-objective": objective})
            for objective in ("default", "lax", "nonsense", "sheddable")
        ]
        plain = await post(trust_gateway, headers)
    for r in [*answers, plain]:
        assert r.status_code == 429, r.text  # saturated and still sheddable: shed
        assert r.json()["error"]["type"] == "rate_limit_error"


async def test_a_trusted_caller_may_raise_the_priority(trust_gateway: LocalGateway) -> None:
    async with busy(trust_gateway, "llama-0", 4), busy(trust_gateway, "llama-1", 4):
        shed, lax, default = await asyncio.gather(
            post(trust_gateway, TRUSTED, max_tokens=2),
            post(trust_gateway, {**TRUSTED, "x-gateway-inference-objective": "lax"}, max_tokens=2),
            post(trust_gateway, {**TRUSTED, "x-gateway-inference-objective": "default"}, max_tokens=2),
        )
    assert shed.status_code == 429, shed.text  # its own profile: sheddable
    assert lax.status_code == 200, lax.text  # priority 0: served even though saturated
    assert default.status_code == 200, default.text


@pytest.fixture(scope="module")
def internal_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalGateway]:
    """A listener that only internal callers reach: every request is trusted, no JWT needed."""

    def internal(config: dict[str, Any]) -> None:
        _patch(config)
        config["listener"] = {"trust": {"internal": True}}

    gw = start_local_gateway(tmp_path_factory.mktemp("internal"), fleet=FLEET, config_patch=internal)
    try:
        yield gw
    finally:
        gw.stop()


async def test_an_internal_listener_trusts_every_caller(internal_gateway: LocalGateway) -> None:
    r = await post(internal_gateway, {**DECISION, "x-gateway-inference-objective": "default"})
    assert r.status_code == 200, r.text
    assert "; profile=default;" in r.headers["x-gateway-decision"]  # picked, and shown
