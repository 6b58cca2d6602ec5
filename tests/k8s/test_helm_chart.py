"""deploy/helm/inference-gateway: Helm's own library lints it and renders it, and with the default
values it renders exactly the objects of the kustomize base.

Helm runs in a child process (tests/k8s/helm_render.py), all renders in one call. helm-sdkpy
is installed by `make test` (Makefile); elsewhere these tests skip, and fail under CI.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import os
import shutil
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from envoy_data_plane.envoy.config.cluster.v3 import Cluster
from envoy_data_plane.envoy.config.route.v3 import RouteConfiguration

from gateway.config import parse_config
from gateway.envoy.xds_resources import CLUSTER, ROUTE, snapshot, topology_from_json
from gateway.profiles import BUILTIN_PROFILES
from tests.k8s.helm_render import render_chart
from tests.k8s.test_deploy_pools import assert_serves_every_pool_over_xds
from tests.k8s.test_manifests import BUILTIN_GROUPS, DEPLOY, THIRD_PARTY_SCHEMAS, _crd_schema, _key, render
from tools import chart_schema

CHART = DEPLOY / "helm" / "inference-gateway"
NAMESPACE = "inference-gateway"  # the base's, in its service names and certificates
Obj = dict[str, Any]

if importlib.util.find_spec("helm_sdkpy") is None:
    if os.environ.get("CI"):
        raise RuntimeError("helm-sdkpy is missing: the Makefile's venv step installs it")
    pytest.skip("helm-sdkpy not installed (make test installs it)", allow_module_level=True)

# Non-default values: another namespace, plaintext, no shared store, other replicas and weights.
CUSTOM = {
    # The workers sized to the CPU request, rounded up (epp/workers/processes.py).
    "epp": {"replicas": 3, "resources": {"requests": {"cpu": "1500m"}}},
    "bbr": {"replicas": 1},
    "mtls": {"enabled": False},
    "sharedState": {"enabled": False},
    "monitoring": {"serviceMonitor": True},  # off by default: it needs the Prometheus Operator
    # Helm merges maps into the defaults: null drops a default's key.
    "config": {
        "profiles": {
            "default": {
                "weights": {"queue": 1, "kv-cache": 4, "predicted-ttft": None, "precise-prefix-cache": None}
            }
        }
    },
}
# Two pools in the one configuration: the second gets its own EPP, which Envoy dials by name.
QWEN_POOL = {
    "name": "qwen3-32b",
    "engine": "vllm",
    "targetPort": 8000,
    "kubernetes": {"poolName": "qwen3-32b"},
    "models": [{"name": "Qwen/Qwen3-32B"}],
}
# Values Helm must refuse (values.schema.json), each with the path it breaks.
BAD_VALUES: list[tuple[str, Obj]] = [
    ("epp.replicas", {"epp": {"replicas": 0}}),
    ("epp.workers", {"epp": {"workers": 0}}),
    ("epp.workers: a word", {"epp": {"workers": "many"}}),
    ("envoy.enabled", {"envoy": {"enabled": "yes"}}),
    ("unknown top-level key", {"replica": 2}),
    ("config.pools[0].engine", {"config": {"pools": [{"name": "p", "engine": "ollama"}]}}),
    ("config.profiles.default.weights", {"config": {"profiles": {"default": {"weights": {"queue": -1}}}}}),
    ("config.profiles.x.weights: unknown scorer", {"config": {"profiles": {"x": {"weights": {"qeue": 1}}}}}),
    ("config.thresholds.kvCache", {"config": {"thresholds": {"kvCache": 0}}}),
]


@pytest.fixture(scope="module")
def helm(tmp_path_factory: pytest.TempPathFactory) -> Obj:
    """One child process: lint the chart and a broken copy, then every render this module needs."""
    broken = tmp_path_factory.mktemp("broken") / "chart"
    shutil.copytree(CHART, broken)  # symlinks followed: a self-contained copy
    (broken / "templates" / "bbr.yaml").write_text("{{ .Values.bbr.replicas | nosuchfunction }}\n")
    requests = [
        {"namespace": NAMESPACE, "values": {}},
        {"namespace": "ml-serving", "values": CUSTOM},
        *({"namespace": NAMESPACE, "values": values} for _, values in BAD_VALUES),
        {"namespace": "ml-serving", "values": {"config": {"pools": [_default_pool(), QWEN_POOL]}}},
    ]
    return render_chart(CHART, requests, lint=(broken,))


def _default_pool() -> Obj:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    return dict(values["config"]["pools"][0])


def _objects(result: Obj) -> list[Obj]:
    assert "error" not in result, result["error"]
    return [o for o in yaml.safe_load_all(result["manifest"]) if o] + result["crds"]


def _comparable(obj: Obj) -> Obj:
    """The gateway config compared as data: the base's file has comments, Helm writes toYaml."""
    if obj["kind"] == "ConfigMap" and obj["metadata"]["name"] == "gateway-config":
        obj = copy.deepcopy(obj)
        obj["data"]["config.yaml"] = yaml.safe_load(obj["data"]["config.yaml"])
    return obj


