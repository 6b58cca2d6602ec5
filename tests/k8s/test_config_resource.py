"""The InferenceGatewayConfig resource drives the configuration through the real client; while it
exists it is the one source (a --config file edit is not applied, and says so), and once deleted
the file is again."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import kubernetes
import pytest
import yaml
from prometheus_client import REGISTRY

from gateway.config import ConfigError, GatewayConfig, parse_config
from gateway.config_store import ConfigStore, FileWatcher
from gateway.kube.config_resource import ConfigResourceWatcher
from tests.fakes.kube_apiserver import GATEWAY_CONFIGS, FakeKubeApiServer

SPEC = {
    "pools": [{"name": "llama", "models": [{"name": "llama"}], "endpoints": [{"address": "10.0.0.1:8000"}]}]
}


def resource(spec: dict) -> dict:
    return {"metadata": {"name": "gateway", "namespace": "default"}, "spec": spec}


async def until(predicate, within: float = 15.0) -> None:
    for _ in range(int(within / 0.02)):
        if predicate():
            return
        await asyncio.sleep(0.02)
    raise AssertionError("condition not reached")


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


async def test_resource_changes_apply_and_invalid_ones_keep_the_last_good(
    kube: FakeKubeApiServer, api_client: kubernetes.client.ApiClient
) -> None:
    store = ConfigStore(parse_config(SPEC))
    kube.apply(GATEWAY_CONFIGS, resource({**SPEC, "profiles": {"chat": {"weights": {"queue": 7}}}}))
    watcher = ConfigResourceWatcher(
        store, namespace="default", name="gateway", api_client=api_client, backoff_s=0.05
    )
    await watcher.start()
    try:
        await until(lambda: "chat" in store.current().profiles)
        assert store.source == "inferencegatewayconfigs/default/gateway"

        rejected = sample("gateway_config_reloads_total", result="rejected")
        kube.apply(GATEWAY_CONFIGS, resource({**SPEC, "profiles": {"chat": {"weights": {"bogus": 1}}}}))
        await until(lambda: sample("gateway_config_reloads_total", result="rejected") > rejected)
        assert store.current().profiles["chat"].weights == {"queue": 7}  # rejected: last good stays

        kube.apply(
            GATEWAY_CONFIGS,
            resource({**SPEC, "defaultProfile": "chat", "profiles": {"chat": {"weights": {"queue": 8}}}}),
        )
        await until(lambda: store.current().default_profile == "chat")

        kube.delete(GATEWAY_CONFIGS, "gateway")
        present = {"resource": watcher.source}
        await until(lambda: REGISTRY.get_sample_value("gateway_config_resource_present", present) == 0)
        assert store.current().default_profile == "chat"  # deletion never takes traffic down
    finally:
        await watcher.stop()


async def test_watch_expiry_relists_and_keeps_following(
    kube: FakeKubeApiServer, api_client: kubernetes.client.ApiClient
) -> None:
    store = ConfigStore(parse_config(SPEC))
    kube.apply(GATEWAY_CONFIGS, resource(SPEC))
    watcher = ConfigResourceWatcher(
        store, namespace="default", name="gateway", api_client=api_client, backoff_s=0.05
    )
    await watcher.start()
    try:
        kube.compact()
        kube.drop_watches()
        kube.apply(GATEWAY_CONFIGS, resource({**SPEC, "thresholds": {"queue": 9}}))
        await until(lambda: store.current().thresholds.queue_saturated == 9)
    finally:
        await watcher.stop()


def ready(kube: FakeKubeApiServer) -> dict:
    obj = kube.get(GATEWAY_CONFIGS, "gateway")
    assert obj is not None
    [condition] = (obj.get("status") or {}).get("conditions") or [{}]
    return {**obj.get("status", {}), "ready": condition}


async def test_the_verdict_and_what_is_in_force_are_written_into_the_status(
    kube: FakeKubeApiServer, api_client: kubernetes.client.ApiClient
) -> None:
    """One verdict (the schema's, then the store's checks: the xDS server's), said where the
    operator who edited the resource looks: a refused edit names its reason and the generation
    still in force; a status write is no edit (the spec is not offered again)."""
    store = ConfigStore(parse_config(SPEC))

    def no_pool_named_forbidden(config) -> None:  # type: ignore[no-untyped-def]
        if any(pool.name == "forbidden" for pool in config.pools):
            raise ConfigError("pool 'forbidden' cannot be served")

    store.add_check(no_pool_named_forbidden)
    offers: list[str] = []
    store.subscribe(lambda config: offers.append(config.pools[0].name))
    kube.apply(GATEWAY_CONFIGS, resource(SPEC))
    watcher = ConfigResourceWatcher(
        store, namespace="default", name="gateway", api_client=api_client, backoff_s=0.05, write_status=True
    )
    await watcher.start()
    try:
        assert await watcher.wait_synced(10)
        await until(lambda: ready(kube)["ready"].get("status") == "True")
        status = ready(kube)
        assert status["observedGeneration"] == status["appliedGeneration"] == 1 and status["pools"] == 1
        assert status["ready"]["reason"] == "Applied" and "pools llama (llama)" in status["ready"]["message"]

        bad = {**SPEC, "profiles": {"chat": {"weights": {"bogus": 1}}}}
        kube.apply(GATEWAY_CONFIGS, resource(bad))
        await until(lambda: ready(kube)["ready"].get("status") == "False")
        status = ready(kube)
        assert status["observedGeneration"] == 2 and status["appliedGeneration"] == 1
        assert status["ready"]["reason"] == "Refused"
        assert "generation 2 refused, generation 1 stays in force" in status["ready"]["message"]
        assert "bogus" in status["ready"]["message"]
        assert store.current().profiles == parse_config(SPEC).profiles

        refused_by_check = {"pools": [{**SPEC["pools"][0], "name": "forbidden"}]}
        kube.apply(GATEWAY_CONFIGS, resource(refused_by_check))
        await until(lambda: ready(kube).get("observedGeneration") == 3)
        assert "pool 'forbidden' cannot be served" in ready(kube)["ready"]["message"]
        assert store.current().pools[0].name == "llama"

        kube.apply(GATEWAY_CONFIGS, resource({"pools": [{**SPEC["pools"][0], "name": "llama2"}]}))
        await until(lambda: ready(kube)["ready"].get("status") == "True")
        status = ready(kube)
        assert status["observedGeneration"] == status["appliedGeneration"] == 4
        assert offers == ["llama", "llama2"]  # the status writes were not taken for edits
    finally:
        await watcher.stop()


async def test_a_status_the_api_refuses_is_logged_and_changes_nothing(
    kube: FakeKubeApiServer, api_client: kubernetes.client.ApiClient, caplog: pytest.LogCaptureFixture
) -> None:
    store = ConfigStore(parse_config(SPEC))
    kube.apply(GATEWAY_CONFIGS, resource({**SPEC, "thresholds": {"queue": 9}}))
    kube.forbid_status(GATEWAY_CONFIGS)
    watcher = ConfigResourceWatcher(
        store, namespace="default", name="gateway", api_client=api_client, backoff_s=0.05, write_status=True
    )
    with caplog.at_level(logging.WARNING, logger="gateway.kube.config_resource"):
        await watcher.start()
        try:
            await until(lambda: any("status not written: API error 403" in r.message for r in caplog.records))
            assert store.current().thresholds.queue_saturated == 9
        finally:
            await watcher.stop()


# -- one source: the resource while it exists, the file otherwise ---------------------------------
def _source() -> str:
    kinds = [k for k in ("resource", "file") if sample("gateway_config_source", kind=k) == 1]
    assert len(kinds) == 1, kinds
    return kinds[0]


def _file_with(tmp_path: Path, queue: int) -> Path:
    path = tmp_path / "gateway.yaml"
    path.write_text(yaml.safe_dump({**SPEC, "thresholds": {"queue": queue}}))
    return path


async def _follow(
    store: ConfigStore, api_client: kubernetes.client.ApiClient, **kw: object
) -> ConfigResourceWatcher:
    watcher = ConfigResourceWatcher(
        store, namespace="default", name="gateway", api_client=api_client, backoff_s=0.05, **kw
    )
    await watcher.start()
    assert await watcher.wait_synced(10)
    return watcher


async def test_without_the_resource_the_file_is_the_source_and_its_edits_apply(
    kube: FakeKubeApiServer, api_client: kubernetes.client.ApiClient, tmp_path: Path
) -> None:
    path = _file_with(tmp_path, 3)
    store = ConfigStore.from_file(path, GatewayConfig)
    files = FileWatcher(store, path)
    watcher = await _follow(store, api_client)
    try:
        assert _source() == "file" and store.resource is None
        _file_with(tmp_path, 4)
        assert files.check() and store.current().thresholds.queue_saturated == 4
    finally:
        await watcher.stop()


async def test_while_the_resource_exists_a_file_edit_is_not_applied_and_says_so(
    kube: FakeKubeApiServer,
    api_client: kubernetes.client.ApiClient,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    path = _file_with(tmp_path, 3)
    store = ConfigStore.from_file(path, GatewayConfig)
    files = FileWatcher(store, path)
    kube.apply(GATEWAY_CONFIGS, resource({**SPEC, "thresholds": {"queue": 7}}))
    watcher = await _follow(store, api_client, write_status=True)
    try:
        assert store.current().thresholds.queue_saturated == 7 and _source() == "resource"
        await until(lambda: "source: this resource" in ready(kube)["ready"].get("message", ""))
        ignored = sample("gateway_config_reloads_total", result="ignored")
        _file_with(tmp_path, 4)
        with caplog.at_level(logging.WARNING, logger="gateway.config_store"):
            assert not files.check()
        assert store.current().thresholds.queue_saturated == 7  # the resource stays in force
        assert sample("gateway_config_reloads_total", result="ignored") == ignored + 1
        assert any(
            "not applied: inferencegatewayconfigs/default/gateway is the configuration source" in r.message
            for r in caplog.records
        )
    finally:
        await watcher.stop()


async def test_both_edited_the_resource_wins_until_deleted_then_the_edited_file(
    kube: FakeKubeApiServer, api_client: kubernetes.client.ApiClient, tmp_path: Path
) -> None:
    path = _file_with(tmp_path, 3)
    store = ConfigStore.from_file(path, GatewayConfig)
    files = FileWatcher(store, path)
    kube.apply(GATEWAY_CONFIGS, resource({**SPEC, "thresholds": {"queue": 7}}))
    watcher = await _follow(store, api_client)
    try:
        _file_with(tmp_path, 4)  # the ConfigMap edited ...
        assert not files.check()
        kube.apply(GATEWAY_CONFIGS, resource({**SPEC, "thresholds": {"queue": 8}}))  # ... and the resource
        await until(lambda: store.current().thresholds.queue_saturated == 8)
        assert not files.check() and store.current().thresholds.queue_saturated == 8
        # Deleted: the file, as edited, is the source (read again, not the last digest seen).
        kube.delete(GATEWAY_CONFIGS, "gateway")
        await until(lambda: store.current().thresholds.queue_saturated == 4)
        assert _source() == "file" and store.source == str(path)
        # Created again: the resource takes over again.
        kube.apply(GATEWAY_CONFIGS, resource({**SPEC, "thresholds": {"queue": 9}}))
        await until(lambda: store.current().thresholds.queue_saturated == 9)
        assert _source() == "resource"
    finally:
        await watcher.stop()
