"""The reference EPP's command line, accepted alongside our own flags.

The Gateway API Inference Extension / llm-d router EPP (`cmd/epp/runner/options.go`) is
started as `epp --pool-name NAME --pool-namespace NS [--pool-group G] [--grpc-port 9002]
[--grpc-health-port 9003] [--metrics-port 9090] [--secure-serving] [--cert-path DIR]`, and
Helm charts, operators and gateways' docs pass those flags. With `--pool-name` this EPP:

- listens on every interface unless `--host` says otherwise, as the reference does;
- follows that InferencePool (list + watch, `epp/datalayer/discovery/kubernetes.py`), overriding the
  config's discovery for the pool; without `--config` it runs on a built-in configuration: one
  pool that accepts any model name (`acceptAnyModel`), as the reference EPP does;
- serves the gRPC health service on its own port (9003) under the names probes use;
- serves TLS by default like the reference (`--secure-serving=true`): the certificate from
  `--cert-path` (`tls.crt`, `tls.key`), else a self-signed one made at start;
- accepts the reference's tuning and diagnostics flags that have no meaning here, logging
  each as ignored rather than failing a drop-in deployment, in Go's spellings too
  (`-pool-name x`, `--v=4`).

Every behaviour adopted, with its source, is listed in docs/architecture.md ("Compatibility
with the reference EPP").
"""

from __future__ import annotations

import argparse
import datetime as dt
import ipaddress
import logging
import os
import re
import socket
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import yaml

from epp.app import KubernetesPool
from extproc.server import TlsFiles, tls_from_arguments
from gateway.config import ConfigError, load_config

log = logging.getLogger(__name__)

DEFAULT_HEALTH_PORT = 9003
POOL_VERSIONS = {"inference.networking.k8s.io": "v1", "inference.networking.x-k8s.io": "v1alpha2"}
# Reference flags with no meaning for this EPP (its scrape, metric names, tracing and logging
# are configured in the gateway config): accepted and logged as ignored.
IGNORED_VALUE_FLAGS = (
    "--config-file",
    "--config-text",
    "--zap-encoder",
    "--zap-log-level",
    "--v",
    "--model-server-metrics-scheme",
    "--model-server-metrics-path",
    "--model-server-metrics-port",
    "--refresh-metrics-interval",
    "--refresh-prometheus-metrics-interval",
    "--metrics-staleness-threshold",
    "--total-queued-requests-metric",
    "--total-running-requests-metric",
    "--kv-cache-usage-percentage-metric",
    "--lora-info-metric",
    "--cache-info-metric",
)
IGNORED_BOOL_FLAGS = (
    "--tracing",
    "--health-checking",
    "--enable-pprof",
    "--metrics-endpoint-auth",
    "--enable-cert-reload",
    "--model-server-metrics-https-insecure-skip-verify",
    "--ha-enable-leader-election",
)
_TRUE = {"1", "t", "true"}
_FALSE = {"0", "f", "false"}


def go_bool(value: str) -> bool:
    """A Go/pflag boolean (`--flag`, `--flag=false`)."""
    text = value.strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise argparse.ArgumentTypeError(f"not a boolean: {value!r}")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.set_defaults(host=None)  # resolve(): 127.0.0.1, or every interface with --pool-name
    ref = parser.add_argument_group("reference EPP contract (GIE / llm-d router)")
    ref.add_argument("--pool-name", help="InferencePool to follow (Kubernetes discovery)")
    ref.add_argument("--pool-namespace", help="its namespace (default: $NAMESPACE, else default)")
    ref.add_argument("--pool-group", default="inference.networking.k8s.io", choices=sorted(POOL_VERSIONS))
    ref.add_argument("--grpc-port", dest="port", type=int, help="alias of --port (ext_proc + health)")
    ref.add_argument(
        "--grpc-health-port",
        type=int,
        help=f"gRPC health alone on this port (default {DEFAULT_HEALTH_PORT} with --pool-name, else off)",
    )
    ref.add_argument(
        "--secure-serving",
        type=go_bool,
        nargs="?",
        const=True,
        help="serve TLS (default true with --pool-name, as the reference)",
    )
    ref.add_argument("--cert-path", type=Path, help="directory with tls.crt and tls.key")
    for flag in IGNORED_VALUE_FLAGS:
        ref.add_argument(flag, dest=_dest(flag), help=argparse.SUPPRESS)
    ref.add_argument("-v", dest="ignored_v", help=argparse.SUPPRESS)
    for flag in IGNORED_BOOL_FLAGS:
        ref.add_argument(flag, dest=_dest(flag), type=go_bool, nargs="?", const=True, help=argparse.SUPPRESS)
    test = parser.add_argument_group("conformance test mode (never in front of real traffic)")
    test.add_argument(
        "--conformance-test-mode",
        action="store_true",
        help="clients choose endpoints with the test-epp-endpoint-selection header (epp/requestcontrol/conformance_mode.py)",
    )
    test.add_argument(
        "--i-understand-clients-choose-endpoints",
        action="store_true",
        help="required with --conformance-test-mode",
    )


def _dest(flag: str) -> str:
    return "ignored_" + flag.lstrip("-").replace("-", "_")


