"""`python -m gateway.render_envoy`: write an Envoy bootstrap for a deployment.

The same renderer as `make run` and the tests (gateway/envoy/bootstrap.py), fed with a config
file and where the services live, so the Kubernetes bootstraps in deploy/ are generated, not
hand-written: `python -m gateway.render_envoy --deploy` rewrites them all, and a test fails
when a committed one differs from what the renderer makes of its configuration.

With `--xds HOST:PORT` it writes instead the bootstrap that points Envoy at the xDS server
(gateway/xds.py, over ADS; mTLS with `--extproc-tls-dir`) and, with `--topology-out`, the
topology that server renders the configuration with: where the listener and the ext_proc
services are. That is what deploy/ runs by default: Envoy then follows every change of the
InferenceGatewayConfig without a restart; the static bootstrap stays as the option for a
cluster that wants no xDS.
"""

from __future__ import annotations

import argparse
import json
import shlex
from pathlib import Path

import yaml

from gateway import deploy_pools
from gateway.config import GatewayConfig, load_config
from gateway.envoy.blocks import host_port_argument
from gateway.envoy.bootstrap import render_bootstrap
from gateway.envoy.topology import ExtProcTls, Topology
from gateway.envoy.xds_resources import topology_to_json, xds_bootstrap

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
    # Every pool's EPP (gateway/deploy_pools.py): `epp` for the first pool, `epp-<pool>` after.
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


def _pool_address(value: str) -> tuple[str, tuple[str, int]]:
    pool, sep, address = value.partition("=")
    if not sep:
        raise argparse.ArgumentTypeError(f"expected pool=host:port, got {value!r}")
    return pool, host_port_argument(address)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gateway.render_envoy", description=__doc__)
    p.add_argument("--config", type=Path, help="gateway configuration YAML")
    p.add_argument(
        "--listen",
        type=host_port_argument,
        default=("127.0.0.1", 8443),
        help="listener host:port (default loopback; 0.0.0.0 only where a Service must reach it)",
    )
    p.add_argument("--admin-port", type=int, default=9901, help="admin port (always on 127.0.0.1)")
    p.add_argument("--bbr", type=host_port_argument, help="BBR host:port (IP or DNS name)")
    p.add_argument(
        "--epp", type=_pool_address, action="append", default=[], help="pool=host:port, one per pool"
    )
    p.add_argument(
        "--single-hop",
        type=host_port_argument,
        metavar="HOST:PORT",
        help="single-hop mode: this one EPP (python -m epp.single_hop) serves every pool; no --bbr/--epp",
    )
    p.add_argument("--tls-cert", type=Path, help="listener certificate (HTTPS, the default)")
    p.add_argument("--tls-key", type=Path, help="its private key")
    p.add_argument(
        "--plain-http",
        action="store_true",
        help="plain HTTP listener, only when TLS terminates in front of Envoy (e.g. a load balancer)",
    )
    p.add_argument("--extproc-tls-dir", type=Path, help="mTLS to BBR/EPP: dir with tls.crt, tls.key, ca.crt")
    p.add_argument("--buffer-bytes", type=int, default=4 * 1024 * 1024, help="per-connection buffer limit")
    p.add_argument(
        "--xds",
        type=host_port_argument,
        metavar="HOST:PORT",
        help="the bootstrap pointing Envoy at this xDS server (python -m gateway.xds) instead of the static one",
    )
    p.add_argument("--topology-out", type=Path, help="with --xds: write the xDS server's --topology here")
    p.add_argument("--out", type=Path, help="output file (YAML)")
    p.add_argument("--deploy", action="store_true", help="regenerate every bootstrap under deploy/")
    return p


def render_yaml(argv: list[str]) -> str:
    """The bootstrap the arguments ask for (static, or with --xds the one pointing at it)."""
    args = parser().parse_args(argv)
    config, topo = _topology(args)
    if args.xds is not None:
        bootstrap = xds_bootstrap(topo.admin_port, args.xds, topo.extproc_tls)
    else:
        try:
            bootstrap = render_bootstrap(config, topo)
        except ValueError as exc:  # a topology the config cannot have (e.g. single-hop + FailOpen)
            raise SystemExit(str(exc)) from exc
    header = (
        "# Generated by gateway/render_envoy.py from the gateway configuration: do not edit by hand.\n"
        f"#   python -m gateway.render_envoy {shlex.join(argv)}\n"
    )
    return header + yaml.safe_dump(bootstrap, sort_keys=False, width=110)


def render_topology(argv: list[str]) -> str:
    """The xDS server's `--topology` for these arguments (JSON, with the command as `_generated`)."""
    _config, topo = _topology(parser().parse_args(argv))
    data = json.loads(topology_to_json(topo))
    return (
        json.dumps({"_generated": f"python -m gateway.render_envoy {shlex.join(argv)}", **data}, indent=1)
        + "\n"
    )


def _topology(args: argparse.Namespace) -> tuple[GatewayConfig, Topology]:
    if args.single_hop is not None and (args.bbr is not None or args.epp):
        raise SystemExit("--single-hop replaces --bbr and --epp")
    if args.config is None or (args.single_hop is None and (args.bbr is None or not args.epp)):
        raise SystemExit("--config and either --bbr with at least one --epp, or --single-hop, are required")
    config = load_config(args.config)
    has_tls = args.tls_cert is not None and args.tls_key is not None
    if args.plain_http == has_tls or (args.tls_cert is None) != (args.tls_key is None):
        raise SystemExit(
            "the listener is HTTPS: give --tls-cert and --tls-key, or --plain-http (and no certificate) "
            "when TLS terminates in front of Envoy"
        )
    tls = None
    if args.extproc_tls_dir is not None:
        d = args.extproc_tls_dir
        tls = ExtProcTls(d / "tls.crt", d / "tls.key", d / "ca.crt")
    topo = Topology(
        listen_host=args.listen[0],
        listen_port=args.listen[1],
        admin_port=args.admin_port,
        bbr=args.bbr,
        epps=dict.fromkeys((p.name for p in config.pools), args.single_hop)
        if args.single_hop
        else dict(args.epp),
        server_cert=args.tls_cert,
        server_key=args.tls_key,
        extproc_tls=tls,
        connection_buffer_bytes=args.buffer_bytes,
        single_hop=args.single_hop is not None,
    )
    return config, topo


def main() -> None:
    args = parser().parse_args()
    if args.deploy:
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
        return
    import sys

    text = render_yaml(sys.argv[1:])
    if args.topology_out:
        args.topology_out.write_text(render_topology(sys.argv[1:]))
    if args.out:
        args.out.write_text(text)
    else:
        print(text, end="")


if __name__ == "__main__":
    main()
