"""deploy/components/pd-disaggregation over the example pool: prefill and decode Deployments in
the pool with llm-d's role label, the sidecar on the pool's target port in front of vLLM,
read-only RBAC for its pod watch, and every object valid."""

from __future__ import annotations

import copy
from pathlib import Path

import kubernetes_validate
import yaml

from tests.k8s.kustomize_lite import build

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


def render(tmp_path: Path) -> list[dict]:
    (tmp_path / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "resources": [str(DEPLOY / "examples")],
                "components": [str(DEPLOY / "components/pd-disaggregation")],
            }
        )
    )
    return build(tmp_path)


def test_the_component_splits_the_example_pool(tmp_path: Path) -> None:
    objs = render(tmp_path)
    deployments = {o["metadata"]["name"]: o for o in objs if o["kind"] == "Deployment"}
    assert "vllm-llama-3-8b" not in deployments  # the aggregated one is replaced
    pool = next(o for o in objs if o["kind"] == "InferencePool")
    selector, port = pool["spec"]["selector"]["matchLabels"], pool["spec"]["targetPorts"][0]["number"]
    roles = {}
    for name in ("vllm-llama-3-8b-prefill", "vllm-llama-3-8b-decode"):
        template = deployments[name]["spec"]["template"]
        labels = template["metadata"]["labels"]
        assert selector.items() <= labels.items()  # in the pool
        roles[name] = labels["llm-d.ai/role"]
        for c in template["spec"]["containers"]:
            if c["name"] == "vllm":
                assert any("NixlConnector" in a for a in c["args"])
    assert roles == {"vllm-llama-3-8b-prefill": "prefill", "vllm-llama-3-8b-decode": "decode"}

    decode = deployments["vllm-llama-3-8b-decode"]["spec"]["template"]["spec"]
    sidecar, vllm = (next(c for c in decode["containers"] if c["name"] == n) for n in ("pd-sidecar", "vllm"))
    assert sidecar["ports"][0]["containerPort"] == port  # the pool routes to the sidecar
    assert f"--port={port}" in sidecar["args"] and "--decoder=http://127.0.0.1:8200" in sidecar["args"]
    assert "--port=8200" in vllm["args"]
    allow = next(a for a in sidecar["args"] if a.startswith("--allow-pods="))
    assert "llm-d.ai/role=prefill" in allow and all(f"{k}={v}" in allow for k, v in selector.items())

    role = next(o for o in objs if o["kind"] == "Role" and o["metadata"]["name"] == "pd-sidecar")
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]
    assert decode["serviceAccountName"] == "pd-sidecar"


def test_its_objects_validate(tmp_path: Path) -> None:
    version = kubernetes_validate.latest_version()
    for obj in render(tmp_path):
        if obj["kind"] in ("Deployment", "ServiceAccount", "Role", "RoleBinding"):
            kubernetes_validate.validate(copy.deepcopy(obj), version, strict=True)
