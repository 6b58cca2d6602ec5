"""Every command-line misuse a user can make ends with one line saying what is wrong and what
to do, and a non-zero exit status: never a traceback. Each case runs the real command."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

CONFIG = {"pools": [{"name": "p", "models": [{"name": "m"}], "endpoints": [{"address": "127.0.0.1:1"}]}]}
ROUTER_CONFIG = {"members": [{"name": "a", "address": "127.0.0.1:1"}]}


@pytest.fixture(scope="module")
def taken_port() -> Iterator[int]:
    """A port something already listens on."""
    with socket.create_server(("127.0.0.1", 0)) as sock:
        yield sock.getsockname()[1]


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("cli")
    config = root / "gateway.yaml"
    config.write_text(yaml.safe_dump(CONFIG))
    router = root / "router.yaml"
    router.write_text(yaml.safe_dump(ROUTER_CONFIG))
    bad_yaml = root / "bad.yaml"
    bad_yaml.write_text("pools: [unclosed\n")
    invalid = root / "invalid.yaml"
    invalid.write_text(yaml.safe_dump({**CONFIG, "profiles": {"default": {"weights": {"queue": -1}}}}))
    return {"config": config, "router": router, "bad_yaml": bad_yaml, "invalid": invalid, "root": root}


def run(argv: list[str], home: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KUBERNETES_")}  # not in a pod
    env.update(HOME=str(home), KUBECONFIG=str(home / "no-kubeconfig"))  # and no kubeconfig
    return subprocess.run(
        [sys.executable, "-m", *argv],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        stdin=subprocess.DEVNULL,
    )


def assert_one_line_error(result: subprocess.CompletedProcess[str], prog: str, *words: str) -> str:
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    assert "Traceback" not in output, output
    errors = [line for line in result.stderr.splitlines() if line.startswith(f"{prog}: error: ")]
    assert len(errors) == 1, output
    for word in words:
        assert word in errors[0], errors[0]
    return errors[0]


# (argv with {config}/{router}/{bad_yaml}/{invalid}/{port}/{root} placeholders, prog, words the line must have)
CASES = {
    "epp outside a cluster": (
        "epp --pool-name foo --grpc-port 0 --grpc-health-port 0 --metrics-port 0",
        "epp",
        ("no Kubernetes cluster", "KUBECONFIG"),
    ),
    "bbr outside a cluster": (
        "bbr --config {config} --port 0 --config-resource ns/gateway",
        "bbr",
        ("no Kubernetes cluster", "KUBECONFIG"),
    ),
    "bbr config missing": (
        "bbr --config {root}/absent.yaml",
        "bbr",
        ("cannot read", "absent.yaml", "--config"),
    ),
    "epp config missing": ("epp --config {root}/absent.yaml --pool p", "epp", ("cannot read", "--config")),
    "bbr config not yaml": ("bbr --config {bad_yaml}", "bbr", ("not valid YAML", "--config")),
    "epp config invalid": ("epp --config {invalid} --pool p", "epp", ("profiles.default.weights.queue",)),
    "epp pool unknown": (
        "epp --config {config} --pool q --port 0 --metrics-port 0",
        "epp",
        ("'q'", "--pool"),
    ),
    "bbr port in use": ("bbr --config {config} --port {port}", "bbr", ("already in use", "--port")),
    "epp port in use": ("epp --config {config} --pool p --port {port} --metrics-port 0", "epp", ("--port",)),
    "epp metrics port in use": (
        "epp --config {config} --pool p --port 0 --metrics-port {port}",
        "epp",
        ("already in use", "--metrics-port"),
    ),
    "bbr certificate missing": (
        "bbr --config {config} --port 0 --tls-cert {root}/absent.crt --tls-key {root}/absent.key",
        "bbr",
        ("cannot read", "absent", "PEM"),
    ),
    "epp certificate missing": (
        "epp --config {config} --pool p --port 0 --metrics-port 0 --cert-path {root}/no-certs",
        "epp",
        ("cannot read", "no-certs"),
    ),
    "global router config missing": (
        "globalrouter --config {root}/absent.yaml --port 0 --admin-port 0",
        "globalrouter",
        ("cannot read", "--config"),
    ),
    "global router port in use": (
        "globalrouter --config {router} --port 0 --admin-port {port}",
        "globalrouter",
        ("already in use", "--admin-port"),
    ),
    "make run port in use": ("devstack.run --port {port}", "devstack.run", ("already in use", "--port")),
    "make run fleet missing": (
        "devstack.run --port 0 --fleet {root}/absent.yaml",
        "devstack.run",
        ("--fleet",),
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_misuse_is_one_line_and_a_non_zero_exit(case: str, files: dict[str, Path], taken_port: int) -> None:
    template, prog, words = CASES[case]
    argv = template.format(port=taken_port, **files).split()
    assert_one_line_error(run(argv, files["root"]), prog, *words)
