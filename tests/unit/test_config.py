"""Configuration: one schema, readable errors, hot reload that keeps the last good config."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from prometheus_client import REGISTRY

from gateway.config import ConfigError, GatewayConfig, load_config, parse_config
from gateway.config_store import ConfigStore, FileWatcher

GOOD = {
    "pools": [{"name": "llama", "models": [{"name": "llama"}], "endpoints": [{"address": "10.0.0.1:8000"}]}]
}


def rejected_total() -> float:
    return REGISTRY.get_sample_value("gateway_config_reloads_total", {"result": "rejected"}) or 0.0


@pytest.mark.parametrize(
    ("patch", "message"),
    [
        ({"pools": []}, "pools: List should have at least 1 item"),
        ({"pools": [{"name": "Bad_Name", "models": [{"name": "m"}]}]}, "pools.0.name"),
        (
            {"pools": [{"name": "p", "models": [{"name": "m"}], "endpoints": [{"address": "pod-a:80"}]}]},
            "host must be an IP address",
        ),
        (
            {"pools": [{"name": "p", "models": [{"name": "m"}], "endpoints": [{"address": "10.0.0.1"}]}]},
            "must be ip:port",
        ),
        ({"pools": [{"name": "p", "models": [{"name": "m"}, {"name": "m"}]}]}, "declared twice"),
        ({"bbr": {"defaultModel": "ghost"}}, "bbr.defaultModel"),
        ({"thresholds": {"kvCache": 1.5}}, "kvCache above 1 needs kvMeasure: committed"),
        ({"thresholds": {"kvCache": 4.5, "kvMeasure": "committed"}}, "thresholds.kvCache"),
        (
            {"scrape": {"intervalMs": 100, "maxIntervalMs": 50}},
            "scrape.maxIntervalMs: must be >= scrape.intervalMs",
        ),
        (
            {"scrape": {"maxIntervalMs": 1000}},
            "scrape.maxIntervalMs: must be below every profile's staleAfterMs",
        ),
        ({"scrape": {"jitter": 0.9}}, "scrape.jitter"),
        (
            {"profiles": {"x": {"weights": {"queue": -1}}}},
            "profiles.x.weights.queue: Input should be greater than or equal to 0",
        ),
        (
            {"profiles": {"x": {"weights": {"qeue": 1}}}},
            "profiles.x.weights: Value error, unknown scorer 'qeue'",
        ),
        ({"surprise": 1}, "surprise: Extra inputs are not permitted"),
        ({"pools": [{"name": "p", "models": [{"name": "m"}], "kvEvents": {"port": 0}}]}, "kvEvents.port"),
        ({"pools": [{"name": "p", "models": [{"name": "m"}], "kvEvents": {"maxBlocks": 0}}]}, "maxBlocks"),
        (
            {
                "pools": [
                    {
                        "name": "p",
                        "models": [{"name": "m"}],
                        "endpoints": [{"address": "10.0.0.1:80", "kvEventsPort": 70000}],
                    }
                ]
            },
            "kvEventsPort",
        ),
        (
            {
                "pools": [
                    {
                        "name": "p",
                        "models": [{"name": "m"}],
                        "kubernetes": {"poolName": "p"},
                        "fallbackEndpoints": 2,
                    }
                ]
            },
            "pools.p.fallbackEndpoints: Kubernetes pools",
        ),
        ({"listener": {"requestBodyMode": "chunked"}}, "listener.requestBodyMode"),
        (
            {"listener": {"maxBufferedBodyBytes": 8 * 1024 * 1024}},
            "listener.maxBufferedBodyBytes bounds buffered bodies only",
        ),
        (
            {"listener": {"requestBodyMode": "buffered", "maxBufferedBodyBytes": 1024}},
            "listener.maxBufferedBodyBytes: Input should be greater than or equal to 65536",
        ),
        (
            {
                "listener": {
                    "requestBodyMode": "buffered",
                    "maxBufferedBodyBytes": 65536,
                    "maxRequestHeadersKb": 96,
                }
            },
            "must be at least maxRequestHeadersKb",
        ),
    ],
)
def test_errors_name_the_field(patch: dict, message: str) -> None:
    """The EPP's schema: the shared one plus the scheduling section."""
    with pytest.raises(ConfigError, match=message.replace(".", r"\.").replace("(", r"\(")):
        parse_config({**GOOD, **patch})


