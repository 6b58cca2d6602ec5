"""The InferenceGatewayConfig resource drives the configuration through the real client."""

from __future__ import annotations

import asyncio

import kubernetes
from prometheus_client import REGISTRY

from epp.config import parse_epp_config
from gateway.config_resource import ConfigResourceWatcher
from gateway.config_store import ConfigStore
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
    store = ConfigStore(parse_epp_config(SPEC))
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
    store = ConfigStore(parse_epp_config(SPEC))
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
