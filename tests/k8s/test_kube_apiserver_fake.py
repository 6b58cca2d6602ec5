"""The fake API server answers the real `kubernetes` client the way a real API server does."""

from __future__ import annotations

import threading
import time

import kubernetes
import pytest
import urllib3
from kubernetes import watch

from tests.fakes.kube_apiserver import (
    CONFIGMAPS,
    GATEWAY_CONFIGS,
    INFERENCE_POOLS,
    PODS,
    FakeKubeApiServer,
    make_pod,
    make_pool,
)

GROUP, VERSION = "inference.networking.k8s.io", "v1"


def _later(delay: float, *actions) -> threading.Thread:
    def run() -> None:
        for action in actions:
            time.sleep(delay)
            action()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def test_list_shape_and_label_selector(
    kube: FakeKubeApiServer, api_client: kubernetes.client.ApiClient
) -> None:
    kube.apply(PODS, make_pod("a", labels={"app": "x", "tier": "gpu"}))
    kube.apply(PODS, make_pod("b", labels={"app": "y"}))
    kube.apply(PODS, make_pod("c", labels={"app": "x"}, namespace="other"))
    core = kubernetes.client.CoreV1Api(api_client)
    pods = core.list_namespaced_pod("default", label_selector="app=x,tier=gpu")
    assert [p.metadata.name for p in pods.items] == ["a"]
    assert int(pods.metadata.resource_version) == kube.resource_version
    raw = core.list_namespaced_pod("default", label_selector="app!=x", _preload_content=False)
    body = raw.json() if hasattr(raw, "json") else None
    assert body["kind"] == "PodList" and [i["metadata"]["name"] for i in body["items"]] == ["b"]
    assert [p.metadata.name for p in core.list_namespaced_pod("other").items] == ["c"]


def test_bad_selector_is_a_400(kube: FakeKubeApiServer, api_client: kubernetes.client.ApiClient) -> None:
    core = kubernetes.client.CoreV1Api(api_client)
    with pytest.raises(kubernetes.client.ApiException) as err:
        core.list_namespaced_pod("default", label_selector="app in (a,b)")
    assert err.value.status == 400


def test_custom_objects_list_get_and_404(
    kube: FakeKubeApiServer, api_client: kubernetes.client.ApiClient
) -> None:
    kube.apply(INFERENCE_POOLS, make_pool("llama", selector={"app": "x"}))
    kube.apply(INFERENCE_POOLS, make_pool("qwen", selector={"app": "q"}))
    kube.apply(GATEWAY_CONFIGS, {"metadata": {"name": "gw"}, "spec": {"pools": []}})
    kube.apply(CONFIGMAPS, {"metadata": {"name": "weights"}, "data": {"config.yaml": "pools: []"}})
    custom = kubernetes.client.CustomObjectsApi(api_client)
    pools = custom.list_namespaced_custom_object(
        GROUP, VERSION, "default", "inferencepools", field_selector="metadata.name=qwen"
    )
    assert pools["kind"] == "InferencePoolList"
    assert [p["metadata"]["name"] for p in pools["items"]] == ["qwen"]
    assert custom.get_namespaced_custom_object(GROUP, VERSION, "default", "inferencepools", "llama")["spec"][
        "targetPorts"
    ] == [{"number": 8000}]
    cfg = custom.get_namespaced_custom_object(
        "gateway.inference.dev", "v1alpha1", "default", "inferencegatewayconfigs", "gw"
    )
    assert cfg["kind"] == "InferenceGatewayConfig"
    cm = kubernetes.client.CoreV1Api(api_client).read_namespaced_config_map("weights", "default")
    assert cm.data == {"config.yaml": "pools: []"}
    with pytest.raises(kubernetes.client.ApiException) as err:
        custom.get_namespaced_custom_object(GROUP, VERSION, "default", "inferencepools", "nope")
    assert err.value.status == 404