def test_the_shared_schema_rejects_a_scheduling_mistake_as_the_epp_does() -> None:
    """BBR's schema is the EPP's: one verdict per file (BBR used to apply what the EPPs rejected)."""
    bad_profile = {**GOOD, "profiles": {"x": {"weights": {"qeue": 1}}}}
    with pytest.raises(ConfigError, match="unknown scorer") as bbr:
        parse_config(bad_profile)
    with pytest.raises(ConfigError, match="unknown scorer") as epp:
        parse_config(bad_profile)
    assert str(bbr.value) == str(epp.value)
    assert isinstance(parse_config(GOOD), GatewayConfig)


def test_load_config_reports_yaml_errors_with_the_path(tmp_path: Path) -> None:
    bad = tmp_path / "c.yaml"
    bad.write_text("pools: [unclosed")
    with pytest.raises(ConfigError, match=r"c\.yaml"):
        load_config(bad)
    bad.write_text("- a list")
    with pytest.raises(ConfigError, match="top level must be a mapping"):
        load_config(bad)


def test_store_keeps_the_last_good_config_and_counts_rejections(tmp_path: Path) -> None:
    path = tmp_path / "gateway.yaml"
    path.write_text(yaml.safe_dump(GOOD))
    store = ConfigStore.from_file(path, GatewayConfig)
    seen: list[GatewayConfig] = []
    store.subscribe(seen.append)
    watcher = FileWatcher(store, path)
    assert watcher.check() is False  # unchanged

    before = rejected_total()
    path.write_text("pools: 7")
    assert watcher.check() is False
    assert rejected_total() == before + 1
    assert store.current().pools[0].name == "llama" and seen == []

    changed = {**GOOD, "profiles": {"chat": {"weights": {"queue": 9}}}}
    path.write_text(yaml.safe_dump(changed))
    assert watcher.check() is True
    assert store.current().scheduler_profiles()["chat"].weights["queue"] == 9
    assert seen == [store.current()]

    path.unlink()  # a ConfigMap mid-swap: unreadable for a moment
    assert watcher.check() is False
    assert store.current().profiles["chat"].weights == {"queue": 9}


def test_startup_with_an_invalid_file_fails_loudly(tmp_path: Path) -> None:
    path = tmp_path / "gateway.yaml"
    path.write_text("pools: []")
    with pytest.raises(ConfigError):
        ConfigStore.from_file(path, GatewayConfig)


def test_the_idle_scrape_interval_defaults_to_200_ms_but_never_below_the_fast_one() -> None:
    assert parse_config(GOOD).scrape.max_interval() == 200
    assert parse_config({**GOOD, "scrape": {"intervalMs": 500}}).scrape.max_interval() == 500
    assert parse_config({**GOOD, "scrape": {"maxIntervalMs": 80}}).scrape.max_interval() == 80


def test_flow_control_is_off_by_default_and_its_bounds_are_checked() -> None:
    config = parse_config(GOOD)
    assert not config.flow_control.enabled and config.session_affinity.header == "x-session-id"
    on = parse_config(
        {**GOOD, "flowControl": {"enabled": True, "standard": {"maxQueue": 3, "maxWaitMs": 200}}}
    )
    assert on.flow_control.standard.max_queue == 3 and on.flow_control.critical.max_wait_ms == 9000
    with pytest.raises(ConfigError, match=r"flowControl\.standard\.maxWaitMs"):
        parse_config({**GOOD, "flowControl": {"standard": {"maxWaitMs": 30_000}}})  # past Envoy's 10 s
    with pytest.raises(ConfigError, match=r"tenantClaim needs listener\.jwt"):
        parse_config({**GOOD, "flowControl": {"tenantClaim": "org"}})
    with pytest.raises(ConfigError, match="unknown scorer"):
        parse_config({**GOOD, "profiles": {"p": {"weights": {"session-affinty": 1}}}})
    assert parse_config({**GOOD, "profiles": {"p": {"weights": {"session-affinity": 1}}}})
