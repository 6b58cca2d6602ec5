"""`python -m gateway.render_envoy`: HTTPS on loopback unless told otherwise; the allow-list in
every committed rendering."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.config import API_PATHS
from gateway.render_envoy import render_yaml
from tools.deploy_configs import DEPLOY_BOOTSTRAPS

ROOT = Path(__file__).resolve().parents[2]
SERVICES = [
    "--config",
    "envoy/example-gateway.yaml",
    "--bbr",
    "127.0.0.1:9004",
    "--epp",
    "llama=127.0.0.1:9002",
]
TLS = ["--tls-cert", "/tls/tls.crt", "--tls-key", "/tls/tls.key"]


@pytest.fixture(autouse=True)
def _at_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)  # the recorded arguments are relative to the repository


def listener(argv: list[str]) -> dict[str, Any]:
    return yaml.safe_load(render_yaml(argv))["static_resources"]["listeners"][0]


def test_default_is_https_on_loopback() -> None:
    out = listener([*SERVICES, *TLS])
    assert out["name"] == "https" and "transport_socket" in out["filter_chains"][0]
    assert out["address"]["socket_address"] == {"address": "127.0.0.1", "port_value": 8443}


@pytest.mark.parametrize(
    "extra",
    [
        pytest.param([], id="no-certificate"),
        pytest.param(["--tls-cert", "/tls/tls.crt"], id="certificate-without-key"),
        pytest.param([*TLS, "--plain-http"], id="certificate-and-plain-http"),
    ],
)
def test_plain_http_only_when_explicitly_asked(extra: list[str]) -> None:
    with pytest.raises(SystemExit, match="--plain-http"):
        render_yaml([*SERVICES, *extra])


def test_explicit_plain_http() -> None:
    out = listener([*SERVICES, "--plain-http", "--listen", "0.0.0.0:8080"])
    assert out["name"] == "http" and "transport_socket" not in out["filter_chains"][0]
    assert out["address"]["socket_address"]["address"] == "0.0.0.0"


@pytest.mark.parametrize(("out", "argv"), DEPLOY_BOOTSTRAPS, ids=[o for o, _ in DEPLOY_BOOTSTRAPS])
def test_every_committed_rendering_serves_only_the_api(out: str, argv: list[str]) -> None:
    bootstrap = yaml.safe_load((ROOT / out).read_text())
    (lst,) = bootstrap["static_resources"]["listeners"]
    hcm = lst["filter_chains"][0]["filters"][0]["typed_config"]
    routes = hcm["route_config"]["virtual_hosts"][0]["routes"]
    assert hcm["normalize_path"] and hcm["merge_slashes"]
    for route in routes:
        if "route" in route:  # every route to a pool cluster matches exactly the API paths
            regex = re.compile(route["match"]["safe_regex"]["regex"])
            for path in API_PATHS:
                assert bool(regex.fullmatch(path)) == (path != "/v1/models"), (route["name"], path)
            for path in ("/sleep", "/v1/load_lora_adapter", "/v1/chat/completions/x", "/tokenize"):
                assert not regex.fullmatch(path)
    last = routes[-1]
    assert last["name"] == "path-not-served" and last["match"] == {"prefix": "/"}
    assert last["direct_response"]["status"] == 404
    assert {"gateway.bbr", "gateway.epp"} <= set(last["typed_per_filter_config"])
    # Only the in-cluster listeners, which a Service must reach, bind every address.
    address = lst["address"]["socket_address"]["address"]
    in_cluster = out.startswith("deploy/")
    assert address == ("0.0.0.0" if in_cluster else "127.0.0.1")
    assert ("transport_socket" in lst["filter_chains"][0]) != in_cluster


def test_single_hop_names_one_epp_for_every_pool(tmp_path: Path) -> None:
    config = yaml.safe_load((ROOT / "envoy/example-gateway.yaml").read_text())
    argv = ["--config", "envoy/example-gateway.yaml", "--single-hop", "127.0.0.1:9002", *TLS]
    with pytest.raises(SystemExit, match="cannot fail open"):  # the example has a FailOpen pool
        render_yaml(argv)
    for pool in config["pools"]:
        pool.pop("failureMode", None)
    (tmp_path / "gateway.yaml").write_text(yaml.safe_dump(config))
    argv[1] = str(tmp_path / "gateway.yaml")
    boot = yaml.safe_load(render_yaml(argv))
    hcm = boot["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    ext_procs = [f["name"] for f in hcm["http_filters"] if "ext_proc" in f["typed_config"]["@type"]]
    assert ext_procs == ["gateway.epp"]
    clusters = [c["name"] for c in boot["static_resources"]["clusters"] if not c["name"].startswith("pool-")]
    assert clusters == ["epp"]
    with pytest.raises(SystemExit, match="replaces --bbr"):
        render_yaml([*argv, "--bbr", "127.0.0.1:9004"])


def _grpc_services(node: Any) -> list[dict[str, Any]]:
    """Every `grpc_service` block in a rendered bootstrap (ext_proc filters and their per-route overrides)."""
    if isinstance(node, list):
        return [s for item in node for s in _grpc_services(item)]
    if not isinstance(node, dict):
        return []
    found = [node["grpc_service"]] if isinstance(node.get("grpc_service"), dict) else []
    return found + [s for key, value in node.items() if key != "grpc_service" for s in _grpc_services(value)]


@pytest.mark.parametrize("single_hop", [False, True], ids=["two-hop", "single-hop"])
def test_an_ext_proc_stream_that_cannot_reach_a_replica_opens_on_another(
    tmp_path: Path, single_hop: bool
) -> None:
    """A replica killed before Envoy's health check saw it refuses the next stream's
    connection: with several replicas Envoy retries the stream on another (a different host,
    nothing sent yet), so the request is not failed; one EPP has nowhere else to go."""
    config = yaml.safe_load((ROOT / "envoy/example-gateway.yaml").read_text())
    llama, qwen = config["pools"]
    llama["epp"]["replicas"] = 2
    argv = ["--config", str(tmp_path / "gateway.yaml"), *TLS]
    if single_hop:
        qwen.pop("failureMode")
        qwen["epp"] = llama["epp"]  # one EPP (two replicas) serves every pool
        argv += ["--single-hop", "127.0.0.1:9002"]
    else:
        argv += ["--bbr", "127.0.0.1:9004", "--epp", "llama=127.0.0.1:9002", "--epp", "qwen=127.0.0.1:9003"]
    (tmp_path / "gateway.yaml").write_text(yaml.safe_dump(config))
    services = _grpc_services(yaml.safe_load(render_yaml(argv))["static_resources"])
    by_cluster: dict[str, list[dict[str, Any]]] = {}
    for service in services:
        by_cluster.setdefault(service["envoy_grpc"]["cluster_name"], []).append(service)
    replicated = by_cluster["epp"] if single_hop else by_cluster["epp-llama"]
    for service in replicated:
        policy = service["retry_policy"]
        assert policy["retry_on"] == "connect-failure,refused-stream,reset-before-request"
        assert policy["num_retries"] == 1
        assert policy["retry_host_predicate"][0]["name"] == "envoy.retry_host_predicates.previous_hosts"
    if not single_hop:
        assert all("retry_policy" not in s for s in by_cluster["epp-qwen"] + by_cluster["bbr"])
