"""Pure parts of Kubernetes discovery: InferencePool specs and pod -> Endpoint rules."""

from __future__ import annotations

import pytest

from epp.datalayer.discovery.kubernetes import (
    ADAPTERS_ANNOTATION,
    ENGINE_LABEL,
    KV_EVENTS_PORT_ANNOTATION,
    KV_REPLAY_PORT_ANNOTATION,
    METRICS_PORT_ANNOTATION,
    MODEL_KEY,
    PoolSpec,
    PoolSpecError,
    parse_pool,
    pod_endpoints,
    pod_is_serving,
)
from tests.fakes.kube_apiserver import make_pod, make_pool

SPEC = PoolSpec(selector=(("app", "x"),), ports=(8000,))


def test_parse_v1_pool() -> None:
    spec = parse_pool(make_pool("p", selector={"b": "2", "a": "1"}, port=[8000, 8001]))
    assert spec.label_selector == "a=1,b=2"
    assert spec.ports == (8000, 8001)


def test_parse_v1alpha2_pool() -> None:
    spec = parse_pool({"spec": {"selector": {"app": "x"}, "targetPortNumber": 9000}})
    assert spec == PoolSpec((("app", "x"),), (9000,))


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"selector": {"matchLabels": {}}, "targetPorts": [{"number": 8000}]}, "non-empty"),
        ({"selector": {"matchLabels": {"a": "b"}}, "targetPorts": []}, "at least one port"),
        ({"selector": {"matchLabels": {"a": "b"}}, "targetPorts": [{"number": 70000}]}, "invalid port"),
        ({"selector": {"matchLabels": {"a": "b"}}, "targetPorts": ["8000"]}, "invalid port"),
        ({"selector": {"matchExpressions": [{"key": "a"}], "matchLabels": {"a": "b"}}}, "matchExpressions"),
        ({"selector": "app=x"}, "must be a map"),
        ({}, "non-empty"),
    ],
)
def test_bad_pool_specs_are_rejected_with_a_reason(spec: dict, message: str) -> None:
    with pytest.raises(PoolSpecError, match=message):
        parse_pool({"spec": spec})


@pytest.mark.parametrize(
    ("change", "serving"),
    [
        (lambda p: None, True),
        (lambda p: p["status"].update(phase="Pending"), False),
        (lambda p: p["status"].pop("podIP"), False),
        (lambda p: p["status"].update(conditions=[{"type": "Ready", "status": "False"}]), False),
        (lambda p: p["status"].update(conditions=[{"type": "ContainersReady", "status": "True"}]), False),
        (lambda p: p["metadata"].update(deletionTimestamp="2026-01-01T00:00:00Z"), False),
    ],
)
def test_pod_is_serving(change, serving: bool) -> None:
    pod = make_pod("a", labels={"app": "x"})
    change(pod)
    assert pod_is_serving(pod) is serving
    assert bool(pod_endpoints(pod, SPEC, pool_name="pool")) is serving


def test_model_adapters_engine_and_metrics_port_from_pod_metadata() -> None:
    pod = make_pod(
        "a",
        labels={"app": "x", ENGINE_LABEL: "sglang", MODEL_KEY: "label-model"},
        ip="10.1.2.3",
        annotations={
            MODEL_KEY: "m1, m2",
            ADAPTERS_ANNOTATION: "sql-lora,chat-lora",
            METRICS_PORT_ANNOTATION: "9100",
        },
    )
    (ep,) = pod_endpoints(pod, SPEC, pool_name="pool", default_models=["d"], default_adapters=["x"])
    assert ep.address == "10.1.2.3:8000"
    assert ep.models == {"m1", "m2"}  # the annotation wins over the label
    assert ep.adapters == {"sql-lora", "chat-lora"}
    assert ep.engine == "sglang"
    assert ep.metrics_url == "http://10.1.2.3:9100/metrics"
    assert ep.labels[ENGINE_LABEL] == "sglang"


def test_model_fallbacks_label_then_defaults_then_pool_name() -> None:
    labelled = make_pod("a", labels={"app": "x", MODEL_KEY: "llama-8b"})
    plain = make_pod("b", labels={"app": "x"})
    assert pod_endpoints(labelled, SPEC, pool_name="pool")[0].models == {"llama-8b"}
    (ep,) = pod_endpoints(plain, SPEC, pool_name="pool", default_models=["d"], default_adapters=["x"])
    assert (ep.models, ep.adapters, ep.metrics_url) == ({"d"}, {"x"}, None)
    assert pod_endpoints(plain, SPEC, pool_name="pool")[0].models == {"pool"}


def test_unknown_engine_label_falls_back_to_the_pool_engine() -> None:
    pod = make_pod("a", labels={"app": "x", ENGINE_LABEL: "nonsense"})
    assert pod_endpoints(pod, SPEC, pool_name="pool", engine="tgi")[0].engine == "tgi"


def test_ipv6_pods_and_several_ports() -> None:
    pod = make_pod("a", labels={"app": "x"}, ip="fd00::5")
    spec = PoolSpec((("app", "x"),), (8000, 8001))
    assert [e.address for e in pod_endpoints(pod, spec, pool_name="pool")] == [
        "[fd00::5]:8000",
        "[fd00::5]:8001",
    ]


@pytest.mark.parametrize("port", ["99999", "0", "²", "-1", "9100x", " "])
def test_a_metrics_port_annotation_that_is_no_port_is_ignored(port: str) -> None:
    """It used to become an unusable URL (or, for "²", a ValueError inside the watch thread)."""
    pod = make_pod("a", labels={"app": "x"}, ip="10.1.2.3", annotations={METRICS_PORT_ANNOTATION: port})
    (ep,) = pod_endpoints(pod, SPEC, pool_name="pool")
    assert ep.metrics_url is None  # scrape the serving port instead


def test_kv_event_ports_from_annotations() -> None:
    pod = make_pod(
        "a",
        labels={"app": "x"},
        ip="10.1.2.3",
        annotations={KV_EVENTS_PORT_ANNOTATION: "5557", KV_REPLAY_PORT_ANNOTATION: "nope"},
    )
    (ep,) = pod_endpoints(pod, SPEC, pool_name="pool")
    assert (ep.kv_events_port, ep.kv_replay_port) == (5557, None)  # a bad one is ignored
    (plain,) = pod_endpoints(make_pod("b", labels={"app": "x"}), SPEC, pool_name="pool")
    assert (plain.kv_events_port, plain.kv_replay_port) == (None, None)


def test_data_parallel_size_and_role_label_from_the_pod() -> None:
    from epp.datalayer.discovery.kubernetes import DP_SIZE_ANNOTATION

    pod = make_pod(
        "a",
        labels={"app": "x", "llm-d.ai/role": "decode"},
        ip="10.1.2.3",
        annotations={DP_SIZE_ANNOTATION: "4"},
    )
    (ep,) = pod_endpoints(pod, SPEC, pool_name="pool")
    assert ep.data_parallel_size == 4 and ep.labels["llm-d.ai/role"] == "decode"
    for bad in ("0", "65", "two"):
        odd = make_pod("b", labels={"app": "x"}, annotations={DP_SIZE_ANNOTATION: bad})
        assert pod_endpoints(odd, SPEC, pool_name="pool")[0].data_parallel_size == 1
