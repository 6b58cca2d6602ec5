"""BBR: body in, routing headers out."""

from __future__ import annotations

import json
import random
from collections import Counter

from bbr.router import BodyRouter
from extproc.errors import ErrorResponse
from extproc.headers import BASE_MODEL_HEADER, MODEL_HEADER
from extproc.stream import RequestRoute
from gateway.config import GatewayConfig, parse_config


def config(**bbr: object) -> GatewayConfig:
    return parse_config(
        {
            "pools": [
                {
                    "name": "llama",
                    "models": [
                        {"name": "llama", "adapters": ["sql-v1", "sql-v2"]},
                        {
                            "name": "canary",
                            "rewrites": [
                                {"model": "sql-v1", "weight": 80},
                                {"model": "sql-v2", "weight": 20},
                            ],
                        },
                    ],
                }
            ],
            "bbr": bbr,
        }
    )


def route(
    cfg: GatewayConfig, payload: object, headers: dict[str, str] | None = None, seed: int = 1
) -> RequestRoute | ErrorResponse:
    raw = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    return BodyRouter(lambda: cfg, random.Random(seed)).route(headers or {}, raw)


def test_base_model_sets_only_the_model_header() -> None:
    r = route(config(), {"model": "llama"})
    assert isinstance(r, RequestRoute)
    assert r.set_headers == {MODEL_HEADER: "llama"} and r.clear_route_cache and r.body is None


def test_adapter_also_names_its_base_model() -> None:
    r = route(config(), {"model": "sql-v2"})
    assert isinstance(r, RequestRoute)
    assert r.set_headers == {MODEL_HEADER: "sql-v2", BASE_MODEL_HEADER: "llama"}


def test_client_routing_headers_are_removed_but_objective_passes() -> None:
    headers = {"x-gateway-destination-endpoint": "6.6.6.6:80", "x-gateway-inference-objective": "chat"}
    r = route(config(), {"model": "llama"}, headers)
    assert isinstance(r, RequestRoute)
    assert r.remove_headers == ("x-gateway-destination-endpoint",)


def test_missing_model_uses_the_default_or_is_refused() -> None:
    refused = route(config(), {"messages": []})
    assert isinstance(refused, ErrorResponse) and refused.status == 400
    defaulted = route(config(defaultModel="llama"), {"messages": []})
    assert isinstance(defaulted, RequestRoute)
    assert defaulted.set_headers[MODEL_HEADER] == "llama"
    assert json.loads(defaulted.body or b"{}")["model"] == "llama"  # the pod sees a named model


def test_weighted_rewrite_splits_traffic_and_rewrites_the_body() -> None:
    cfg = config()
    router = BodyRouter(lambda: cfg, random.Random(7))
    counts: Counter[str] = Counter()
    for _ in range(2000):
        r = router.route({}, b'{"model": "canary", "prompt": "x"}')
        assert isinstance(r, RequestRoute) and r.body is not None
        chosen = json.loads(r.body)["model"]
        assert r.set_headers[MODEL_HEADER] == chosen and r.set_headers[BASE_MODEL_HEADER] == "llama"
        counts[chosen] += 1
    assert 0.76 < counts["sql-v1"] / 2000 < 0.84


def test_errors() -> None:
    cases = {
        b"\xff": "invalid_encoding",
        b"nope": "invalid_json",
        b"[]": "invalid_json",
        b'{"model": 1}': "invalid_model",
    }
    for raw, code in cases.items():
        r = route(config(), raw)
        assert isinstance(r, ErrorResponse) and r.status == 400 and r.code == code
    unknown = route(config(), {"model": "gpt-9"})
    assert isinstance(unknown, ErrorResponse) and unknown.status == 404
    deep = route(config(), b"[" * 100_000 + b"]" * 100_000)
    assert isinstance(deep, ErrorResponse) and deep.status == 400


def test_rewrite_weights_summing_to_zero_are_rejected() -> None:
    import pytest

    from gateway.config import ConfigError

    with pytest.raises(ConfigError, match="weights sum to 0"):
        parse_config(
            {"pools": [{"name": "p", "models": [{"name": "m", "rewrites": [{"model": "m", "weight": 0}]}]}]}
        )


def test_get_without_body_passes() -> None:
    cfg = config()
    r = BodyRouter(lambda: cfg).route({":method": "GET"}, b"")
    # Re-route always: a route picked on a forged (since stripped) model header must not stick.
    assert r == RequestRoute(clear_route_cache=True)
