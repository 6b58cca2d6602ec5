"""What deploy/ ships serves two pools from one InferenceGatewayConfig, Envoy fed over xDS.

`kubectl kustomize` of the base and of every overlay (the real binary: skipped only where no
kubectl with kustomize >= 4 is on PATH), and the Helm chart's default rendering
(tests/k8s/test_helm_chart.py calls `assert_serves_every_pool_over_xds` on it): one resource
names both pools, each pool has its own EPP (Deployment, headless Service, PodDisruptionBudget,
certificate where mTLS is on) following that resource, and the xDS server renders both pools'
routes and clusters from it for Envoy, whose bootstrap names the xDS server alone. The files a
kustomize user does not edit are generated from the configuration (tools/deploy_pools.py),
so adding a pool is one edit: the last test fails when a committed one is stale.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from envoy_data_plane.envoy.config.cluster.v3 import Cluster
from envoy_data_plane.envoy.config.route.v3 import RouteConfiguration

from gateway.config import parse_config
from gateway.envoy.xds_resources import CLUSTER, ROUTE, XDS_CLUSTER, snapshot, topology_from_json
from tests.k8s.kustomize_lite import build
from tests.k8s.test_manifests import DEPLOY, OVERLAYS, _kubectl, render
from tools import deploy_pools

Obj = dict[str, Any]
RESOURCE = "inference-gateway"
POOLS = ["llama-3-8b", "qwen3-8b"]  # what deploy/ and the chart ship


def _one(objs: list[Obj], kind: str, name: str) -> Obj:
    matches = [o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(matches) == 1, f"{kind}/{name}: {len(matches)} found"
    return matches[0]


def _container(deployment: Obj) -> Obj:
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return container


def assert_serves_every_pool_over_xds(objs: list[Obj], pools: list[str] = POOLS) -> None:
    """The rendered objects serve `pools` from the one resource, each by its EPP, over xDS."""
    (resource,) = [o for o in objs if o["kind"] == "InferenceGatewayConfig"]
    assert resource["metadata"]["name"] == RESOURCE
    config = parse_config(resource["spec"])
    assert [p.name for p in config.pools] == pools
    started_with = yaml.safe_load(_one(objs, "ConfigMap", "gateway-config")["data"]["config.yaml"])
    assert parse_config(started_with) == config  # the ConfigMap the services fall back to agrees
    follows = f"--config-resource=$(POD_NAMESPACE)/{RESOURCE}"
    for name in ("bbr", "xds"):
        assert follows in _container(_one(objs, "Deployment", name))["args"], name
    tls = any(o["kind"] == "Certificate" for o in objs)
    epps = [
        o
        for o in objs
        if o["kind"] == "Deployment"
        and o["metadata"].get("labels", {}).get("app.kubernetes.io/name") == "epp"
    ]
    assert len(epps) == len(pools)
    for index, pool in enumerate(config.pools):
        assert pool.kubernetes is not None
        name = deploy_pools.epp_name(index, pool.name)
        deployment = _one(objs, "Deployment", name)
        pod = deployment["spec"]["template"]
        args = _container(deployment)["args"]
        assert f"--pool={pool.name}" in args and follows in args, args
        assert deployment["spec"]["replicas"] == pool.epp.replicas
        # Its Service (headless: Envoy resolves every replica) and PDB take its pods, no other pool's.
        service = _one(objs, "Service", name)["spec"]
        assert service["clusterIP"] == "None"
        assert service["selector"].items() <= pod["metadata"]["labels"].items()
        for other in epps:
            if other is not deployment:
                assert (
                    not service["selector"].items() <= other["spec"]["template"]["metadata"]["labels"].items()
                )
        pdb = _one(objs, "PodDisruptionBudget", name)["spec"]["selector"]["matchLabels"]
        assert pdb == deployment["spec"]["selector"]["matchLabels"]
        host = f"{name}.{pool.kubernetes.namespace}.svc.cluster.local"
        if tls:  # its server certificate names the host Envoy dials
            (secret,) = [v["secret"]["secretName"] for v in pod["spec"]["volumes"] if "secret" in v]
            (certificate,) = [
                o for o in objs if o["kind"] == "Certificate" and o["spec"]["secretName"] == secret
            ]
            assert host in certificate["spec"]["dnsNames"]
        # Where the examples run, the pool's InferencePool names this EPP.
        inference_pools = [o for o in objs if o["kind"] == "InferencePool"]
        if inference_pools:
            ref = _one(objs, "InferencePool", pool.kubernetes.pool_name)["spec"]["endpointPickerRef"]
            assert ref["name"] == name and ref["port"]["number"] == deploy_pools.EPP_PORT
    # Envoy runs on xDS: its bootstrap names the xDS server alone, the server follows the resource.
    envoy_args = _container(_one(objs, "Deployment", "envoy"))["args"]
    assert envoy_args[envoy_args.index("-c") + 1] == "/etc/envoy/envoy-xds.yaml"
    bootstrap = yaml.safe_load(_one(objs, "ConfigMap", "envoy-bootstrap")["data"]["envoy-xds.yaml"])
    (xds_cluster,) = bootstrap["static_resources"]["clusters"]
    assert xds_cluster["name"] == XDS_CLUSTER and "listeners" not in bootstrap["static_resources"]
    assert bootstrap["dynamic_resources"]["ads_config"]["grpc_services"] == [
        {"envoy_grpc": {"cluster_name": XDS_CLUSTER}}
    ]
    endpoint = xds_cluster["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]
    assert endpoint["address"]["socket_address"]["address"].split(".")[0] == "xds"
    assert _one(objs, "Service", "xds")
    # What the xDS server serves Envoy from that resource: both pools' routes, EPP and pod clusters.
    topology = topology_from_json(_one(objs, "ConfigMap", "xds-topology")["data"]["topology.json"])
    snap = snapshot(config, topology)
    clusters = {c.name: c for c in (Cluster().parse(a.value) for a in snap[CLUSTER].resources)}
    (routes,) = (RouteConfiguration().parse(a.value) for a in snap[ROUTE].resources)
    route_names = {route.name for host in routes.virtual_hosts for route in host.routes}
    for index, pool in enumerate(config.pools):
        assert pool.kubernetes is not None
        assert {f"pool-{pool.name}", f"epp-{pool.name}"} <= set(clusters)
        address = clusters[f"epp-{pool.name}"].load_assignment.endpoints[0].lb_endpoints[0].endpoint.address
        assert address.socket_address.address == (
            f"{deploy_pools.epp_name(index, pool.name)}.{pool.kubernetes.namespace}.svc.cluster.local"
        )
        assert address.socket_address.port_value == deploy_pools.EPP_PORT
        assert f"{pool.name}-pick" in route_names


@pytest.mark.parametrize("target", ["base", *OVERLAYS])
def test_kubectl_kustomize_serves_two_pools_from_one_resource_over_xds(target: str) -> None:
    if _kubectl() is None:
        pytest.skip("no kubectl with kustomize >= 4 on PATH")
    assert_serves_every_pool_over_xds(list(render(target)))  # render() runs kubectl kustomize


@pytest.mark.parametrize(("out", "make"), deploy_pools.GENERATED, ids=[o for o, _ in deploy_pools.GENERATED])
def test_generated_deploy_files_are_what_the_configuration_makes(out: str, make: Any) -> None:
    root = DEPLOY.parent
    assert (root / out).read_text() == make(root), "run `python -m tools.deploy_configs` and commit"


def test_a_later_pool_must_name_its_epp(tmp_path: Path) -> None:
    """A pool added without where its EPP is: the generator says what to write, not a broken render."""
    config = yaml.safe_load((DEPLOY / "base/config/gateway.yaml").read_text())
    del config["pools"][1]["epp"]["host"]
    (tmp_path / deploy_pools.BASE_CONFIG).parent.mkdir(parents=True)
    (tmp_path / deploy_pools.BASE_CONFIG).write_text(yaml.safe_dump(config))
    with pytest.raises(SystemExit, match=r"epp-qwen3-8b\.inference-gateway\.svc\.cluster\.local"):
        deploy_pools.load(tmp_path)


def test_adding_a_pool_is_one_edit_of_the_configuration(tmp_path: Path) -> None:
    """A third pool written into base/config/gateway.yaml alone: after the generator, every
    overlay runs its EPP and the resource, and the xDS server, serve it."""
    for part in ("base", "cert-manager", "components", "examples", "overlays"):
        shutil.copytree(DEPLOY / part, tmp_path / "deploy" / part)
    config_path = tmp_path / deploy_pools.BASE_CONFIG
    config = yaml.safe_load(config_path.read_text())
    config["pools"].append(
        {
            "name": "qwen3-32b",
            "engine": "vllm",
            "targetPort": 8000,
            "failureMode": "FailClose",
            "kubernetes": {"namespace": "inference-gateway", "poolName": "qwen3-32b"},
            "epp": {"host": "epp-qwen3-32b.inference-gateway.svc.cluster.local", "port": 9002, "replicas": 2},
            "models": [{"name": "Qwen/Qwen3-32B"}],
        }
    )
    config_path.write_text(yaml.safe_dump(config, sort_keys=False))
    for out, make in deploy_pools.GENERATED:
        (tmp_path / out).write_text(make(tmp_path))
    kubectl = _kubectl()
    for target in ("base", *OVERLAYS):
        objs = build(tmp_path / "deploy" / target)
        if kubectl is not None:
            out = subprocess.run(
                [kubectl, "kustomize", str(tmp_path / "deploy" / target)],
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert out.returncode == 0, out.stderr
            objs = [o for o in yaml.safe_load_all(out.stdout) if o]
        epp = _one(objs, "Deployment", "epp-qwen3-32b")
        assert "--pool=qwen3-32b" in _container(epp)["args"]
        assert (
            _one(objs, "Service", "epp-qwen3-32b")["spec"]["selector"]["gateway.inference.dev/pool"]
            == "qwen3-32b"
        )
        resource = _one(objs, "InferenceGatewayConfig", RESOURCE)
        assert [p["name"] for p in resource["spec"]["pools"]] == [*POOLS, "qwen3-32b"]
        certificates = [o for o in objs if o["kind"] == "Certificate"]
        plaintext = {
            "overlays/dev": deploy_pools.DEV_EPP_REPLICAS,
            "overlays/sim": deploy_pools.SIM_EPP_REPLICAS,
        }
        if target in plaintext:  # every EPP plaintext, the overlay's replicas, FailOpen
            assert not certificates and epp["spec"]["replicas"] == plaintext[target]
            assert {p["epp"]["replicas"] for p in resource["spec"]["pools"]} == {plaintext[target]}
            assert not [a for a in _container(epp)["args"] if a.startswith("--tls-")]
            assert {p["failureMode"] for p in resource["spec"]["pools"]} == {"FailOpen"}
        else:
            (cert,) = [c for c in certificates if c["spec"]["secretName"] == "epp-qwen3-32b-tls"]
            assert "epp-qwen3-32b.inference-gateway.svc.cluster.local" in cert["spec"]["dnsNames"]
        topology = topology_from_json(_one(objs, "ConfigMap", "xds-topology")["data"]["topology.json"])
        snap = snapshot(parse_config(resource["spec"]), topology)
        clusters = {c.name for c in (Cluster().parse(a.value) for a in snap[CLUSTER].resources)}
        assert {"pool-qwen3-32b", "epp-qwen3-32b"} <= clusters
