"""Integration fixtures: a whole local gateway (real Envoy, BBR, EPPs, simulated fleet)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from devstack.launch import FAST_FLEET, LocalGateway, dev_trust, start_local_gateway


def add_canary(config: dict) -> None:
    """A virtual model that BBR splits 3:1 between the base model and its adapter."""
    llama = next(p for p in config["pools"] if p["models"][0]["name"] == "llama-3.1-8b-instruct")
    llama["models"].append(
        {
            "name": "llama-canary",
            "rewrites": [{"model": "llama-3.1-8b-instruct", "weight": 3}, {"model": "sql-lora", "weight": 1}],
        }
    )


# The two shapes of the request path: BBR + one EPP per pool (the default, and what a Gateway API
# implementation runs), and single-hop (one EPP for every pool, one ext_proc stream).
MODES = ("two-hop", "single-hop")
# Each shape with request bodies buffered by Envoy too (`listener.requestBodyMode: buffered`,
# limited to BUFFER_LIMIT_BYTES) instead of streamed through the services (the default).
REQUEST_PATHS = (*MODES, *(f"{mode}-buffered" for mode in MODES))
BUFFER_LIMIT_BYTES = 3 * 1024 * 1024


def use_profile(config: dict, name: str, weights: dict[str, float]) -> None:
    """Make `name` (these weights) the pools' default profile, with the decision header on."""
    dev_trust(config)
    config["profiles"] = {name: {"weights": weights}}
    config["defaultProfile"] = name


def local_gateway(
    tmp_path_factory: pytest.TempPathFactory, name: str, **options: Any
) -> Iterator[LocalGateway]:
    """A module's gateway (`start_local_gateway` options), stopped when the module is done."""
    gw = start_local_gateway(tmp_path_factory.mktemp(name), **options)
    try:
        yield gw
    finally:
        gw.stop()


def canary_gateway(tmp_path_factory: pytest.TempPathFactory, mode: str = "two-hop") -> Iterator[LocalGateway]:
    buffered = mode.endswith("-buffered")
    listener = {"requestBodyMode": "buffered", "maxBufferedBodyBytes": BUFFER_LIMIT_BYTES}
    yield from local_gateway(
        tmp_path_factory,
        f"gateway-{mode}",
        fleet=FAST_FLEET,
        config_patch=add_canary,
        config_extra={"listener": listener} if buffered else None,
        single_hop=mode.removesuffix("-buffered") == "single-hop",
    )


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalGateway]:
    yield from canary_gateway(tmp_path_factory)


@pytest.fixture(scope="module", params=MODES)
def gateway_each_mode(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LocalGateway]:
    """The same gateway in both modes: request-path tests run twice, one start per mode."""
    yield from canary_gateway(tmp_path_factory, request.param)


@pytest.fixture(scope="module", params=REQUEST_PATHS)
def gateway_each_path(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LocalGateway]:
    """Both modes, each with streamed and with buffered request bodies: one start per path."""
    yield from canary_gateway(tmp_path_factory, request.param)


def chat(model: str, content: str = "Hello there", **extra: object) -> dict[str, object]:
    return {"model": model, "messages": [{"role": "user", "content": content}], "max_tokens": 8, **extra}
