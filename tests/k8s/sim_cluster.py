"""A rendered install brought up on one machine, as far as it can be without a cluster.

Run inside a private network and mount namespace (`unshare --net --mount`, tests/k8s/
test_sim_install.py): there every pod has its own loopback IP and binds the ports the manifests
name, `/etc/hosts` (bind-mounted, this namespace only) answers each Service's names as the
cluster's DNS would, and the fake API server (tests/fakes/kube_apiserver.py) holds the rendered
InferencePools, InferenceGatewayConfig, InferenceObjectives and InferenceModelRewrites and the
pods, each Ready once its rendered readinessProbe passes (tests/k8s/kubelet_sim.py). The services
reach the API through a kubeconfig (KUBECONFIG, standing in for the service account).

Then requests go in at Envoy's pod (its Service's targetPort): a chat completion for each pool's
model must be answered by a pod of that pool, and the answers, the pods that served them, the
resource's status and each EPP's view are written to `--out` as JSON for the test to judge.

    python -m tests.k8s.sim_cluster --objects rendered.yaml --workdir DIR --out result.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

from tests.fakes.kube_apiserver import (
    GATEWAY_CONFIGS,
    INFERENCE_MODEL_REWRITES,
    INFERENCE_OBJECTIVES,
    INFERENCE_POOLS,
    PODS,
    FakeKubeApiServer,
    ResourceKind,
    write_kubeconfig,
)
from tests.k8s import kubelet_sim
from tests.k8s.kubelet_sim import Pod

Obj = dict[str, Any]
API_KINDS = {
    k.kind: k for k in (INFERENCE_POOLS, GATEWAY_CONFIGS, INFERENCE_OBJECTIVES, INFERENCE_MODEL_REWRITES)
}
# Start order: what the gateway's services need first (the store, the model servers), then the
# services, then Envoy. Within a step every pod starts at once.
ORDER = ("epp-state", "modelsim", "xds", "bbr", "epp", "envoy")
READY_TIMEOUT_S = 180.0
ANSWER_TIMEOUT_S = 90.0


def _step(pod: Pod) -> int:
    name = pod.deployment["metadata"]["name"]
    return next((i for i, prefix in enumerate(ORDER) if name.startswith(prefix)), len(ORDER))


def enter_cluster_network(objs: list[Obj], pods: list[Pod], workdir: Path) -> None:
    """Loopback up, and the Services' names in /etc/hosts (this mount namespace only)."""
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    hosts = workdir / "hosts"
    hosts.write_text(kubelet_sim.hosts_file(objs, pods))
    subprocess.run(["mount", "--bind", str(hosts), "/etc/hosts"], check=True)


def bring_up(kube: FakeKubeApiServer, objs: list[Obj], pods: list[Pod], workdir: Path) -> None:
    configmaps = {o["metadata"]["name"]: o for o in objs if o["kind"] == "ConfigMap"}
    env = {"KUBECONFIG": str(write_kubeconfig(workdir / "kubeconfig", kube.url)), "HOME": str(workdir)}
    for step in sorted({_step(p) for p in pods}):
        batch = [p for p in pods if _step(p) == step]
        for pod in batch:
            kube.apply(PODS, pod.as_api_object(ready=False))
            kubelet_sim.start(pod, configmaps, workdir / "pods", env)
        pending = list(batch)
        deadline = time.monotonic() + READY_TIMEOUT_S
        while pending:
            for pod in list(pending):
                assert pod.popen is not None
                if pod.popen.poll() is not None:
                    raise RuntimeError(f"pod {pod.name} exited {pod.popen.returncode}: {pod.argv}")
                if kubelet_sim.ready(pod):
                    kube.apply(PODS, pod.as_api_object(ready=True))
                    pending.remove(pod)
            if pending and time.monotonic() > deadline:
                raise RuntimeError(f"not Ready within {READY_TIMEOUT_S}s: {[p.name for p in pending]}")
            time.sleep(0.2)


def _served(envoy: Pod, model: str) -> tuple[int, str, str]:
    """One chat completion through Envoy: status, the pod that answered, the body's start."""
    response = httpx.post(
        f"http://{envoy.ip}:{_envoy_port(envoy)}/v1/chat/completions",
        json={"model": model, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4},
        timeout=30.0,
    )
    return response.status_code, response.headers.get("x-modelsim-pod", ""), response.text[:300]


def _envoy_port(envoy: Pod) -> int:
    return int(envoy.container["ports"][0]["containerPort"])


def ask(envoy: Pod, model: str, count: int) -> list[tuple[int, str, str]]:
    """Until the first answer (Envoy gets its routes over xDS, the EPP its pods over the API),
    then `count` more: what each got."""
    deadline = time.monotonic() + ANSWER_TIMEOUT_S
    while True:
        try:
            first = _served(envoy, model)
        except httpx.HTTPError as exc:
            first = (0, "", repr(exc))
        if first[0] == 200 or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    return [first, *(_served(envoy, model) for _ in range(count))]


def report(kube: FakeKubeApiServer, objs: list[Obj], pods: list[Pod]) -> Obj:
    envoy = next(p for p in pods if p.deployment["metadata"]["name"] == "envoy")
    config = next(o for o in objs if o["kind"] == "InferenceGatewayConfig")
    namespace = config["metadata"]["namespace"]
    answers = {
        model["name"]: ask(envoy, model["name"], 6)
        for pool in config["spec"]["pools"]
        for model in pool["models"][:1]
    }
    resource = kube.get(GATEWAY_CONFIGS, config["metadata"]["name"], namespace) or {}
    epps = {}
    for pod in pods:
        if pod.deployment["metadata"]["name"].startswith("epp") and pod.name[:9] != "epp-state":
            epps[pod.name] = httpx.get(
                f"http://{pod.ip}:{kubelet_sim.port(pod.container, 'metrics')}/debug/pool", timeout=5.0
            ).json()
    return {
        "pods": {
            p.name: {"ip": p.ip, "argv": p.argv, "deployment": p.deployment["metadata"]["name"]} for p in pods
        },
        "answers": answers,
        "status": resource.get("status", {}),
        "epps": epps,
    }


def run(objs: list[Obj], workdir: Path) -> Obj:
    namespace = next(o["metadata"]["namespace"] for o in objs if o["kind"] == "Deployment")
    pods = kubelet_sim.pods_of(objs, namespace)
    enter_cluster_network(objs, pods, workdir)
    with FakeKubeApiServer() as kube:
        for obj in objs:
            kind: ResourceKind | None = API_KINDS.get(obj["kind"])
            if kind is not None:
                kube.apply(kind, obj)
        try:
            bring_up(kube, objs, pods, workdir)
            return report(kube, objs, pods)
        except Exception as exc:
            return {
                "error": f"{type(exc).__name__}: {exc}",
                "logs": {p.name: kubelet_sim.log_tail(p) for p in pods},
            }
        finally:
            kubelet_sim.stop(pods)


def main() -> None:
    ap = argparse.ArgumentParser(prog="tests.k8s.sim_cluster", description=__doc__.split("\n")[0])
    ap.add_argument("--objects", type=Path, required=True, help="the rendered install (YAML stream)")
    ap.add_argument("--workdir", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    objs = [o for o in yaml.safe_load_all(args.objects.read_text()) if o]
    args.out.write_text(json.dumps(run(objs, args.workdir), indent=1))


if __name__ == "__main__":
    main()