def go_style(parser: argparse.ArgumentParser, argv: list[str]) -> list[str]:
    """The reference EPP parses with Go's `flag` package, which also takes long flags with one
    dash (`-pool-name x`, `-v=4`): rewrite those we know to argparse's `--` form."""
    known = {s for action in parser._actions for s in action.option_strings}
    out = []
    for arg in argv:
        name = arg.split("=", 1)[0]
        if name.startswith("-") and not name.startswith("--") and len(name) > 2 and f"-{name}" in known:
            arg = f"-{arg}"
        out.append(arg)
    return out


def parse(parser: argparse.ArgumentParser, argv: list[str] | None = None) -> argparse.Namespace:
    args = parser.parse_args(go_style(parser, sys.argv[1:] if argv is None else argv))
    if args.pool is None and args.pool_name is None:
        parser.error("give --pool (a pool of --config) or --pool-name (an InferencePool)")
    if args.pool is not None and args.config is None:
        parser.error("--pool names a pool of --config")
    if args.conformance_test_mode and not args.i_understand_clients_choose_endpoints:
        parser.error(
            "--conformance-test-mode lets every client choose its endpoint; "
            "add --i-understand-clients-choose-endpoints to start it anyway"
        )
    return args


@dataclass(frozen=True, slots=True)
class Launch:
    config_path: Path
    pool: str
    host: str
    tls: TlsFiles | None
    health_port: int | None
    kubernetes: KubernetesPool | None
    conformance_test_mode: bool


def resolve(args: argparse.Namespace) -> Launch:
    """Turn either command line into what EppApp takes; SystemExit with a reason if unusable."""
    for name, value in sorted(vars(args).items()):
        if name.startswith("ignored_") and value is not None:
            log.warning("--%s=%s is a reference EPP flag with no effect here; ignored", name[8:], value)
    kubernetes = None
    if args.pool_name is not None:
        namespace = args.pool_namespace or os.environ.get("NAMESPACE") or "default"
        kubernetes = KubernetesPool(
            namespace, args.pool_name, args.pool_group, POOL_VERSIONS[args.pool_group]
        )
    if args.config is not None:
        config_path = Path(args.config)
        pool = args.pool or _pool_for(config_path, kubernetes)
    else:
        assert kubernetes is not None  # parse() requires one of the two
        config_path, pool = _builtin_config(kubernetes)
    compat = kubernetes is not None
    health_port = args.grpc_health_port
    if health_port is None and compat:
        health_port = DEFAULT_HEALTH_PORT
    # The reference binds every interface (":9002"): kubelet probes and gateways dial the pod IP.
    host = args.host or ("0.0.0.0" if compat else "127.0.0.1")
    tls = _tls(args, compat)
    return Launch(config_path, pool, host, tls, health_port, kubernetes, args.conformance_test_mode)


def _pool_for(config_path: Path, kubernetes: KubernetesPool | None) -> str:
    """The config's pool for `--pool-name`: the one discovering it, else the one named so."""
    assert kubernetes is not None
    try:
        config = load_config(config_path)
    except (OSError, ConfigError) as exc:
        raise SystemExit(f"--config {config_path}: {exc}") from None
    for pool in config.pools:
        k = pool.kubernetes
        if k is not None and k.pool_name == kubernetes.pool_name and k.namespace == kubernetes.namespace:
            return pool.name
    for pool in config.pools:
        if pool.name == kubernetes.pool_name:
            return pool.name
    names = ", ".join(p.name for p in config.pools)
    raise SystemExit(
        f"--pool-name {kubernetes.pool_name}: no pool of {config_path} matches (pools: {names}); give --pool"
    )


def _builtin_config(kubernetes: KubernetesPool) -> tuple[Path, str]:
    """One pool following the InferencePool and accepting any model: the reference's behaviour."""
    name = re.sub(r"[^a-z0-9-]", "-", kubernetes.pool_name.lower()).strip("-") or "pool"
    data = {
        "pools": [
            {
                "name": name,
                "models": [{"name": kubernetes.pool_name}],
                "acceptAnyModel": True,
                "kubernetes": {"namespace": kubernetes.namespace, "poolName": kubernetes.pool_name},
            }
        ]
    }
    path = Path(tempfile.mkdtemp(prefix="epp-")) / "gateway.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path, name


def _tls(args: argparse.Namespace, compat: bool) -> TlsFiles | None:
    explicit = tls_from_arguments(args)
    if explicit is not None:
        return explicit
    if args.cert_path is not None:
        return TlsFiles(args.cert_path / "tls.crt", args.cert_path / "tls.key")
    secure = args.secure_serving if args.secure_serving is not None else compat
    if not secure:
        return None
    log.warning("--secure-serving without --cert-path: serving a self-signed certificate made now")
    return self_signed(Path(tempfile.mkdtemp(prefix="epp-tls-")))


def self_signed(directory: Path, *, days: int = 365) -> TlsFiles:
    """A self-signed serving certificate, as the reference EPP makes when given none (gateways
    dial the EPP with TLS but do not verify it)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "endpoint-picker")])
    now = dt.datetime.now(dt.UTC)
    sans: list[x509.GeneralName] = [x509.DNSName("localhost"), x509.DNSName(socket.gethostname())]
    sans.append(x509.IPAddress(ipaddress.ip_address("127.0.0.1")))
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / "tls.crt", directory / "tls.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    key_path.chmod(0o600)
    return TlsFiles(cert_path, key_path)
