"""Optional JWT authentication at Envoy (jwt_authn, local JWKS) and the path allow-list."""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Iterator
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa

from devstack.launch import LocalGateway, start_local_gateway
from tests.integration.conftest import FAST_FLEET, chat
from tests.security.conftest import LLAMA

ISSUER, AUDIENCE = "https://issuer.test", "inference-gateway"
GOOD_KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)
OTHER_KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)


def _b64(n: int) -> str:
    raw = n.to_bytes((n.bit_length() + 7) // 8, "big")
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def jwks(key: rsa.RSAPrivateKey) -> str:
    numbers = key.public_key().public_numbers()
    jwk = {
        "kty": "RSA",
        "kid": "test",
        "alg": "RS256",
        "use": "sig",
        "n": _b64(numbers.n),
        "e": _b64(numbers.e),
    }
    return json.dumps({"keys": [jwk]})


def token(key: rsa.RSAPrivateKey = GOOD_KEY, **claims: Any) -> str:
    now = int(time.time())
    payload = {
        "iss": ISSUER,
        "aud": AUDIENCE,
        "sub": "tester",
        "iat": now,
        "exp": now + 86_400,
        **claims,
    }  # minted at collection: outlive a slow run
    return jwt.encode(payload, key, algorithm="RS256", headers={"kid": "test"})


def _patch(config: dict[str, Any]) -> None:
    config["listener"] = {
        "paths": ["/v1/chat/completions"],
        "jwt": {"issuer": ISSUER, "audiences": [AUDIENCE], "jwks": jwks(GOOD_KEY)},
    }


@pytest.fixture(scope="module")
def jwt_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalGateway]:
    gw = start_local_gateway(tmp_path_factory.mktemp("jwt"), fleet=FAST_FLEET, config_patch=_patch)
    try:
        yield gw
    finally:
        gw.stop()


async def test_valid_token_is_served(jwt_gateway: LocalGateway) -> None:
    async with jwt_gateway.client() as client:
        r = await client.post(
            "/v1/chat/completions", json=chat(LLAMA), headers={"authorization": f"Bearer {token()}"}
        )
    assert r.status_code == 200, r.text


@pytest.mark.parametrize(
    ("auth", "status"),
    [
        pytest.param(None, 401, id="missing"),
        pytest.param(f"Bearer {token(exp=int(time.time()) - 3600)}", 401, id="expired"),
        pytest.param(f"Bearer {token(OTHER_KEY)}", 401, id="wrong-key"),
        pytest.param("Bearer not.a.jwt", 401, id="garbage"),
        pytest.param(f"Bearer {token(aud='someone-else')}", 403, id="wrong-audience"),
    ],
)
async def test_bad_tokens_get_json_errors(jwt_gateway: LocalGateway, auth: str | None, status: int) -> None:
    headers = {"authorization": auth} if auth else {}
    async with jwt_gateway.client() as client:
        r = await client.post("/v1/chat/completions", json=chat(LLAMA), headers=headers)
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/json"
    error = r.json()["error"]
    assert error["type"] in ("authentication_error", "permission_error") and error["message"]
    assert "x-modelsim-pod" not in r.headers  # never reached a model server


async def test_paths_outside_the_allow_list_are_a_json_404(jwt_gateway: LocalGateway) -> None:
    auth = {"authorization": f"Bearer {token()}"}
    async with jwt_gateway.client() as client:
        r = await client.post("/v1/completions", json={"model": LLAMA, "prompt": "x"}, headers=auth)
        anonymous = await client.post("/sleep", json={"model": LLAMA})
    assert r.status_code == 404
    assert r.json()["error"]["code"] == "not_found"
    assert anonymous.status_code == 401  # authentication comes first: no path probing without a token