def _find(objs: list[Obj], kind: str, name: str) -> Obj:
    (obj,) = [o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name]
    return obj


def test_helm_lints_the_chart_and_catches_a_broken_one(helm: Obj) -> None:
    chart, broken = helm["lint"]
    # Severity: 1 info (e.g. "icon is recommended"), 2 warning, 3 error.
    assert chart["TotalChartsLinted"] == 1 and not chart["Errors"], chart
    assert all(m["Severity"] < 2 for m in chart["Messages"]), chart["Messages"]
    assert broken["Errors"] or any(m["Severity"] >= 3 for m in broken["Messages"]), broken


def test_default_values_render_the_kustomize_base(helm: Obj) -> None:
    chart = {_key(o): _comparable(o) for o in _objects(helm["renders"][0])}
    base = {_key(o): _comparable(o) for o in render("base")}
    assert sorted(chart, key=str) == sorted(base, key=str)
    for key, obj in base.items():
        assert chart[key] == obj, key


def test_default_values_serve_two_pools_from_one_resource_over_xds(helm: Obj) -> None:
    """As every kustomize overlay (tests/k8s/test_deploy_pools.py): both pools of the one
    resource, each by its EPP, Envoy fed by the xDS server that follows the resource."""
    assert_serves_every_pool_over_xds(_objects(helm["renders"][0]))


def test_default_profile_is_the_shipped_default() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["config"]["defaultProfile"] == "default"
    weights = values["config"]["profiles"]["default"]["weights"]
    assert {k: float(v) for k, v in weights.items()} == dict(BUILTIN_PROFILES["default"].weights)


def test_values_reach_the_objects_and_every_object_validates(helm: Obj) -> None:
    objs = _objects(helm["renders"][1])
    config = yaml.safe_load(_find(objs, "ConfigMap", "gateway-config")["data"]["config.yaml"])
    parsed = parse_config(config)
    pool = parsed.pools[0]
    assert pool.kubernetes is not None and pool.kubernetes.namespace == "ml-serving"
    assert pool.epp.replicas == 3 == _find(objs, "Deployment", "epp")["spec"]["replicas"]
    assert pool.epp.workers == 2  # 1500m rounded up
    assert _find(objs, "Deployment", "bbr")["spec"]["replicas"] == 1
    assert config["profiles"]["default"]["weights"] == {"queue": 1, "kv-cache": 4}
    assert parsed.shared_state is None
    # Plaintext: no cert-manager objects, no TLS flags or Secrets; the plaintext bootstrap, with
    # the release namespace in the service names Envoy dials.
    assert not [o for o in objs if o["apiVersion"].startswith("cert-manager.io/")]
    for name in ("epp", "bbr", "envoy", "xds"):
        pod = _find(objs, "Deployment", name)["spec"]["template"]["spec"]
        assert not [v for v in pod["volumes"] if "secret" in v], name
        assert not [a for c in pod["containers"] for a in c.get("args", []) if a.startswith("--tls-")]
    bootstrap = _find(objs, "ConfigMap", "envoy-bootstrap")["data"]["envoy.yaml"]
    plaintext = (DEPLOY / "overlays/dev/envoy-plaintext-bootstrap.yaml").read_text()
    assert bootstrap == plaintext.replace(f".{NAMESPACE}.svc.", ".ml-serving.svc.")
    assert "transport_socket" not in yaml.safe_load(bootstrap)["static_resources"]["clusters"][0]
    # No shared store: no epp-state objects, and no EPP egress rule towards one.
    assert not [o for o in objs if o["metadata"]["name"] == "epp-state"]
    egress = _find(objs, "NetworkPolicy", "epp")["spec"]["egress"]
    assert not [r for r in egress if 6379 in {p["port"] for p in r["ports"]}]
    version = kubernetes_validate.latest_version()
    for obj in objs:
        if obj["apiVersion"] in BUILTIN_GROUPS:
            kubernetes_validate.validate(copy.deepcopy(obj), version, strict=True)
        elif obj["kind"] != "InferenceGatewayConfig":
            jsonschema.Draft4Validator(THIRD_PARTY_SCHEMAS[(obj["apiVersion"], obj["kind"])]).validate(
                obj["spec"]
            )
    jsonschema.Draft4Validator(_crd_schema()["properties"]["spec"]).validate(config)
    # The resource every service follows is the ConfigMap's configuration; Envoy runs on xDS.
    assert _find(objs, "InferenceGatewayConfig", "inference-gateway")["spec"] == config
    envoy_args = _find(objs, "Deployment", "envoy")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "/etc/envoy/envoy-xds.yaml" in envoy_args
    topology = _find(objs, "ConfigMap", "xds-topology")["data"]["topology.json"]
    assert "ml-serving.svc" in topology and f"{NAMESPACE}.svc" not in topology
    # The ServiceMonitors, asked for, are the kustomize component's.
    component = [
        d for d in yaml.safe_load_all((DEPLOY / "components/monitoring/servicemonitor.yaml").read_text()) if d
    ]
    assert {m["metadata"]["name"]: m["spec"] for m in component} == {
        name: _find(objs, "ServiceMonitor", name)["spec"] for name in ("epp", "bbr")
    }