def test_watch_streams_selector_transitions_and_bookmarks(
    kube: FakeKubeApiServer, api_client: kubernetes.client.ApiClient
) -> None:
    kube.apply(PODS, make_pod("a", labels={"app": "x"}))
    core = kubernetes.client.CoreV1Api(api_client)
    rv = core.list_namespaced_pod("default", label_selector="app=x").metadata.resource_version
    _later(
        0.05,
        lambda: kube.apply(PODS, make_pod("b", labels={"app": "x"})),
        lambda: kube.modify(PODS, "a", lambda p: p["metadata"]["labels"].update(app="gone")),
        lambda: kube.apply(PODS, make_pod("c", labels={"app": "y"})),
        kube.send_bookmark,
        lambda: kube.drop_watches(abort=False),
    )
    w = watch.Watch()
    events = [
        (e["type"], e["raw_object"]["metadata"].get("name"))
        for e in w.stream(
            core.list_namespaced_pod,
            "default",
            label_selector="app=x",
            resource_version=rv,
            allow_watch_bookmarks=True,
            timeout_seconds=5,
        )
    ]
    # "a" left the selector: a watcher of app=x sees it DELETED; "c" never matched.
    assert events == [("ADDED", "b"), ("DELETED", "a"), ("BOOKMARK", None)]
    assert int(w.resource_version) == kube.resource_version  # the bookmark carried the latest RV


def test_watch_without_resource_version_starts_with_synthetic_adds(
    kube: FakeKubeApiServer, api_client: kubernetes.client.ApiClient
) -> None:
    kube.apply(PODS, make_pod("a", labels={"app": "x"}))
    custom = kubernetes.client.CustomObjectsApi(api_client)
    kube.apply(INFERENCE_POOLS, make_pool("llama", selector={"app": "x"}))
    _later(0.2, lambda: kube.drop_watches(abort=False))
    stream = watch.Watch().stream(
        custom.list_namespaced_custom_object, GROUP, VERSION, "default", "inferencepools", timeout_seconds=5
    )
    events = list(stream)
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [("ADDED", "llama")]


def test_compacted_history_gives_410_gone(
    kube: FakeKubeApiServer, api_client: kubernetes.client.ApiClient
) -> None:
    core = kubernetes.client.CoreV1Api(api_client)
    rv = core.list_namespaced_pod("default").metadata.resource_version
    kube.apply(PODS, make_pod("a", labels={"app": "x"}))
    kube.compact()
    with pytest.raises(kubernetes.client.ApiException) as err:
        list(
            watch.Watch().stream(core.list_namespaced_pod, "default", resource_version=rv, timeout_seconds=2)
        )
    assert err.value.status == 410
    assert "too old resource version" in err.value.reason


def test_timeout_and_dropped_connection_end_the_stream(
    kube: FakeKubeApiServer, api_client: kubernetes.client.ApiClient
) -> None:
    core = kubernetes.client.CoreV1Api(api_client)
    t0 = time.monotonic()
    assert (
        list(
            watch.Watch().stream(core.list_namespaced_pod, "default", resource_version="1", timeout_seconds=1)
        )
        == []
    )
    assert 0.9 < time.monotonic() - t0 < 10
    _later(0.1, kube.drop_watches)
    with pytest.raises(urllib3.exceptions.ProtocolError):
        list(
            watch.Watch().stream(core.list_namespaced_pod, "default", resource_version="1", timeout_seconds=5)
        )


def test_unavailable_and_forbidden(kube: FakeKubeApiServer, api_client: kubernetes.client.ApiClient) -> None:
    core = kubernetes.client.CoreV1Api(api_client)
    kube.set_unavailable(True)
    with pytest.raises(kubernetes.client.ApiException) as err:
        core.list_namespaced_pod("default")
    assert err.value.status == 503
    kube.set_unavailable(False)
    kube.forbid(PODS)
    with pytest.raises(kubernetes.client.ApiException) as err:
        core.list_namespaced_pod("default")
    assert err.value.status == 403
