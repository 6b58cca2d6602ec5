"""A reload's log line says what it changed, so an operator who edited a weight can see it taken."""

from __future__ import annotations

import logging

import pytest

from gateway.config import parse_config
from gateway.config_store import CHANGES_LOGGED, ConfigStore, describe_change

BASE = {
    "pools": [{"name": "p", "models": [{"name": "m"}], "endpoints": [{"address": "10.0.0.1:8000"}]}],
    "profiles": {"default": {"weights": {"queue": 1}}},
}


def test_the_applied_line_names_each_changed_setting(caplog: pytest.LogCaptureFixture) -> None:
    store = ConfigStore(parse_config(BASE))
    edited = {**BASE, "profiles": {"default": {"weights": {"queue": 2, "kv-cache": 1}}}}
    with caplog.at_level(logging.INFO, logger="gateway.config_store"):
        assert store.offer_data(edited, "gateway.yaml")
        assert store.offer_data(edited, "gateway.yaml")
    first, second = [r.getMessage() for r in caplog.records if "applied" in r.getMessage()]
    assert first == (
        "config from gateway.yaml applied: profiles.default.weights.queue: 1.0 -> 2.0; "
        "profiles.default.weights.kv-cache: (absent) -> 1.0"
    )
    assert second == "config from gateway.yaml applied: no change"


def test_an_added_item_is_named_once_and_a_long_change_is_counted() -> None:
    two_models = {**BASE, "pools": [{**BASE["pools"][0], "models": [{"name": "m"}, {"name": "n"}]}]}
    line = describe_change(parse_config(BASE), parse_config(two_models))
    assert line.startswith('pools[0].models[1]: (absent) -> {"name":"n"') and line.count(";") == 0
    many = {**BASE, "profiles": {f"x{i}": {"weights": {"queue": 1}} for i in range(CHANGES_LOGGED + 3)}}
    assert describe_change(parse_config(BASE), parse_config(many)).endswith("; and 4 more")
