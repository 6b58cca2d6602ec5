"""`python -m tools.deploy_configs`: write every generated file of deploy/ (and the example
bootstrap of envoy/) from deploy/base/config/gateway.yaml.

The pools' EPP objects and configurations (tools/deploy_pools.py), the Envoy bootstraps
(`DEPLOY_BOOTSTRAPS`, rendered by gateway/render_envoy.py with the arguments below, which each
file repeats in its first lines) and what Envoy and the xDS server mount by default
(`DEPLOY_XDS`). tests/k8s/test_manifests.py and tests/k8s/test_deploy_pools.py fail when a
committed file differs from what this makes.
"""

from __future__ import annotations

from pathlib import Path

from gateway.render_envoy import render_topology, render_yaml
from tools import deploy_pools

NAMESPACE = deploy_pools.NAMESPACE
_REPO = Path(__file__).resolve().parents[1]
_SVC = f"{NAMESPACE}.svc.cluster.local"
# In a cluster the listener must take the Service's traffic (0.0.0.0) and TLS terminates at the
# load balancer in front (deploy/overlays/eks-hyperpod/envoy-nlb.yaml), hence explicit plain HTTP.
_BASE_ARGS = [
    "--config", "deploy/base/config/gateway.yaml",
    "--listen", "0.0.0.0:8080",
    "--plain-http",
    "--bbr", f"bbr.{_SVC}:9004",
    # Every pool's EPP (tools/deploy_pools.py): `epp` for the first pool, `epp-<pool>` after.
    *deploy_pools.epp_arguments(_REPO),
    "--buffer-bytes", str(16 * 1024 * 1024),
]  # fmt: skip
# The readable example next to the Envoy docs: local services, HTTPS on loopback.
_EXAMPLE_ARGS = [
    "--config", "envoy/example-gateway.yaml",
    "--tls-cert", "/etc/gateway/tls/tls.crt",
    "--tls-key", "/etc/gateway/tls/tls.key",
    "--bbr", "127.0.0.1:9004",
    "--epp", "llama=127.0.0.1:9002",
    "--epp", "qwen=127.0.0.1:9003",
]  # fmt: skip
# (output, arguments): the bootstraps the kustomizations mount, and the example.
# mTLS to BBR/EPP is the default; overlays/dev alone is plaintext.
DEPLOY_BOOTSTRAPS: list[tuple[str, list[str]]] = [
    ("deploy/base/envoy/envoy.yaml", [*_BASE_ARGS, "--extproc-tls-dir", "/etc/envoy-tls"]),
    ("deploy/overlays/dev/envoy-plaintext-bootstrap.yaml", _BASE_ARGS),
    ("envoy/example-bootstrap.yaml", _EXAMPLE_ARGS),
]
# Where the xDS server (deploy/base/xds.yaml) listens, for Envoy's bootstrap.
XDS_SERVICE = f"xds.{_SVC}:18000"
# (bootstrap, topology, arguments): what Envoy and the xDS server of deploy/ mount by default;
# mTLS in the base (Envoy's client certificate for the xDS server too), plaintext in overlays/dev.
DEPLOY_XDS: list[tuple[str, str, list[str]]] = [
    (
        "deploy/base/envoy/envoy-xds.yaml",
        "deploy/base/xds/topology.json",
        [*_BASE_ARGS, "--extproc-tls-dir", "/etc/envoy-tls", "--xds", XDS_SERVICE],
    ),
    (
        "deploy/overlays/dev/envoy-xds-plaintext.yaml",
        "deploy/overlays/dev/topology-plaintext.json",
        [*_BASE_ARGS, "--xds", XDS_SERVICE],
    ),
]


def main() -> None:
    for out, render in deploy_pools.GENERATED:
        Path(out).write_text(render(Path(".")))
        print(f"wrote {out}")
    for out, argv in DEPLOY_BOOTSTRAPS:
        Path(out).write_text(render_yaml(argv))
        print(f"wrote {out}")
    for out, topology, argv in DEPLOY_XDS:
        Path(out).write_text(render_yaml(argv))
        Path(topology).parent.mkdir(parents=True, exist_ok=True)
        Path(topology).write_text(render_topology(argv))
        print(f"wrote {out} and {topology}")


if __name__ == "__main__":
    main()
