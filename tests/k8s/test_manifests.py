"""deploy/: every kustomization renders, every object validates, and the pieces fit together.

Rendering uses `kubectl kustomize` when a kubectl with kustomize >= 4 is on PATH and checks
that tests/k8s/kustomize_lite.py renders the same; elsewhere the lite renderer alone is used.
"""

from __future__ import annotations

import copy
import functools
import importlib
import json
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import jsonschema
import kubernetes_validate
import pytest
import yaml

from devstack.certs import make_certs
from gateway.config import parse_config
from gateway.envoy.blocks import validate_bootstrap
from gateway.envoy.bootstrap import render_bootstrap
from gateway.envoy.xds_resources import XDS_CLUSTER, snapshot, topology_from_json
from gateway.kube import llmd_api
from gateway.render_envoy import render_topology, render_yaml
from tests.integration.test_autoscaling_metrics import AUTOSCALING_SERIES
from tests.integration.test_envoy_config import epp_processing_modes
from tests.k8s.kustomize_lite import build
from tests.unit.test_xds_resources import assert_snapshot_is_the_bootstrap
from tools.deploy_configs import DEPLOY_BOOTSTRAPS, DEPLOY_XDS, XDS_SERVICE

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
AUTOSCALING = ["examples/autoscaling/keda", "examples/autoscaling/hpa", "examples/autoscaling/keda-from-zero"]
TARGETS = [
    "base",
    "examples",
    *AUTOSCALING,
    "cert-manager",
    "overlays/dev",
    "overlays/sim",
    "overlays/eks-hyperpod",
    "global",
]
OVERLAYS = ["overlays/dev", "overlays/sim", "overlays/eks-hyperpod"]
# The plaintext targets: dev, and sim (dev with simulated model servers).
PLAINTEXT = ("overlays/dev", "overlays/sim")
Obj = dict[str, Any]


def _key(obj: Obj) -> tuple[str, str, str | None, str]:
    meta = obj["metadata"]
    return obj["apiVersion"], obj["kind"], meta.get("namespace"), meta["name"]


@functools.cache
def _kubectl() -> str | None:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        return None
    try:
        out = subprocess.run(
            [kubectl, "version", "--client", "-o", "json"], capture_output=True, text=True, timeout=20
        )
        version = json.loads(out.stdout).get("kustomizeVersion", "v0")
    except (OSError, subprocess.SubprocessError, json.JSONDecodeError):
        return None
    return kubectl if int(version.lstrip("v").split(".")[0] or 0) >= 4 else None


@functools.cache
def render(target: str) -> tuple[Obj, ...]:
    lite = build(DEPLOY / target)
    kubectl = _kubectl()
    if kubectl is None:
        return tuple(lite)
    out = subprocess.run(
        [kubectl, "kustomize", str(DEPLOY / target)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    real = [o for o in yaml.safe_load_all(out.stdout) if o]
    assert {_key(o): o for o in lite} == {_key(o): o for o in real}, "kustomize_lite disagrees with kubectl"
    return tuple(real)


def find(objs: tuple[Obj, ...], kind: str, name: str) -> Obj:
    matches = [o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(matches) == 1, f"{kind}/{name}: {len(matches)} found"
    return matches[0]


@pytest.mark.parametrize("target", TARGETS)
def test_renders_with_unique_objects(target: str) -> None:
    objs = render(target)
    assert objs
    keys = [_key(o) for o in objs]
    assert len(keys) == len(set(keys))


# -- schemas ------------------------------------------------------------------------------
BUILTIN_GROUPS = {
    "v1",
    "apps/v1",
    "policy/v1",
    "rbac.authorization.k8s.io/v1",
    "apiextensions.k8s.io/v1",
    "networking.k8s.io/v1",
    "autoscaling/v2",
}

_str = {"type": "string", "minLength": 1}
_port = {"type": "integer", "minimum": 1, "maximum": 65535}
_match_labels = {
    "type": "object",
    "required": ["matchLabels"],
    "properties": {"matchLabels": {"type": "object", "minProperties": 1, "additionalProperties": _str}},
}
# The fields of third-party kinds this deployment relies on (their CRDs are not vendored).
THIRD_PARTY_SCHEMAS: dict[tuple[str, str], Obj] = {
    ("inference.networking.k8s.io/v1", "InferencePool"): {
        "type": "object",
        "required": ["selector", "targetPorts", "endpointPickerRef"],
        "properties": {
            "selector": _match_labels,
            "targetPorts": {
                "type": "array",
                "minItems": 1,
                "items": {"type": "object", "required": ["number"], "properties": {"number": _port}},
            },
            "endpointPickerRef": {
                "type": "object",
                "required": ["name", "port"],
                "properties": {
                    "name": _str,
                    "port": {"type": "object", "required": ["number"], "properties": {"number": _port}},
                    "failureMode": {"enum": ["FailOpen", "FailClose"]},
                },
            },
        },
    },
    ("gateway.networking.k8s.io/v1", "Gateway"): {
        "type": "object",
        "required": ["gatewayClassName", "listeners"],
        "properties": {
            "listeners": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["name", "protocol", "port"],
                    "properties": {"port": _port},
                },
            }
        },
    },
    ("gateway.networking.k8s.io/v1", "HTTPRoute"): {
        "type": "object",
        "required": ["parentRefs", "rules"],
        "properties": {
            "rules": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["backendRefs"],
                    "properties": {
                        "matches": {
                            "type": "array",
                            "items": {
                                "type": "object",
                                "properties": {
                                    "headers": {
                                        "type": "array",
                                        "items": {
                                            "type": "object",
                                            "required": ["name", "value"],
                                            "properties": {"type": {"enum": ["Exact", "RegularExpression"]}},
                                        },
                                    }
                                },
                            },
                        },
                        "backendRefs": {
                            "type": "array",
                            "items": {"type": "object", "required": ["group", "kind", "name"]},
                        },
                    },
                },
            }
        },
    },
    ("monitoring.coreos.com/v1", "ServiceMonitor"): {
        "type": "object",
        "required": ["selector", "endpoints"],
        "properties": {
            "selector": _match_labels,
            "endpoints": {"type": "array", "items": {"type": "object", "required": ["port"]}},
        },
    },
    # Written from KEDA's ScaledObject reference (keda.sh/docs/latest/reference/scaledobject-spec
    # and scalers/prometheus), for the fields the example uses. Stricter than KEDA's CRD, which
    # prunes unknown fields silently: here a misspelt field fails. Trigger metadata values are
    # strings in KEDA's API (a bare number is rejected by the API server).
    ("keda.sh/v1alpha1", "ScaledObject"): {
        "type": "object",
        "required": ["scaleTargetRef", "triggers"],
        "additionalProperties": False,
        "properties": {
            "scaleTargetRef": {
                "type": "object",
                "required": ["name"],
                "additionalProperties": False,
                "properties": {
                    "apiVersion": _str,
                    "kind": _str,
                    "name": _str,
                    "envSourceContainerName": _str,
                },
            },
            "pollingInterval": {"type": "integer", "minimum": 1},
            "cooldownPeriod": {"type": "integer", "minimum": 0},
            "initialCooldownPeriod": {"type": "integer", "minimum": 0},
            "idleReplicaCount": {"type": "integer", "minimum": 0},
            "minReplicaCount": {"type": "integer", "minimum": 0},
            "maxReplicaCount": {"type": "integer", "minimum": 1},
            "fallback": {
                "type": "object",
                "required": ["failureThreshold", "replicas"],
                "properties": {"failureThreshold": {"type": "integer"}, "replicas": {"type": "integer"}},
            },
            "advanced": {
                "type": "object",
                "additionalProperties": False,
                "properties": {
                    "restoreToOriginalReplicaCount": {"type": "boolean"},
                    "horizontalPodAutoscalerConfig": {
                        "type": "object",
                        "additionalProperties": False,
                        "properties": {"name": _str, "behavior": {"type": "object"}},
                    },
                },
            },
            "triggers": {
                "type": "array",
                "minItems": 1,
                "items": {
                    "type": "object",
                    "required": ["type", "metadata"],
                    "additionalProperties": False,
                    "properties": {
                        "type": {"enum": ["prometheus"]},
                        "name": _str,
                        "metricType": {"enum": ["AverageValue", "Value", "Utilization"]},
                        "useCachedMetrics": {"type": "boolean"},
                        "authenticationRef": {"type": "object", "required": ["name"]},
                        "metadata": {
                            "type": "object",
                            "required": ["serverAddress", "query", "threshold"],
                            "additionalProperties": {"type": "string"},
                            "properties": {
                                "serverAddress": {"type": "string", "pattern": "^https?://"},
                                "query": _str,
                                "threshold": {"type": "string", "pattern": r"^[0-9]+(\.[0-9]+)?$"},
                                "activationThreshold": {"type": "string", "pattern": r"^[0-9]+(\.[0-9]+)?$"},
                            },
                        },
                    },
                },
            },
        },
    },
    ("cert-manager.io/v1", "Issuer"): {
        "type": "object",
        "minProperties": 1,
        "properties": {
            "ca": {"type": "object", "required": ["secretName"]},
            "selfSigned": {"type": "object"},
        },
    },
    ("cert-manager.io/v1", "Certificate"): {
        "type": "object",
        "required": ["secretName", "issuerRef"],
        "properties": {
            "secretName": _str,
            "issuerRef": {"type": "object", "required": ["name", "kind"]},
            "dnsNames": {"type": "array", "items": _str},
            "usages": {
                "type": "array",
                "items": {
                    "enum": [
                        "server auth",
                        "client auth",
                        "digital signature",
                        "key encipherment",
                        "cert sign",
                    ]
                },
            },
        },
    },
}


