"""The CPU-only install (deploy/overlays/sim, and the chart with `simulatedModelServers.enabled`),
brought up as far as one machine allows.

Both renderings are checked object by object against the API schemas (tests/k8s/test_manifests.py)
and for what makes them runnable without GPUs. Then each is run (tests/k8s/sim_cluster.py, in a
private network and mount namespace): every Deployment's pods from exactly their rendered
command, arguments and ConfigMaps (the EPPs, BBR and the xDS server against the fake API server,
Valkey, the modelsim pods, Envoy with the rendered bootstrap), each Ready by its rendered probe,
and a chat completion for each pool's model answered through Envoy by a pod of that pool.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.k8s.kubelet_sim import IMAGE_ENTRYPOINTS, have_unshare
from tests.k8s.test_manifests import DEPLOY, render, validate_objects

pytestmark = pytest.mark.integration

CHART = DEPLOY / "helm" / "inference-gateway"
NAMESPACE = "inference-gateway"
# The chart's CPU-only install: what deploy/README.md "Try it without GPUs" passes to helm (as
# overlays/sim: one Envoy, BBR and xDS server; two EPP replicas per pool). One Envoy, also because
# two would share this machine's hot-restart socket (in a cluster each pod has its own network).
SIM_VALUES = {
    "simulatedModelServers": {"enabled": True},
    "mtls": {"enabled": False},
    "image": {"tag": "dev"},
    "envoy": {"replicas": 1},
    "bbr": {"replicas": 1},
    "xds": {"replicas": 1},
}
Obj = dict[str, Any]


def _helm_sim() -> list[Obj]:
    if importlib.util.find_spec("helm_sdkpy") is None:
        if os.environ.get("CI"):
            raise RuntimeError("helm-sdkpy is missing: the Makefile's venv step installs it")
        pytest.skip("helm-sdkpy not installed (make test installs it)")
    from tests.k8s.helm_render import render_chart

    (result,) = render_chart(CHART, [{"namespace": NAMESPACE, "values": SIM_VALUES}])["renders"]
    assert "error" not in result, result["error"]
    objs = [o for o in yaml.safe_load_all(result["manifest"]) if o]
    for obj in objs:  # what `helm install --namespace` does with a template that names none
        obj["metadata"].setdefault("namespace", NAMESPACE)
    return objs + result["crds"]


RENDERINGS = {"kustomize": lambda: list(render("overlays/sim")), "helm": _helm_sim}


@pytest.fixture(scope="module", params=sorted(RENDERINGS))
def install(request: pytest.FixtureRequest) -> list[Obj]:
    return list(RENDERINGS[request.param]())


def _containers(objs: list[Obj]) -> dict[str, Obj]:
    return {
        o["metadata"]["name"]: o["spec"]["template"]["spec"]["containers"][0]
        for o in objs
        if o["kind"] == "Deployment"
    }


def test_every_object_validates(install: list[Obj]) -> None:
    validate_objects(install)


def test_it_runs_on_cpus_with_simulated_servers_and_the_shipped_shape(install: list[Obj]) -> None:
    containers = _containers(install)
    deployments = {o["metadata"]["name"]: o for o in install if o["kind"] == "Deployment"}
    for name, container in containers.items():
        assert "nvidia.com/gpu" not in json.dumps(container.get("resources", {})), name
        assert not container["image"].startswith("vllm/"), name
    config = next(o for o in install if o["kind"] == "InferenceGatewayConfig")["spec"]
    for pool in config["pools"]:
        # Each InferencePool selects simulated servers of the gateway's image, serving its model.
        inference_pool = next(
            o
            for o in install
            if o["kind"] == "InferencePool" and o["metadata"]["name"] == pool["kubernetes"]["poolName"]
        )
        selector = inference_pool["spec"]["selector"]["matchLabels"]
        (servers,) = [
            d
            for d in deployments.values()
            if selector.items() <= d["spec"]["template"]["metadata"]["labels"].items()
        ]
        container = servers["spec"]["template"]["spec"]["containers"][0]
        assert container["command"] == ["modelsim"] and container["image"].startswith("inference-gateway:")
        model = servers["spec"]["template"]["metadata"]["annotations"]["gateway.inference.dev/model"]
        assert f"--model={model}" in container["args"] and model == pool["models"][0]["name"]
        # Its EPP: two replicas sharing state through the epp-state Valkey.
        epp = deployments[inference_pool["spec"]["endpointPickerRef"]["name"]]
        assert epp["spec"]["replicas"] == 2 and pool["epp"]["replicas"] == 2
    assert config["sharedState"]["redis"].startswith("redis://epp-state:")
    assert {"epp-state", "bbr", "xds", "envoy"} <= set(deployments)
    assert not [o for o in install if o["apiVersion"].startswith("cert-manager.io/")]


def _bring_up(objs: list[Obj], workdir: Path) -> Obj:
    why = have_unshare()
    if why is not None:
        if os.environ.get("CI"):
            raise RuntimeError(f"CI runs as root: {why}")
        pytest.skip(why)
    rendered = workdir / "rendered.yaml"
    rendered.write_text(yaml.safe_dump_all(objs))
    out = workdir / "result.json"
    run = subprocess.run(
        ["unshare", "--net", "--mount", "--fork", "--", sys.executable, "-m", "tests.k8s.sim_cluster",
         "--objects", str(rendered), "--workdir", str(workdir), "--out", str(out)],
        cwd=Path(__file__).resolve().parents[2], capture_output=True, text=True, timeout=540,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    result: Obj = json.loads(out.read_text())
    assert "error" not in result, json.dumps(result, indent=1)[-6000:]
    return result


def test_the_rendered_install_serves_through_envoy(install: list[Obj], tmp_path: Path) -> None:
    result = _bring_up(install, tmp_path)
    pods = result["pods"]
    config = next(o for o in install if o["kind"] == "InferenceGatewayConfig")["spec"]
    containers = _containers(install)
    # Every pod ran its container's rendered command line: word for word, with the downward
    # API's $(VAR)s expanded and a mounted path's directory standing in for it.
    for name, pod in pods.items():
        rendered = containers[pod["deployment"]]
        words = [*(rendered.get("command") or IMAGE_ENTRYPOINTS[rendered["image"].rsplit(":", 1)[0]]),
                 *rendered.get("args", [])]  # fmt: skip
        env = {"$(POD_IP)": pod["ip"], "$(POD_NAMESPACE)": NAMESPACE, "$(POD_NAME)": name}
        assert Path(pod["argv"][0]).name == Path(words[0]).name, name
        for want, ran in zip(words[1:], pod["argv"][1:], strict=True):
            for var, value in env.items():
                want = want.replace(var, value)
            mounted = want.partition("/etc/")[2]
            assert ran == want or (mounted and ran.endswith("/" + mounted.split("/", 1)[1])), (
                name,
                want,
                ran,
            )
    epp_args = pods["epp-0"]["argv"]
    assert f"--config-resource={NAMESPACE}/inference-gateway" in epp_args
    assert f"--host={pods['epp-0']['ip']}" in epp_args
    # Each pool's model is answered, every time, by a simulated server of that pool.
    for pool in config["pools"]:
        model = pool["models"][0]["name"]
        answers = result["answers"][model]
        assert [a[0] for a in answers] == [200] * len(answers), answers
        served = {a[1] for a in answers}
        assert served and all(pods[p]["deployment"] == f"modelsim-{pool['name']}" for p in served), served
    # The xDS server applied the rendered resource and said so in its status.
    (ready,) = result["status"]["conditions"]
    assert (ready["status"], ready["reason"], result["status"]["appliedGeneration"]) == ("True", "Applied", 1)
    # Each EPP replica follows its pool's pods and shares state with its peer through Valkey.
    pool_of_epp = {"epp" if i == 0 else f"epp-{p['name']}": p["name"] for i, p in enumerate(config["pools"])}
    assert {pods[name]["deployment"] for name in result["epps"]} == set(pool_of_epp)
    for name, view in result["epps"].items():
        pool_name = pool_of_epp[pods[name]["deployment"]]
        assert {pods[e["name"]]["deployment"] for e in view["endpoints"]} == {f"modelsim-{pool_name}"}, view
        shared = view["shared_state"]
        assert shared["connected"] and len(shared["peers"]) == 1, shared
