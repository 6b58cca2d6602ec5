"""Lint and render a Helm chart with Helm's own library (helm-sdkpy), in a child process.

helm-sdkpy renders only inside an install (it has no dry run), and an install first asks a
cluster what it serves. So the child answers that itself: a loopback API server that serves
discovery for the kinds in `KINDS`, finds no object and accepts every create, with the release
kept in memory (HELM_DRIVER=memory). What Helm rendered is the release's manifest; the CRDs of
the chart's crds/ (applied, never templated) are taken from the creates. Running in a child
keeps the Go runtime out of the pytest process.

`render_chart(chart, requests, lint)` runs the child: it lints `chart` and each of `lint`, then
installs `chart` once per request ({"namespace", "values"}), and returns {"helm": version,
"lint": [Helm's lint result per chart], "renders": [{"manifest", "crds"} or {"error"}, ...]}.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

Obj = dict[str, Any]

# group/version -> [(kind, plural, namespaced)]: what the chart creates.
KINDS: dict[str, list[tuple[str, str, bool]]] = {
    "v1": [
        ("ConfigMap", "configmaps", True),
        ("Secret", "secrets", True),
        ("Service", "services", True),
        ("ServiceAccount", "serviceaccounts", True),
        ("Namespace", "namespaces", False),
    ],
    "apps/v1": [("Deployment", "deployments", True)],
    "policy/v1": [("PodDisruptionBudget", "poddisruptionbudgets", True)],
    "rbac.authorization.k8s.io/v1": [("Role", "roles", True), ("RoleBinding", "rolebindings", True)],
    "networking.k8s.io/v1": [("NetworkPolicy", "networkpolicies", True)],
    "apiextensions.k8s.io/v1": [("CustomResourceDefinition", "customresourcedefinitions", False)],
    "cert-manager.io/v1": [("Certificate", "certificates", True), ("Issuer", "issuers", True)],
    "monitoring.coreos.com/v1": [("ServiceMonitor", "servicemonitors", True)],
    "gateway.inference.dev/v1alpha1": [("InferenceGatewayConfig", "inferencegatewayconfigs", True)],
    "inference.networking.k8s.io/v1": [("InferencePool", "inferencepools", True)],
}
HELM_HOMES = ("HELM_CACHE_HOME", "HELM_CONFIG_HOME", "HELM_DATA_HOME")
VERBS = ["create", "delete", "get", "list", "patch", "update", "watch"]


def _discovery(path: str) -> Obj | None:
    if path == "/version":
        return {"major": "1", "minor": "34", "gitVersion": "v1.34.0", "platform": "linux/amd64"}
    if path == "/api":
        return {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []}
    if path == "/apis":
        groups = [
            {"name": gv.split("/")[0], "versions": [{"groupVersion": gv, "version": gv.split("/")[1]}]}
            for gv in KINDS
            if gv != "v1"
        ]
        for group in groups:
            group["preferredVersion"] = group["versions"][0]
        return {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}
    gv = path.removeprefix("/api/").removeprefix("/apis/")
    if path.startswith(("/api/", "/apis/")) and gv in KINDS:
        resources = [
            {"name": plural, "singularName": kind.lower(), "namespaced": ns, "kind": kind, "verbs": VERBS}
            for kind, plural, ns in KINDS[gv]
        ]
        return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources}
    return None


class _Api(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    created: list[Obj] = []

    def _send(self, code: int, body: Obj) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        found = _discovery(self.path.split("?", 1)[0])
        if found is not None:
            self._send(200, found)
        else:
            self._send(
                404,
                {
                    "kind": "Status",
                    "apiVersion": "v1",
                    "status": "Failure",
                    "reason": "NotFound",
                    "code": 404,
                },
            )

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        obj = json.loads(body)
        self.created.append(obj)
        self._send(201, obj)

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass


def _render(helm: Any, kubeconfig: str, chart: str, namespace: str, values: Obj) -> Obj:
    _Api.created = []
    config = helm.Configuration(namespace=namespace, kubeconfig=kubeconfig)
    try:
        release = asyncio.run(helm.Install(config).run("inference-gateway", chart, values=values, wait=False))
    except helm.HelmError as err:
        return {"error": str(err)}
    crds = [o for o in _Api.created if o.get("kind") == "CustomResourceDefinition"]
    return {"manifest": release["manifest"], "crds": crds}


def render_chart(chart: Path, requests: list[Obj], lint: tuple[Path, ...] = (), timeout: float = 300) -> Obj:
    """Lint `chart` and install it once per request, in a child process (see the module doc)."""
    with tempfile.TemporaryDirectory() as home:
        # Helm's Go runtime reads the environment the process started with: set it for the child.
        env = {**os.environ, "HELM_DRIVER": "memory"}
        env.update({var: os.path.join(home, var.lower()) for var in HELM_HOMES})
        out = subprocess.run(
            [sys.executable, "-m", "tests.k8s.helm_render", str(chart), *map(str, lint)],
            input=json.dumps(requests),
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
            cwd=Path(__file__).resolve().parents[2],
        )
    if out.returncode != 0:
        raise RuntimeError(f"helm_render failed ({out.returncode}): {out.stderr[-3000:]}")
    result: Obj = json.loads(out.stdout)
    return result


def main() -> None:
    chart, *others = (str(Path(arg).resolve()) for arg in sys.argv[1:])
    requests = json.load(sys.stdin)
    if os.environ.get("HELM_DRIVER") != "memory":
        sys.exit("run through render_chart(): Helm must keep the release in memory (HELM_DRIVER=memory)")
    import helm_sdkpy as helm

    server = ThreadingHTTPServer(("127.0.0.1", 0), _Api)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    with tempfile.TemporaryDirectory() as tmp:
        kubeconfig = os.path.join(tmp, "kubeconfig")
        Path(kubeconfig).write_text(
            json.dumps(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [
                        {"name": "c", "cluster": {"server": f"http://127.0.0.1:{server.server_port}"}}
                    ],
                    "users": [{"name": "u", "user": {"token": "t"}}],
                    "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
                    "current-context": "c",
                }
            )
        )
        linter = helm.Lint(helm.Configuration(kubeconfig=kubeconfig))
        lint = [asyncio.run(linter.run(path)) for path in (chart, *others)]
        renders = [_render(helm, kubeconfig, chart, r["namespace"], r.get("values") or {}) for r in requests]
    server.shutdown()
    json.dump({"helm": helm.get_version(), "lint": lint, "renders": renders}, sys.stdout)


if __name__ == "__main__":
    main()