# The llm-d kinds (CRDs referenced, not vendored: deploy/README.md) are validated by the very
# parser that applies them (gateway/kube/llmd_api.py).
LLMD_SPECS: dict[tuple[str, str], Any] = {
    (f"{llmd_api.GROUP}/{llmd_api.VERSION}", "InferenceObjective"): llmd_api.InferenceObjectiveSpec,
    (f"{llmd_api.GROUP}/{llmd_api.VERSION}", "InferenceModelRewrite"): llmd_api.InferenceModelRewriteSpec,
}


def _crd_schema() -> Obj:
    crd = find(render("base"), "CustomResourceDefinition", "inferencegatewayconfigs.gateway.inference.dev")
    (version,) = crd["spec"]["versions"]
    return version["schema"]["openAPIV3Schema"]


def validate_objects(objs: list[Obj] | tuple[Obj, ...]) -> None:
    """Each object against its API's schema: Kubernetes' own (strict), the CRD's, llm-d's parser,
    or the third-party schema above."""
    k8s_version = kubernetes_validate.latest_version()
    for obj in objs:
        kind = (obj["apiVersion"], obj["kind"])
        if obj["apiVersion"] in BUILTIN_GROUPS:
            kubernetes_validate.validate(copy.deepcopy(obj), k8s_version, strict=True)
        elif kind == ("gateway.inference.dev/v1alpha1", "InferenceGatewayConfig"):
            # Kubernetes CRD schemas are OpenAPI 3.0 (boolean exclusiveMinimum): JSON Schema draft 4.
            jsonschema.Draft4Validator(_crd_schema()).validate(obj)
        elif kind in LLMD_SPECS:
            LLMD_SPECS[kind].model_validate(obj["spec"])
        else:
            assert kind in THIRD_PARTY_SCHEMAS, f"no schema to validate {kind}"
            jsonschema.Draft4Validator(THIRD_PARTY_SCHEMAS[kind]).validate(obj["spec"])


@pytest.mark.parametrize("target", TARGETS)
def test_every_object_validates(target: str) -> None:
    validate_objects(render(target))


def test_crd_schema_rejects_bad_configs() -> None:
    validator = jsonschema.Draft4Validator(_crd_schema())
    good = find(render("base"), "InferenceGatewayConfig", "inference-gateway")
    assert validator.is_valid(good)
    for path, value in [
        (("pools", 0, "engine"), "ollama"),
        (("profiles", "default", "picker"), "roulette"),
        (("profiles", "default", "weights", "predicted-ttft"), -1),
        (("thresholds", "kvCache"), 0),
        (("thresholds", "queue"), 0),
        (("pools", 0, "failureMode"), "FailSometimes"),
    ]:
        bad = copy.deepcopy(good)
        node = bad["spec"]
        for part in path[:-1]:
            node = node[part]
        node[path[-1]] = value
        assert not validator.is_valid(bad), path


# -- the pieces fit -----------------------------------------------------------------------
def _gateway_config(objs: tuple[Obj, ...]) -> Obj:
    return yaml.safe_load(find(objs, "ConfigMap", "gateway-config")["data"]["config.yaml"])