@pytest.mark.parametrize(("index", "case"), list(enumerate(BAD_VALUES)), ids=[c for c, _ in BAD_VALUES])
def test_helm_refuses_values_the_schema_forbids(helm: Obj, index: int, case: tuple[str, Obj]) -> None:
    result = helm["renders"][2 + index]
    assert "error" in result, f"{case[0]}: rendered"
    assert "schema" in result["error"].lower(), result["error"]


def test_config_schema_is_generated_from_the_config_models() -> None:
    text = (CHART / "values.schema.json").read_text()
    assert text == chart_schema.render(text), "run `python -m tools.chart_schema` and commit"
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    jsonschema.Draft202012Validator(json.loads(text)).validate(values)


def test_two_pools_in_the_config_are_served_each_by_its_epp_over_xds(helm: Obj) -> None:
    """One resource, two pools: the chart runs an EPP per pool (the second named after it, its
    certificate and Service that name), writes where each EPP is into the resource, and the xDS
    server renders both pools' routes and clusters from it."""
    objs = _objects(helm["renders"][-1])
    config = parse_config(_find(objs, "InferenceGatewayConfig", "inference-gateway")["spec"])
    assert [p.name for p in config.pools] == ["llama-3-8b", "qwen3-32b"]
    for name, pool in (("epp", "llama-3-8b"), ("epp-qwen3-32b", "qwen3-32b")):
        deployment = _find(objs, "Deployment", name)
        pod = deployment["spec"]["template"]
        assert f"--pool={pool}" in pod["spec"]["containers"][0]["args"]
        assert "--config-resource=$(POD_NAMESPACE)/inference-gateway" in pod["spec"]["containers"][0]["args"]
        # Its Service and PodDisruptionBudget take its pods, not the other pool's.
        service = _find(objs, "Service", name)["spec"]["selector"]
        assert service.items() <= pod["metadata"]["labels"].items()
        assert service["gateway.inference.dev/pool"] == pool
        assert _find(objs, "PodDisruptionBudget", name)["spec"]["selector"]["matchLabels"] == service
        secret = next(v["secret"]["secretName"] for v in pod["spec"]["volumes"] if "secret" in v)
        certificate = next(
            o for o in objs if o["kind"] == "Certificate" and o["spec"]["secretName"] == secret
        )
        assert f"{name}.ml-serving.svc.cluster.local" in certificate["spec"]["dnsNames"]
    qwen = config.pools[1]
    assert (qwen.epp.host, qwen.epp.port) == ("epp-qwen3-32b.ml-serving.svc.cluster.local", 9002)
    assert qwen.kubernetes is not None and qwen.kubernetes.namespace == "ml-serving"
    topology = topology_from_json(_find(objs, "ConfigMap", "xds-topology")["data"]["topology.json"])
    snap = snapshot(config, topology)
    clusters = {c.name: c for c in (Cluster().parse(a.value) for a in snap[CLUSTER].resources)}
    assert {"pool-llama-3-8b", "pool-qwen3-32b", "epp-llama-3-8b", "epp-qwen3-32b"} <= set(clusters)
    address = clusters["epp-qwen3-32b"].load_assignment.endpoints[0].lb_endpoints[0].endpoint.address
    assert address.socket_address.address == "epp-qwen3-32b.ml-serving.svc.cluster.local"
    (routes,) = (RouteConfiguration().parse(a.value) for a in snap[ROUTE].resources)
    names = {route.name for host in routes.virtual_hosts for route in host.routes}
    assert {"llama-3-8b-pick", "qwen3-32b-pick"} <= names
