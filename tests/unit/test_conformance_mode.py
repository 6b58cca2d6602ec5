"""The reference EPP's command line (epp/reference_flags.py) and the conformance test picker
(epp/requestcontrol/conformance_mode.py): defaults, the explicit opt-in, and what the picker lets through."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from epp import reference_flags
from epp.datalayer.endpoint_records import Endpoint, PoolSnapshot
from epp.datalayer.pool import Pool
from epp.requestcontrol import conformance_mode
from gateway.config import load_config
from gateway.service_cli import service_parser


def parser() -> argparse.ArgumentParser:
    p = service_parser("epp", "test", default_port=9002, config_required=False)
    p.add_argument("--pool")
    p.add_argument("--metrics-port", type=int, default=9090)
    reference_flags.add_arguments(p)
    return p


def test_reference_defaults_ports_tls_and_builtin_config() -> None:
    args = reference_flags.parse(parser(), ["--pool-name", "vllm-llama3-8b", "--pool-namespace", "team-a"])
    launch = reference_flags.resolve(args)
    assert (args.port, args.metrics_port, launch.health_port) == (9002, 9090, 9003)
    assert launch.host == "0.0.0.0"  # the reference listens on every interface
    assert launch.kubernetes is not None and launch.kubernetes.namespace == "team-a"
    assert (launch.kubernetes.group, launch.kubernetes.version) == ("inference.networking.k8s.io", "v1")
    assert launch.tls is not None and launch.tls.cert.exists()  # self-signed, as the reference
    pool = load_config(launch.config_path).pool(launch.pool)
    assert (
        pool.accept_any_model
        and pool.kubernetes is not None
        and pool.kubernetes.pool_name == "vllm-llama3-8b"
    )
    assert not launch.conformance_test_mode


def test_reference_flags_it_cannot_honour_are_accepted_and_ignored() -> None:
    argv = ["--pool-name", "p", "--grpc-port=9102", "--v=4", "--zap-encoder", "json", "--tracing=false"]
    argv += ["--secure-serving=false", "--config-file", "/config/default-plugins.yaml", "-v", "3"]
    launch = reference_flags.resolve(args := reference_flags.parse(parser(), argv))
    assert args.port == 9102 and launch.tls is None


def test_go_style_single_dash_long_flags() -> None:
    args = reference_flags.parse(
        parser(), ["-pool-name", "p", "-pool-namespace=ns", "-grpc-port", "9102", "-v", "2"]
    )
    assert (args.pool_name, args.pool_namespace, args.port) == ("p", "ns", 9102)


def test_our_own_command_line_is_unchanged(tmp_path: Path) -> None:
    config = tmp_path / "gateway.yaml"
    config.write_text(
        "pools: [{name: llama, models: [{name: llama}], endpoints: [{address: '127.0.0.1:1'}]}]\n"
    )
    launch = reference_flags.resolve(
        reference_flags.parse(parser(), ["--config", str(config), "--pool", "llama"])
    )
    assert launch.health_port is None and launch.tls is None and launch.kubernetes is None
    assert launch.host == "127.0.0.1"


def test_pool_name_with_config_picks_the_pool_that_discovers_it(tmp_path: Path) -> None:
    config = tmp_path / "gateway.yaml"
    config.write_text(
        "pools: [{name: llama, models: [{name: m}], kubernetes: {namespace: ns, poolName: llama-pool}}]\n"
    )
    argv = [
        "--config",
        str(config),
        "--pool-name",
        "llama-pool",
        "--pool-namespace",
        "ns",
        "--secure-serving=0",
    ]
    assert reference_flags.resolve(reference_flags.parse(parser(), argv)).pool == "llama"


@pytest.mark.parametrize(
    "argv",
    [
        [],  # neither --pool nor --pool-name
        ["--pool-name", "p", "--conformance-test-mode"],  # test mode without the explicit opt-in
        ["--pool", "p"],  # --pool without --config
        ["--pool-name", "p", "--secure-serving=maybe"],
    ],
)
def test_refused_command_lines(argv: list[str]) -> None:
    with pytest.raises(SystemExit):
        reference_flags.parse(parser(), argv)


def _snapshot(*addresses: str) -> PoolSnapshot:
    pool = Pool()
    pool.set_endpoints([Endpoint(address=a, models=frozenset({"m"})) for a in addresses])
    return pool.snapshot()


def test_picker_restricts_to_named_ip_or_ip_port() -> None:
    snap = _snapshot("10.0.0.1:3000", "10.0.0.1:3002", "10.0.0.2:3000", "[fd00::1]:3000")

    def kept(value: str) -> list[str]:
        return [
            e.address
            for e in conformance_mode.restrict({conformance_mode.SELECTION_HEADER: value}, snap).endpoints
        ]

    assert kept("10.0.0.1") == ["10.0.0.1:3000", "10.0.0.1:3002"]  # a bare IP: every rank
    assert kept("10.0.0.2:3000, 10.0.0.1:3002") == ["10.0.0.1:3002", "10.0.0.2:3000"]
    assert kept("fd00::1") == ["[fd00::1]:3000"] and kept("[fd00::1]:3000") == ["[fd00::1]:3000"]
    assert kept("192.168.0.9") == []  # nothing of this pool: the EPP answers 503
    assert conformance_mode.restrict({}, snap) is snap