@pytest.mark.parametrize("target", OVERLAYS)
def test_configs_parse_and_agree_with_the_cluster_objects(target: str) -> None:
    objs = render(target)
    config = parse_config(_gateway_config(objs))
    assert len(config.pools) >= 2  # every pool of the one configuration is served
    for index, pool_cfg in enumerate(config.pools):
        assert pool_cfg.kubernetes is not None
        epp = find(objs, "Deployment", "epp" if index == 0 else f"epp-{pool_cfg.name}")
        assert pool_cfg.kubernetes.namespace == epp["metadata"]["namespace"]
        pool = find(objs, "InferencePool", pool_cfg.kubernetes.pool_name)
        assert pool["spec"]["endpointPickerRef"]["failureMode"] == pool_cfg.failure_mode
        assert [p["number"] for p in pool["spec"]["targetPorts"]] == [pool_cfg.target_port]
        # The EPP serves the pool named in its arguments, and the pool points at the EPP Service.
        assert f"--pool={pool_cfg.name}" in epp["spec"]["template"]["spec"]["containers"][0]["args"]
        ref = pool["spec"]["endpointPickerRef"]
        assert ref["name"] == epp["metadata"]["name"]
        epp_ports = {p["port"] for p in find(objs, "Service", ref["name"])["spec"]["ports"]}
        assert ref["port"]["number"] in epp_ports
        # The example model servers (vLLM; modelsim in sim) are selected by the pool and named
        # as the pool's models.
        (vllm,) = [
            o["spec"]["template"]
            for o in objs
            if o["kind"] == "Deployment"
            and o["metadata"]["name"].startswith(("vllm-", "modelsim-"))
            and pool["spec"]["selector"]["matchLabels"].items()
            <= o["spec"]["template"]["metadata"]["labels"].items()
        ]
        served = set(vllm["metadata"]["annotations"]["gateway.inference.dev/model"].split(","))
        assert served <= {name for name, route in config.routes().items() if route.pool == pool_cfg.name}
    pool_cfg = config.pools[0]
    assert pool_cfg.kubernetes is not None
    epp_args = find(objs, "Deployment", "epp")["spec"]["template"]["spec"]["containers"][0]["args"]
    # The llm-d examples name this pool, BBR and the EPP follow their namespace, and every
    # rewrite target is a model the configuration routes.
    namespace = pool_cfg.kubernetes.namespace
    bbr_args = find(objs, "Deployment", "bbr")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--inference-model-rewrites=$(POD_NAMESPACE)" in bbr_args
    assert "--inference-objectives=$(POD_NAMESPACE)" in epp_args
    for kind in ("InferenceObjective", "InferenceModelRewrite"):
        examples = [o for o in objs if o["kind"] == kind]
        assert examples, kind
        for obj in examples:
            spec = LLMD_SPECS[(obj["apiVersion"], kind)].model_validate(obj["spec"])
            assert llmd_api.config_pool_for(config, namespace, spec.pool_ref) == pool_cfg.name, obj
    rewrites = llmd_api.LastGood(
        llmd_api.INFERENCE_MODEL_REWRITES,
        llmd_api.InferenceModelRewriteSpec,
        llmd_api.check_rewrite_targets(lambda: config),
    )
    accepted = rewrites.update(
        {o["metadata"]["name"]: o for o in objs if o["kind"] == "InferenceModelRewrite"}
    )
    assert set(accepted) == {"llama-alias"}
    # The resource every service follows carries the same configuration as the ConfigMap they
    # start with (else a cluster would change configuration once the resource is listed).
    resource = find(objs, "InferenceGatewayConfig", RESOURCE)
    assert parse_config(copy.deepcopy(resource["spec"])) == config
    for name in FOLLOWERS:
        assert f"--config-resource=$(POD_NAMESPACE)/{RESOURCE}" in _container(objs, name)["args"], name
        env = {e["name"]: e for e in _container(objs, name)["env"]}
        assert env["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"


def test_dev_is_failopen_and_hyperpod_failclose() -> None:
    dev, prod = render("overlays/dev"), render("overlays/eks-hyperpod")
    for objs, mode in ((dev, "FailOpen"), (prod, "FailClose")):
        pools = [o for o in objs if o["kind"] == "InferencePool"]
        assert len(pools) >= 2
        assert {p["spec"]["endpointPickerRef"]["failureMode"] for p in pools} == {mode}
        assert {p.failure_mode for p in parse_config(_gateway_config(objs)).pools} == {mode}
    assert {d["spec"]["replicas"] for d in _epps(dev)} == {1}
    assert min(d["spec"]["replicas"] for d in _epps(prod)) >= 2


@pytest.mark.parametrize("target", OVERLAYS)
def test_references_resolve(target: str) -> None:
    objs = render(target)
    names = {(o["kind"], o["metadata"]["name"]) for o in objs}
    secrets_made = {o["spec"]["secretName"] for o in objs if o["kind"] == "Certificate"}
    for dep in (o for o in objs if o["kind"] == "Deployment"):
        pod = dep["spec"]["template"]
        assert dep["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
        if "serviceAccountName" in pod["spec"]:
            assert ("ServiceAccount", pod["spec"]["serviceAccountName"]) in names
        for vol in pod["spec"].get("volumes", []):
            if "configMap" in vol:
                assert ("ConfigMap", vol["configMap"]["name"]) in names
            if "secret" in vol:
                assert vol["secret"]["secretName"] in secrets_made
        for c in pod["spec"]["containers"]:
            ports = {p.get("name") for p in c.get("ports", [])}
            for probe in ("readinessProbe", "livenessProbe"):
                handler = c.get(probe, {})
                assert len(set(handler) & {"grpc", "httpGet", "tcpSocket", "exec"}) <= 1, (dep, probe)
                port = (handler.get("httpGet") or handler.get("tcpSocket") or {}).get("port")
                assert port is None or isinstance(port, int) or port in ports
            mounts = {m["name"] for m in c.get("volumeMounts", [])}
            assert mounts <= {v["name"] for v in pod["spec"].get("volumes", [])}
    pods = [o["spec"]["template"] for o in objs if o["kind"] == "Deployment"]
    for svc in (o for o in objs if o["kind"] == "Service"):
        selected = [p for p in pods if svc["spec"]["selector"].items() <= p["metadata"]["labels"].items()]
        assert selected, f"Service {svc['metadata']['name']} selects no pods"
        container_ports = {
            p.get("name") for pod in selected for c in pod["spec"]["containers"] for p in c["ports"]
        }
        assert {p["targetPort"] for p in svc["spec"]["ports"]} <= container_ports
    for route in (o for o in objs if o["kind"] == "HTTPRoute"):
        for rule in route["spec"]["rules"]:
            for ref in rule["backendRefs"]:
                assert (ref["kind"], ref["name"]) in names
        assert all(("Gateway", p["name"]) in names for p in route["spec"]["parentRefs"])
    for monitor in (o for o in objs if o["kind"] == "ServiceMonitor"):  # the optional component
        svc = find(objs, "Service", monitor["metadata"]["name"])
        assert monitor["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
        assert monitor["spec"]["endpoints"][0]["port"] in {p["name"] for p in svc["spec"]["ports"]}


def test_the_base_resource_is_the_configmaps_configuration_key_for_key() -> None:
    """The chart writes both from one value (templates/config.yaml): the base must match it."""
    objs = render("base")
    assert find(objs, "InferenceGatewayConfig", RESOURCE)["spec"] == _gateway_config(objs)


def test_the_xds_server_reads_the_resource_and_writes_its_status_only() -> None:
    objs = render("base")
    role = find(objs, "Role", "xds-config")
    granted = {
        (g, r, v)
        for rule in role["rules"]
        for g in rule["apiGroups"]
        for r in rule["resources"]
        for v in rule["verbs"]
    }
    group = "gateway.inference.dev"
    assert granted == {
        *((group, "inferencegatewayconfigs", verb) for verb in ("get", "list", "watch")),
        (group, "inferencegatewayconfigs/status", "patch"),
    }
    binding = find(objs, "RoleBinding", "xds-config")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "xds"}]
    assert find(objs, "Deployment", "xds")["spec"]["template"]["spec"]["serviceAccountName"] == "xds"
    bbr = {
        (g, r)
        for rule in find(objs, "Role", "bbr-reader")["rules"]
        for g in rule["apiGroups"]
        for r in rule["resources"]
    }
    assert (group, "inferencegatewayconfigs") in bbr
    # Envoy's pods in; the API server and DNS out, nothing else.
    policy = _policies(objs)["xds"]
    assert _selects(policy, _pod_labels(objs, "xds")) and policy["policyTypes"] == ["Ingress", "Egress"]
    (rule,) = policy["ingress"]
    assert rule["from"] == [{"podSelector": {"matchLabels": {"app.kubernetes.io/name": "envoy"}}}]
    assert all("to" not in r for r in policy["egress"])
    assert {(p["protocol"], p["port"]) for r in policy["egress"] for p in r["ports"]} == {
        ("TCP", 443),
        ("TCP", 6443),
        ("UDP", 53),
        ("TCP", 53),
    }


def test_role_is_read_only_and_minimal() -> None:
    role = find(render("base"), "Role", "epp-reader")
    granted = {(g, r) for rule in role["rules"] for g in rule["apiGroups"] for r in rule["resources"]}
    assert granted == {
        ("", "pods"),
        ("", "configmaps"),
        ("inference.networking.k8s.io", "inferencepools"),
        ("gateway.inference.dev", "inferencegatewayconfigs"),
        ("llm-d.ai", "inferenceobjectives"),
    }
    assert all(set(rule["verbs"]) == {"get", "list", "watch"} for rule in role["rules"])
    bbr = find(render("base"), "Role", "bbr-reader")
    assert bbr["rules"] == [
        {
            "apiGroups": ["llm-d.ai"],
            "resources": ["inferencemodelrewrites"],
            "verbs": ["get", "list", "watch"],
        },
        {
            "apiGroups": ["gateway.inference.dev"],
            "resources": ["inferencegatewayconfigs"],
            "verbs": ["get", "list", "watch"],
        },
    ]
    binding = find(render("base"), "RoleBinding", "bbr-reader")
    assert binding["subjects"][0]["name"] == "bbr" and binding["roleRef"]["name"] == "bbr-reader"
    assert not [o for o in render("base") if o["kind"] in ("ClusterRole", "ClusterRoleBinding")]


# -- Envoy --------------------------------------------------------------------------------
def _bootstrap(target: str) -> Obj:
    return yaml.safe_load(find(render(target), "ConfigMap", "envoy-bootstrap")["data"]["envoy.yaml"])


def _without_transport_sockets(bootstrap: Obj) -> Obj:
    out = copy.deepcopy(bootstrap)
    for cluster in out["static_resources"]["clusters"]:
        cluster.pop("transport_socket", None)
    return out


@pytest.mark.parametrize("target", OVERLAYS)
def test_envoy_bootstrap_routes_by_metadata_to_services_that_exist(target: str) -> None:
    objs, bootstrap = render(target), _bootstrap(target)
    validate_bootstrap(bootstrap)  # parses into the real envoy Bootstrap proto
    clusters = {c["name"]: c for c in bootstrap["static_resources"]["clusters"]}
    namespace = find(objs, "Deployment", "epp")["metadata"]["namespace"]
    config = parse_config(_gateway_config(objs))
    for name in ("bbr", *(f"epp-{pool.name}" for pool in config.pools)):
        addr = clusters[name]["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]
        host, port = addr["socket_address"]["address"], addr["socket_address"]["port_value"]
        svc_name, svc_ns = host.split(".")[:2]
        assert svc_ns == namespace
        assert port in {p["port"] for p in find(objs, "Service", svc_name)["spec"]["ports"]}
    for pool_cfg in config.pools:
        pool = clusters[f"pool-{pool_cfg.name}"]
        assert pool["type"] == "ORIGINAL_DST" and pool["lb_policy"] == "CLUSTER_PROVIDED"
        assert pool["original_dst_lb_config"]["metadata_key"] == {
            "key": "envoy.lb",
            "path": [{"key": "x-gateway-destination-endpoint"}],
        }
    hcm = bootstrap["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    filters = {f["name"]: f for f in hcm["http_filters"]}
    assert list(filters) == [
        "gateway.strip_routing_headers",
        "gateway.bbr",
        "gateway.epp",
        "envoy.filters.http.router",
    ]
    epp = filters["gateway.epp"]["typed_config"]
    assert epp["metadata_options"]["receiving_namespaces"]["untyped"] == ["envoy.lb"]
    # Every public model name of a pool reaches that pool's route; other names do not.
    routes = {r["name"]: r for r in hcm["route_config"]["virtual_hosts"][0]["routes"]}
    for pool_cfg in config.pools:
        route = routes[f"{pool_cfg.name}-pick"]
        (model_match,) = [h for h in route["match"]["headers"] if h["name"] == "x-gateway-model-name"]
        regex = re.compile(model_match["string_match"]["safe_regex"]["regex"])
        assert {"name": ":method", "string_match": {"exact": "POST"}} in route["match"]["headers"]
        for model, where in config.routes().items():
            assert bool(regex.fullmatch(model)) == (where.pool == pool_cfg.name), (pool_cfg.name, model)
        assert not regex.fullmatch("meta-llama/Llama-3X1-8B-Instruct")


@pytest.mark.parametrize("target", ["base", "overlays/eks-hyperpod"])
def test_epp_replicas_are_each_reached_and_health_checked(target: str) -> None:
    """Several EPP pods: the Service is headless (Envoy's STRICT_DNS resolves every pod IP; a
    ClusterIP would put all streams on one HTTP/2 connection to one pod), the config names
    as many replicas as the Deployment runs, and Envoy health-checks the EPP cluster."""
    objs = render(target)
    clusters = {c["name"]: c for c in _bootstrap(target)["static_resources"]["clusters"]}
    for index, pool in enumerate(parse_config(_gateway_config(objs)).pools):
        name = "epp" if index == 0 else f"epp-{pool.name}"
        replicas = find(objs, "Deployment", name)["spec"]["replicas"]
        assert replicas > 1
        assert find(objs, "Service", name)["spec"]["clusterIP"] == "None"
        assert pool.epp.replicas == replicas
        cluster = clusters[f"epp-{pool.name}"]
        assert cluster["type"] == "STRICT_DNS"
        assert cluster["health_checks"][0]["grpc_health_check"] == {}
        assert cluster["outlier_detection"]["consecutive_local_origin_failure"] == 1


@pytest.mark.parametrize("target", ["base", *OVERLAYS])
def test_epp_replicas_share_state_through_the_store_the_manifests_run(target: str) -> None:
    """`sharedState.redis` names the epp-state Service and its port; the Service selects the
    store's pods on their container port; only EPP pods may connect, and the store dials out
    to nothing."""
    objs = render(target)
    shared = parse_config(_gateway_config(objs)).shared_state
    assert shared is not None
    url = urlsplit(shared.redis)
    service = find(objs, "Service", "epp-state")["spec"]
    assert url.scheme == "redis" and url.hostname == "epp-state"
    (port,) = [p for p in service["ports"] if p["port"] == url.port]
    assert service["selector"].items() <= _pod_labels(objs, "epp-state").items()
    (container,) = find(objs, "Deployment", "epp-state")["spec"]["template"]["spec"]["containers"]
    assert {p["name"]: p["containerPort"] for p in container["ports"]} == {port["targetPort"]: url.port}
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert "--save" in container["args"] and "noeviction" in container["args"]  # memory only, never evicts
    policy = _policies(objs)["epp-state"]
    assert _selects(policy, _pod_labels(objs, "epp-state")) and policy["egress"] == []
    (rule,) = policy["ingress"]
    (peer,) = rule["from"]
    assert peer == {"podSelector": {"matchLabels": {"app.kubernetes.io/name": "epp"}}}
    assert peer["podSelector"]["matchLabels"].items() <= _pod_labels(objs, "epp").items()
    assert [p["port"] for p in rule["ports"]] == [port["targetPort"]]


def test_plaintext_bootstrap_differs_from_base_only_by_tls() -> None:
    plain, mtls = _bootstrap("overlays/dev"), _bootstrap("base")
    assert plain == _without_transport_sockets(plain)
    assert _without_transport_sockets(mtls) == plain
    assert _bootstrap("overlays/eks-hyperpod") == mtls


@pytest.mark.parametrize("target", OVERLAYS)
def test_envoy_bootstrap_holds_the_epp_stream_until_the_response_ends(target: str) -> None:
    """The ORIGINAL_DST rendering keeps the in-flight slot for the whole response, like the local
    static one (tests/integration/test_inflight.py runs both through Envoy)."""
    bootstrap = _bootstrap(target)
    default, picks = epp_processing_modes(bootstrap)
    assert picks, "no pool route"
    for mode in picks.values():
        # Trailers hold the stream to the response's end; the headers only where a feature reads
        # them (GatewayConfig.epp_reads_response_headers: not in these deployments).
        assert mode["response_trailer_mode"] == "SEND", mode
        assert mode["response_header_mode"] == "SKIP", mode
        assert mode.get("response_body_mode", "NONE") == "NONE"  # the default, left out of the file
    assert default["response_trailer_mode"] == "SKIP"
    clusters = {c["name"]: c for c in bootstrap["static_resources"]["clusters"]}
    assert clusters["epp-llama-3-8b"]["circuit_breakers"]["thresholds"][0]["max_requests"] >= 100_000


def test_mtls_bootstrap_files_are_mounted() -> None:
    mtls = _bootstrap("base")
    mounts = find(render("base"), "Deployment", "envoy")["spec"]["template"]["spec"]["containers"][0][
        "volumeMounts"
    ]
    tls_dirs = {m["mountPath"] for m in mounts}
    for cluster in mtls["static_resources"]["clusters"]:
        if "transport_socket" in cluster:
            ctx = cluster["transport_socket"]["typed_config"]["common_tls_context"]
            files = [
                ctx["tls_certificates"][0]["certificate_chain"]["filename"],
                ctx["validation_context"]["trusted_ca"]["filename"],
            ]
            assert all(str(Path(f).parent) in tls_dirs for f in files)


@pytest.mark.parametrize(("out", "argv"), DEPLOY_BOOTSTRAPS, ids=[o for o, _ in DEPLOY_BOOTSTRAPS])
def test_committed_bootstraps_are_what_the_renderer_makes(
    out: str, argv: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(DEPLOY.parent)  # the recorded arguments are relative to the repository
    assert Path(out).read_text() == render_yaml(argv), "run `python -m tools.deploy_configs` and commit"


@pytest.mark.parametrize("key", ["envoy.yaml", "envoy-xds.yaml"])
@pytest.mark.parametrize("target", ["base", "overlays/dev"])
def test_bootstrap_passes_envoy_validate(target: str, key: str, tmp_path: Path) -> None:
    """Envoy reads the mTLS files at start-up: point them at a throwaway CA's."""
    certs = make_certs(tmp_path / "certs")
    text = find(render(target), "ConfigMap", "envoy-bootstrap")["data"][key]
    for name, local in (("tls.crt", certs.client_cert), ("tls.key", certs.client_key), ("ca.crt", certs.ca)):
        text = text.replace(f"{ENVOY_TLS_DIR}/{name}", str(local))
    assert ENVOY_TLS_DIR not in text.split("\n", 2)[2]  # past the header naming the renderer's arguments
    path = tmp_path / "envoy.yaml"
    path.write_text(text)
    envoy = shutil.which("envoy") or str(Path(sys.executable).parent / "envoy")
    out = subprocess.run(
        [envoy, "--mode", "validate", "-c", str(path)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr[-2000:]


# -- Envoy over xDS ---------------------------------------------------------------------------
RESOURCE = "inference-gateway"
FOLLOWERS = ("bbr", "epp", "xds")  # the services that follow the InferenceGatewayConfig


def _xds_bootstrap(target: str) -> Obj:
    return yaml.safe_load(find(render(target), "ConfigMap", "envoy-bootstrap")["data"]["envoy-xds.yaml"])


@pytest.mark.parametrize("target", ["base", *OVERLAYS])
def test_envoy_runs_on_xds_and_the_static_bootstrap_stays_an_option(target: str) -> None:
    """Envoy's bootstrap names the xDS server alone (ADS for listeners and clusters); the
    server's topology and the resource's configuration make exactly the static bootstrap's
    listeners, routes and clusters, which the ConfigMap keeps for a cluster that wants no xDS."""
    objs = render(target)
    args = _container(objs, "envoy")["args"]
    assert args[args.index("-c") + 1] == "/etc/envoy/envoy-xds.yaml"
    bootstrap = _xds_bootstrap(target)
    validate_bootstrap(bootstrap)
    assert "listeners" not in bootstrap["static_resources"]
    (xds,) = bootstrap["static_resources"]["clusters"]
    assert xds["name"] == XDS_CLUSTER
    assert bootstrap["dynamic_resources"]["ads_config"]["grpc_services"] == [
        {"envoy_grpc": {"cluster_name": XDS_CLUSTER}}
    ]
    assert (
        bootstrap["dynamic_resources"]["lds_config"]
        == bootstrap["dynamic_resources"]["cds_config"]
        == {
            "ads": {},
            "resource_api_version": "V3",
        }
    )
    # The cluster dials the xDS Service of this namespace on a port it serves.
    address = xds["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"][
        "socket_address"
    ]
    service, namespace = address["address"].split(".")[:2]
    assert namespace == find(objs, "Deployment", "xds")["metadata"].get("namespace", "inference-gateway")
    ports = find(objs, "Service", service)["spec"]["ports"]
    (port,) = [p for p in ports if p["port"] == address["port_value"]]
    xds_args = _container(objs, "xds")["args"]
    assert {p["name"]: p["containerPort"] for p in _container(objs, "xds")["ports"]}[
        port["targetPort"]
    ] == int(next(a for a in xds_args if a.startswith("--port=")).split("=")[1])
    # The server's topology, mounted where its --topology says, renders the static bootstrap.
    topology_path = Path(next(a for a in xds_args if a.startswith("--topology=")).split("=")[1])
    mount = next(
        m for m in _container(objs, "xds")["volumeMounts"] if m["mountPath"] == str(topology_path.parent)
    )
    volume = next(
        v
        for v in find(objs, "Deployment", "xds")["spec"]["template"]["spec"]["volumes"]
        if v["name"] == mount["name"]
    )
    topology = topology_from_json(
        find(objs, "ConfigMap", volume["configMap"]["name"])["data"][topology_path.name]
    )
    config = parse_config(find(objs, "InferenceGatewayConfig", RESOURCE)["spec"])
    # dev's static bootstrap is the base configuration's, plaintext (test_plaintext_bootstrap_...):
    # its resource (FailOpen, one replica) is rendered as the static renderer would render it.
    static = render_bootstrap(config, topology) if target in PLAINTEXT else _bootstrap(target)
    assert_snapshot_is_the_bootstrap(snapshot(config, topology), static)


@pytest.mark.parametrize(("out", "topology", "argv"), DEPLOY_XDS, ids=[o for o, _, _ in DEPLOY_XDS])
def test_committed_xds_bootstraps_and_topologies_are_what_the_renderer_makes(
    out: str, topology: str, argv: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(DEPLOY.parent)
    assert f"--xds {XDS_SERVICE}" in " ".join(argv)
    assert Path(out).read_text() == render_yaml(argv), "run `python -m tools.deploy_configs` and commit"
    assert Path(topology).read_text() == render_topology(argv), "run `python -m tools.deploy_configs`"


# -- secure defaults: mTLS, NetworkPolicies, bindings ---------------------------------------
ENVOY_TLS_DIR = "/etc/envoy-tls"
TLS_FLAGS = ("--tls-cert=", "--tls-key=", "--tls-client-ca=")


def _container(objs: tuple[Obj, ...], name: str) -> Obj:
    pod = find(objs, "Deployment", name)["spec"]["template"]["spec"]
    # A later pool's EPP, epp-<pool>, runs the container `epp` too.
    (container,) = [
        c for c in pod["containers"] if c["name"] in (name, "epp" if name.startswith("epp-") else name)
    ]
    return container


def _pod_labels(objs: tuple[Obj, ...], name: str) -> dict[str, str]:
    return find(objs, "Deployment", name)["spec"]["template"]["metadata"]["labels"]


@pytest.mark.parametrize("target", ["base", *OVERLAYS])
def test_only_dev_is_plaintext(target: str) -> None:
    objs = render(target)
    clusters = {c["name"]: c for c in _bootstrap(target)["static_resources"]["clusters"]}
    extproc = {
        "bbr": clusters["bbr"],
        "xds": _xds_bootstrap(target)["static_resources"]["clusters"][0],
    }
    for index, pool in enumerate(parse_config(_gateway_config(objs)).pools):  # every pool's EPP
        extproc["epp" if index == 0 else f"epp-{pool.name}"] = clusters[f"epp-{pool.name}"]
    service_args = [_container(objs, name)["args"] for name in extproc]
    cert_manager = [o for o in objs if o["apiVersion"].startswith("cert-manager.io/")]
    if target in PLAINTEXT:
        assert not any("transport_socket" in c for c in extproc.values())
        assert not any(a.startswith(TLS_FLAGS) for args in service_args for a in args)
        assert not cert_manager
        return
    assert all("transport_socket" in c for c in extproc.values())
    for args in service_args:
        assert all(any(a.startswith(flag) for a in args) for flag in TLS_FLAGS), args
    # Each service presents a certificate for the very name Envoy dials and checks.
    certificates = [o["spec"] for o in cert_manager if o["kind"] == "Certificate"]
    dns_names = {c["secretName"]: set(c.get("dnsNames", [])) for c in certificates}
    for name, cluster in extproc.items():
        ctx = cluster["transport_socket"]["typed_config"]["common_tls_context"]
        (san,) = ctx["validation_context"]["match_typed_subject_alt_names"]
        volumes = find(objs, "Deployment", name)["spec"]["template"]["spec"]["volumes"]
        secrets = {v["secret"]["secretName"] for v in volumes if "secret" in v}
        assert any(san["matcher"]["exact"] in dns_names.get(secret, ()) for secret in secrets), (name, san)
    # Envoy mounts its client certificate where the bootstrap reads it.
    envoy_pod = find(objs, "Deployment", "envoy")["spec"]["template"]["spec"]
    assert ENVOY_TLS_DIR in {m["mountPath"] for m in _container(objs, "envoy")["volumeMounts"]}
    assert "envoy-client-tls" in {v["secret"]["secretName"] for v in envoy_pod["volumes"] if "secret" in v}


@pytest.mark.parametrize("target", ["base", *OVERLAYS])
def test_services_listen_on_the_pod_ip_and_envoy_admin_on_loopback(target: str) -> None:
    objs = render(target)
    for name in ("bbr", "epp", "xds"):
        container = _container(objs, name)
        assert "--host=$(POD_IP)" in container["args"]
        env = {e["name"]: e for e in container["env"]}
        assert env["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
        # The kubelet probes the pod IP; its gRPC probes cannot do mTLS, so none is used.
        for probe in ("readinessProbe", "livenessProbe"):
            assert "grpc" not in container[probe]
    bootstrap = _bootstrap(target)
    assert bootstrap["admin"]["address"]["socket_address"]["address"] == "127.0.0.1"
    (listener,) = bootstrap["static_resources"]["listeners"]
    assert listener["address"]["socket_address"]["address"] == "0.0.0.0"  # behind the Service


@pytest.mark.parametrize("target", ["base", *OVERLAYS])
def test_services_run_the_packages_console_scripts(target: str) -> None:
    """The image's containers run the entry points pyproject.toml installs, which load and are callable."""
    scripts = tomllib.loads((DEPLOY.parent / "pyproject.toml").read_text())["project"]["scripts"]
    objs = render(target)
    for name, module in (("bbr", "bbr.__main__"), ("epp", "epp.__main__"), ("xds", "gateway.xds")):
        (command,) = _container(objs, name)["command"]
        module_name, _, func = scripts[command].partition(":")
        assert module_name == module, (command, scripts[command])
        assert callable(getattr(importlib.import_module(module_name), func))


def _epps(objs: tuple[Obj, ...]) -> list[Obj]:
    """Every pool's EPP Deployment."""
    return [
        o
        for o in objs
        if o["kind"] == "Deployment" and o["metadata"]["labels"].get("app.kubernetes.io/name") == "epp"
    ]


def _policies(objs: tuple[Obj, ...]) -> dict[str, Obj]:
    return {o["metadata"]["name"]: o["spec"] for o in objs if o["kind"] == "NetworkPolicy"}


def _selects(spec: Obj, labels: dict[str, str]) -> bool:
    return bool(spec["podSelector"]["matchLabels"].items() <= labels.items())


@pytest.mark.parametrize("target", ["base", *OVERLAYS])
def test_network_policies_admit_only_envoy_to_ext_proc_and_monitoring_to_metrics(target: str) -> None:
    objs = render(target)
    policies = _policies(objs)
    assert policies == _policies(render("base")), "overlays keep the base's NetworkPolicies"
    envoy_labels = _pod_labels(objs, "envoy")
    monitoring = {"kubernetes.io/metadata.name": "monitoring"}
    for name, allowed in (
        ("bbr", {"grpc": "envoy", "metrics": "monitoring"}),
        ("epp", {"grpc": "envoy", "metrics": "monitoring"}),
        ("xds", {"grpc": "envoy"}),
    ):
        (policy,) = [p for p in policies.values() if _selects(p, _pod_labels(objs, name))]
        assert "Ingress" in policy["policyTypes"]
        # Every container port is fenced, and each rule admits exactly one kind of peer.
        assert {p["name"] for p in _container(objs, name)["ports"]} == set(allowed)
        seen: dict[str, str] = {}
        for rule in policy["ingress"]:
            (peer,) = rule["from"]
            if "podSelector" in peer:
                assert "namespaceSelector" not in peer  # Envoy pods of this namespace only
                assert peer["podSelector"]["matchLabels"].items() <= envoy_labels.items()
                who = "envoy"
            else:
                assert peer == {"namespaceSelector": {"matchLabels": monitoring}}
                who = "monitoring"
            seen.update({port["port"]: who for port in rule["ports"]})
        assert seen == allowed, name


def test_epp_egress_reaches_model_servers_and_the_api_only() -> None:
    objs = render("overlays/dev")
    (policy,) = [p for p in _policies(objs).values() if _selects(p, _pod_labels(objs, "epp"))]
    assert "Egress" in policy["policyTypes"]
    to_pods = [r for r in policy["egress"] if r.get("to") == [{"podSelector": {}}]]
    state_labels = _pod_labels(objs, "epp-state")
    to_state = [
        r
        for r in policy["egress"]
        if r.get("to") not in (None, [{"podSelector": {}}])
        and all(_selects(peer, state_labels) and set(peer) == {"podSelector"} for peer in r["to"])
    ]
    anywhere = [r for r in policy["egress"] if "to" not in r]
    assert len(to_pods) + len(to_state) + len(anywhere) == len(policy["egress"])
    # The pool's target port (where vLLM serves /metrics too) and vLLM's KV-events port.
    target_port = find(objs, "InferencePool", "llama-3-8b")["spec"]["targetPorts"][0]["number"]
    assert {p["port"] for r in to_pods for p in r["ports"]} == {target_port, 5557}
    assert {(p["protocol"], p["port"]) for r in to_state for p in r["ports"]} == {("TCP", 6379)}
    # The Kubernetes API, and DNS (the shared-state store is named by its Service).
    assert {(p["protocol"], p["port"]) for r in anywhere for p in r["ports"]} == {
        ("TCP", 443),
        ("TCP", 6443),
        ("UDP", 53),
        ("TCP", 53),
    }


def test_envoy_egress_reaches_the_ext_proc_services_dns_and_pool_pods_only() -> None:
    """ORIGINAL_DST dials whatever address the EPP names: the policy bounds even a wrong one."""
    objs = render("overlays/dev")
    (policy,) = [p for p in _policies(objs).values() if _selects(p, _pod_labels(objs, "envoy"))]
    assert policy["policyTypes"] == ["Egress"]
    allowed: dict[str, set[tuple[str, int]]] = {}
    for rule in policy["egress"]:
        ports = {(p["protocol"], p["port"]) for p in rule["ports"]}
        if "to" not in rule:
            allowed["anywhere"] = ports
            continue
        (peer,) = rule["to"]
        assert set(peer) == {"podSelector"}  # pods of this namespace only
        if peer["podSelector"] == {}:
            allowed["pods"] = ports
            continue
        (name,) = [n for n in ("bbr", "epp", "xds") if _selects(peer, _pod_labels(objs, n))]
        allowed[name] = ports
    grpc = {
        n: next(p["containerPort"] for p in _container(objs, n)["ports"] if p["name"] == "grpc")
        for n in ("bbr", "epp", "xds")
    }
    target_port = find(objs, "InferencePool", "llama-3-8b")["spec"]["targetPorts"][0]["number"]
    assert allowed == {
        "bbr": {("TCP", grpc["bbr"])},
        "epp": {("TCP", grpc["epp"])},
        "xds": {("TCP", grpc["xds"])},
        "pods": {("TCP", target_port)},
        "anywhere": {("UDP", 53), ("TCP", 53)},
    }


# -- monitoring ---------------------------------------------------------------------------
def test_only_the_monitoring_component_needs_the_prometheus_operator() -> None:
    """The base and dev render no Prometheus Operator kind; eks-hyperpod adds the component."""
    for target in ("base", "overlays/dev"):
        assert not [o for o in render(target) if o["apiVersion"].startswith("monitoring.coreos.com/")]
    prod = render("overlays/eks-hyperpod")
    assert find(prod, "ServiceMonitor", "epp") and find(prod, "ServiceMonitor", "bbr")


def test_dashboard_charts_the_epp_metrics() -> None:
    cm = find(render("base"), "ConfigMap", "epp-grafana-dashboard")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    dashboard = json.loads(cm["data"]["epp-dashboard.json"])
    exprs = " ".join(t["expr"] for p in dashboard["panels"] for t in p["targets"])
    for metric in (
        "inference_objective_request_total",
        "inference_pool_average_kv_cache_utilization",
        "inference_pool_average_queue_size",
        "inference_pool_ready_pods",
        "inference_extension_scheduler_e2e_duration_seconds_bucket",
    ):
        assert metric in exprs
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))


# -- autoscaling examples -------------------------------------------------------------------
_SERIES = re.compile(r"([a-z_:]+)\{([^}]*)\}")


def _queried_series(promql: str) -> list[tuple[str, dict[str, str]]]:
    """(metric, {label: value}) for each `metric{...}` selector in a PromQL expression."""
    return [
        (metric, dict(re.findall(r'(\w+)\s*!?=~?\s*"([^"]*)"', matchers)))
        for metric, matchers in _SERIES.findall(promql)
    ]


def test_autoscaling_examples_scale_the_example_pool_on_series_the_epp_exports() -> None:
    """Names and labels are those the live EPP exports (tests/integration/test_autoscaling_metrics)."""
    examples = render("examples")
    pool = find(examples, "InferencePool", "llama-3-8b")["metadata"]["name"]
    deployment = find(examples, "Deployment", "vllm-llama-3-8b")["metadata"]["name"]
    scaled = find(render("examples/autoscaling/keda"), "ScaledObject", "vllm-llama-3-8b")
    hpa_objs = render("examples/autoscaling/hpa")
    hpa = find(hpa_objs, "HorizontalPodAutoscaler", "vllm-llama-3-8b")
    for ref in (scaled["spec"]["scaleTargetRef"], hpa["spec"]["scaleTargetRef"]):
        assert (ref["apiVersion"], ref["kind"], ref["name"]) == ("apps/v1", "Deployment", deployment)

    # KEDA: each query selects exported series by their own pool label.
    assert {t["name"] for t in scaled["spec"]["triggers"]} == {
        "pool-saturation",
        "pool-queue",
        "pool-inflight",
    }
    for trigger in scaled["spec"]["triggers"]:
        series = _queried_series(trigger["metadata"]["query"])
        assert series, trigger
        for metric, labels in series:
            assert metric in AUTOSCALING_SERIES, metric
            assert labels and set(labels) <= AUTOSCALING_SERIES[metric], (metric, labels)
            assert set(labels.values()) == {pool}

    # KEDA from zero: activated by the requests the EPP holds for a first pod.
    zero = find(render("examples/autoscaling/keda-from-zero"), "ScaledObject", "vllm-llama-3-8b")["spec"]
    assert zero["minReplicaCount"] == 0 and zero["scaleTargetRef"] == scaled["spec"]["scaleTargetRef"]
    assert {t["name"] for t in zero["triggers"]} == {"pool-waiting-for-pods", "pool-inflight"}
    for trigger in zero["triggers"]:
        for metric, labels in _queried_series(trigger["metadata"]["query"]):
            assert metric in AUTOSCALING_SERIES and set(labels) <= AUTOSCALING_SERIES[metric], metric
            assert set(labels.values()) == {pool}

    # HPA: each external metric is a prometheus-adapter rule over an exported series, grouped by
    # the label the HPA's selector picks the pool with.
    config = yaml.safe_load(
        find(hpa_objs, "ConfigMap", "prometheus-adapter-inference-pool")["data"]["config.yaml"]
    )
    rules = {r["name"]["as"]: r for r in config["externalRules"]}
    for m in hpa["spec"]["metrics"]:
        assert m["type"] == "External"
        metric_ref = m["external"]["metric"]
        rule = rules[metric_ref["name"]]
        ((metric, _),) = _queried_series(rule["seriesQuery"])
        assert metric in AUTOSCALING_SERIES, metric
        selector = metric_ref["selector"]["matchLabels"]
        assert set(selector.values()) == {pool}
        assert "<<.Series>>{<<.LabelMatchers>>}" in rule["metricsQuery"]
        outer_by = re.findall(r"by \(([^)]*)\)", rule["metricsQuery"])[0]
        assert set(selector) <= {label.strip() for label in outer_by.split(",")} <= AUTOSCALING_SERIES[metric]


def test_scaledobject_schema_rejects_what_keda_would_reject_or_silently_drop() -> None:
    validator = jsonschema.Draft4Validator(THIRD_PARTY_SCHEMAS[("keda.sh/v1alpha1", "ScaledObject")])
    good = find(render("examples/autoscaling/keda"), "ScaledObject", "vllm-llama-3-8b")["spec"]
    assert validator.is_valid(good)
    for path, value in [
        (("triggers", 0, "metadata", "threshold"), 0.6),  # KEDA's metadata is map[string]string
        (("triggers", 0, "metricType"), "Average"),
        (("triggers", 0, "metadata", "serverAddress"), "prometheus:9090"),
        (("minReplicas",), 1),  # the HPA's spelling: KEDA's CRD would prune it and run with 0
        (("scaleTargetRef", "nam"), "x"),
    ]:
        bad = copy.deepcopy(good)
        node = bad
        for part in path[:-1]:
            node = node[part]
        node[path[-1]] = value
        assert not validator.is_valid(bad), path


@pytest.mark.parametrize("target", TARGETS)
def test_pods_start_on_a_clean_cluster(target: str) -> None:
    """No container argument names a path inside an emptyDir (empty when the pod starts: a model
    server told to load adapters from there fails to start), and no emptyDir is mounted read-only
    (nothing could ever fill it)."""
    for obj in render(target):
        if obj["kind"] != "Deployment":
            continue
        pod = obj["spec"]["template"]["spec"]
        empty = {v["name"] for v in pod.get("volumes", []) if "emptyDir" in v}
        for container in pod["containers"]:
            mounts = [m for m in container.get("volumeMounts", []) if m["name"] in empty]
            assert not [m for m in mounts if m.get("readOnly")], (obj["metadata"]["name"], mounts)
            for arg in [*container.get("command", []), *container.get("args", [])]:
                for m in mounts:
                    assert f"{m['mountPath']}/" not in arg, (obj["metadata"]["name"], arg)
