"""The rendered bootstrap is accepted by the real Envoy binary."""

from __future__ import annotations

import dataclasses
import json
import subprocess
from pathlib import Path

import pytest
from google.protobuf import json_format

from devstack.certs import make_certs
from devstack.launch import envoy_binary
from gateway.config import parse_config
from gateway.envoy.bootstrap import render_bootstrap, write_bootstrap
from gateway.envoy.topology import ExtProcTls, Topology
from gateway.envoy.xds_resources import xds_bootstrap

CONFIG = {
    "pools": [
        {
            "name": "llama",
            "models": [{"name": "llama", "adapters": ["sql"]}],
            "endpoints": [{"address": "127.0.0.1:8000"}],
        },
        {
            "name": "qwen",
            "failureMode": "FailOpen",
            "models": [{"name": "qwen"}],
            "endpoints": [{"address": "127.0.0.1:8001"}],
        },
    ]
}


def _envoy_validate(path: Path) -> subprocess.CompletedProcess[str]:
    """Envoy's own `--mode validate` of a rendered bootstrap; fails the test on a non-zero exit."""
    result = subprocess.run(
        [envoy_binary(), "--mode", "validate", "-c", str(path), "--use-dynamic-base-id"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    return result


def _topology(tmp: Path, mtls: bool) -> Topology:
    certs = make_certs(tmp / "certs")
    return Topology(
        listen_port=18443,
        admin_port=19901,
        bbr=("127.0.0.1", 19004),
        epps={"llama": ("127.0.0.1", 19002), "qwen": ("127.0.0.1", 19003)},
        server_cert=certs.server_cert,
        server_key=certs.server_key,
        extproc_tls=ExtProcTls(certs.client_cert, certs.client_key, certs.ca) if mtls else None,
    )


@pytest.mark.parametrize("mtls", [False, True])
def test_envoy_validates_rendered_bootstrap(tmp_path: Path, mtls: bool) -> None:
    path = write_bootstrap(parse_config(CONFIG), _topology(tmp_path, mtls), tmp_path / "envoy.json")
    result = _envoy_validate(path)
    assert "OK" in result.stdout + result.stderr


def test_destination_comes_from_metadata_never_the_header(tmp_path: Path) -> None:
    boot = render_bootstrap(parse_config(CONFIG), _topology(tmp_path, False))
    clusters = {c["name"]: c for c in boot["static_resources"]["clusters"]}
    # Static pools: OverrideHost over the pool's own pods, host taken from `envoy.lb` metadata only.
    policy = clusters["pool-llama"]["load_balancing_policy"]["policies"][0]["typed_extension_config"]
    sources = policy["typed_config"]["override_host_sources"]
    assert sources == [{"metadata": {"key": "envoy.lb", "path": [{"key": "x-gateway-destination-endpoint"}]}}]
    assert "original_dst_lb_config" not in clusters["pool-llama"]
    # FailOpen pools get a fallback cluster over the pool's own endpoints only.
    fallback = clusters["fallback-qwen"]["load_assignment"]["endpoints"][0]["lb_endpoints"]
    assert [e["endpoint"]["address"]["socket_address"]["port_value"] for e in fallback] == [8001]
    assert "fallback-llama" not in clusters


def test_misspelt_field_is_rejected_at_render_time() -> None:
    from gateway.envoy.blocks import validate_bootstrap

    with pytest.raises(json_format.ParseError):
        validate_bootstrap({"static_resources": {"clusterz": []}})


def test_original_dst_pools_render_like_kubernetes_pools(tmp_path: Path) -> None:
    """The local stand-in for Kubernetes pools: ORIGINAL_DST from metadata only, no retries."""
    topo = dataclasses.replace(_topology(tmp_path, False), original_dst_pools=frozenset({"llama"}))
    boot = render_bootstrap(parse_config(CONFIG), topo)
    clusters = {c["name"]: c for c in boot["static_resources"]["clusters"]}
    llama = clusters["pool-llama"]
    assert (llama["type"], llama["lb_policy"]) == ("ORIGINAL_DST", "CLUSTER_PROVIDED")
    # `use_http_header` is false, the default (left out): the client's header is never read.
    assert llama["original_dst_lb_config"] == {
        "metadata_key": {"key": "envoy.lb", "path": [{"key": "x-gateway-destination-endpoint"}]},
    }
    assert "load_balancing_policy" in clusters["pool-qwen"]  # only the named pools change kind
    routes = boot["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    picked = {r["name"]: r for r in routes["route_config"]["virtual_hosts"][0]["routes"]}
    assert "retry_policy" not in picked["llama-picked"]["route"]  # one address: nothing to retry on
    assert "retry_policy" in picked["qwen-picked"]["route"]


def test_retries_move_before_the_response_started_within_a_budget(tmp_path: Path) -> None:
    """docs/scheduling.md, "Retries": a picked pod that refuses, resets or answers 503 before
    its response started is retried (twice at most) on another host; the FailOpen fallback
    cluster retries the same way; every pool cluster bounds concurrent retries by a budget."""
    kube = {"name": "kube", "models": [{"name": "kube"}], "kubernetes": {"poolName": "kube"}}
    topo = _topology(tmp_path, False)
    topo = dataclasses.replace(topo, epps={**topo.epps, "kube": ("127.0.0.1", 19005)})
    boot = render_bootstrap(parse_config({"pools": [*CONFIG["pools"], kube]}), topo)
    hcm = boot["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    routes = {
        r["name"]: r["route"] for r in hcm["route_config"]["virtual_hosts"][0]["routes"] if "route" in r
    }
    for name in ("llama-picked", "qwen-picked", "qwen-pick"):  # the EPP's pick, the FailOpen fallback
        policy = routes[name]["retry_policy"]
        assert policy["retry_on"] == "connect-failure,refused-stream,reset,retriable-status-codes", name
        assert (policy["retriable_status_codes"], policy["num_retries"]) == ([503], 2)
        assert policy["retry_host_predicate"][0]["name"] == "envoy.retry_host_predicates.previous_hosts"
    # FailClose never reaches the `-pick` cluster; ORIGINAL_DST has one address to try.
    assert "retry_policy" not in routes["llama-pick"] and "retry_policy" not in routes["kube-picked"]
    clusters = {c["name"]: c for c in boot["static_resources"]["clusters"]}
    for name in ("pool-llama", "pool-qwen", "fallback-qwen", "pool-kube"):
        budget = clusters[name]["circuit_breakers"]["thresholds"][0]["retry_budget"]
        assert budget == {"budget_percent": {"value": 20.0}, "min_retry_concurrency": 16}, name
    assert "retry_budget" not in clusters["epp-llama"]["circuit_breakers"]["thresholds"][0]


def test_original_dst_rendering_refuses_what_it_cannot_do(tmp_path: Path) -> None:
    topo = _topology(tmp_path, False)
    with pytest.raises(ValueError, match="no such pool: mistral"):
        render_bootstrap(
            parse_config(CONFIG), dataclasses.replace(topo, original_dst_pools=frozenset({"mistral"}))
        )
    ranked = {"pools": [{**CONFIG["pools"][0], "fallbackEndpoints": 1}]}
    with pytest.raises(ValueError, match="fallbackEndpoints"):
        render_bootstrap(
            parse_config(ranked),
            dataclasses.replace(
                topo, original_dst_pools=frozenset({"llama"}), epps={"llama": ("127.0.0.1", 1)}
            ),
        )


def epp_processing_modes(boot: dict) -> tuple[dict, dict[str, dict]]:
    """The EPP filter's default processing mode and each pool route's override of it."""
    hcm = boot["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    default = next(f for f in hcm["http_filters"] if f["name"] == "gateway.epp")["typed_config"]
    routes = hcm["route_config"]["virtual_hosts"][0]["routes"]
    picks = {
        r["name"]: r["typed_per_filter_config"]["gateway.epp"]["overrides"]["processing_mode"]
        for r in routes
        if r["name"].endswith("-pick")
    }
    return default["processing_mode"], picks


def test_pool_routes_keep_the_epp_stream_until_the_response_ends(tmp_path: Path) -> None:
    """Response trailers asked for: Envoy keeps the stream (the EPP's in-flight slot) until the
    HTTP stream ends, on every pool kind. tests/integration/test_inflight.py shows the effect."""
    kube = {"name": "kube", "models": [{"name": "kube"}], "kubernetes": {"poolName": "kube"}}
    config = parse_config({"pools": [*CONFIG["pools"], kube]})
    topo = _topology(tmp_path, False)
    topo = dataclasses.replace(topo, epps={**topo.epps, "kube": ("127.0.0.1", 19005)})
    boot = render_bootstrap(config, topo)
    clusters = {c["name"]: c for c in boot["static_resources"]["clusters"]}
    assert (
        clusters["pool-kube"]["type"] == "ORIGINAL_DST" and "load_balancing_policy" in clusters["pool-llama"]
    )
    default, picks = epp_processing_modes(boot)
    assert set(picks) == {"llama-pick", "qwen-pick", "kube-pick"}  # static, FailOpen (BUFFERED), ORIGINAL_DST
    for mode in picks.values():
        # Trailers hold the stream; the headers event only where a feature reads it (below).
        assert (mode["response_header_mode"], mode["response_trailer_mode"]) == ("SKIP", "SEND"), mode
        # NONE, the default (left out): a message per SSE chunk would cost ~2.5x the CPU.
        assert "response_body_mode" not in mode
    # The decision header, trusted callers and retries over fallback endpoints read the response
    # headers (the status, the served endpoint): then the pool routes ask for them too.
    for listener, pools in (
        ({"trust": {"decisionHeader": True}}, CONFIG["pools"]),
        ({"eppResponseHeaders": "always"}, CONFIG["pools"]),
        ({}, [{**CONFIG["pools"][0], "fallbackEndpoints": 1}]),
    ):
        _, picks = epp_processing_modes(
            render_bootstrap(parse_config({"pools": pools, "listener": listener}), topo)
        )
        assert picks and all(m["response_header_mode"] == "SEND" for m in picks.values()), listener
    # Outside pool routes nothing is accounted and Envoy's own replies are not held.
    assert default["response_header_mode"] == default["response_trailer_mode"] == "SKIP"
    # One held stream per in-flight request: Envoy's default cap of 1,024 must not apply.
    for pool in ("llama", "qwen", "kube"):
        assert clusters[f"epp-{pool}"]["circuit_breakers"]["thresholds"][0]["max_requests"] >= 100_000


@pytest.mark.parametrize("body_mode", ["streamed", "buffered"])
def test_request_body_mode_reaches_every_ext_proc_filter(tmp_path: Path, body_mode: str) -> None:
    """`listener.requestBodyMode` sets BBR's and every pool EPP's request body mode (a FailOpen
    pool buffers regardless); `maxBufferedBodyBytes` becomes the listener's buffer limit, past
    which Envoy answers 413 (tests/integration/test_request_path.py sends one)."""
    listener: dict[str, object] = {"requestBodyMode": body_mode}
    if body_mode == "buffered":
        listener["maxBufferedBodyBytes"] = 2 * 1024 * 1024
    config = parse_config({**CONFIG, "listener": listener})
    path = write_bootstrap(config, _topology(tmp_path, False), tmp_path / "envoy.json")
    boot = render_bootstrap(config, _topology(tmp_path, False))
    hcm = boot["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    bbr = next(f for f in hcm["http_filters"] if f["name"] == "gateway.bbr")["typed_config"]
    default, picks = epp_processing_modes(boot)
    body = "BUFFERED" if body_mode == "buffered" else "FULL_DUPLEX_STREAMED"
    assert bbr["processing_mode"]["request_body_mode"] == default["request_body_mode"] == body
    assert picks["llama-pick"]["request_body_mode"] == body
    assert picks["qwen-pick"]["request_body_mode"] == "BUFFERED"  # FailOpen
    for mode in (bbr["processing_mode"], default, *picks.values()):
        # Trailers are streamed-only: a buffered body comes whole, in one message.
        assert mode["request_trailer_mode"] == ("SKIP" if mode["request_body_mode"] == "BUFFERED" else "SEND")
    limit = boot["static_resources"]["listeners"][0]["per_connection_buffer_limit_bytes"]
    assert limit == (2 * 1024 * 1024 if body_mode == "buffered" else 4 * 1024 * 1024)
    _envoy_validate(path)


def _single_hop(tmp: Path, config: dict) -> tuple[dict, Path]:
    topo = dataclasses.replace(
        _topology(tmp, False),
        bbr=None,
        epps=dict.fromkeys((p["name"] for p in config["pools"]), ("127.0.0.1", 19002)),
        single_hop=True,
    )
    path = write_bootstrap(parse_config(config), topo, tmp / "envoy.json")
    return render_bootstrap(parse_config(config), topo), path


def test_single_hop_renders_one_ext_proc_filter_held_to_the_response_end(tmp_path: Path) -> None:
    """One ext_proc filter to one EPP cluster; the entry route (no model header yet) asks for
    response trailers (the headers too only where a feature reads them), since Envoy reads the filter's per-route settings there,
    before the EPP's reply re-routes the request to the pool's `-picked` route."""
    config = {"pools": [CONFIG["pools"][0], {**CONFIG["pools"][1], "failureMode": "FailClose"}]}
    boot, path = _single_hop(tmp_path, config)
    hcm = boot["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    ext_procs = [f for f in hcm["http_filters"] if "ext_proc" in f["typed_config"]["@type"]]
    assert [f["name"] for f in ext_procs] == ["gateway.epp"]
    assert ext_procs[0]["typed_config"]["grpc_service"]["envoy_grpc"]["cluster_name"] == "epp"
    clusters = {c["name"] for c in boot["static_resources"]["clusters"]}
    assert {"epp", "pool-llama", "pool-qwen"} == clusters
    routes = {r["name"]: r for r in hcm["route_config"]["virtual_hosts"][0]["routes"]}
    assert not [name for name in routes if name.endswith("-pick")]
    # A forged model + destination header matches `-picked` until the strip filter ran: the same.
    for name in ("no-route", "llama-picked", "qwen-picked"):
        entry = routes[name]["typed_per_filter_config"]["gateway.epp"]["overrides"]["processing_mode"]
        assert (entry["response_header_mode"], entry["response_trailer_mode"]) == ("SKIP", "SEND"), name
        assert entry["request_body_mode"] == "FULL_DUPLEX_STREAMED"
    default, _ = epp_processing_modes(boot)
    assert default["response_header_mode"] == "SKIP"  # Envoy's own replies are not held
    for name in ("models-list", "path-not-served"):
        assert routes[name]["typed_per_filter_config"]["gateway.epp"]["disabled"] is True
    _envoy_validate(path)


def test_single_hop_refuses_fail_open_and_several_epps(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="cannot fail open"):
        _single_hop(tmp_path, CONFIG)
    topo = dataclasses.replace(_topology(tmp_path, False), bbr=None, single_hop=True)
    with pytest.raises(ValueError, match="same EPP"):
        render_bootstrap(
            parse_config({"pools": [CONFIG["pools"][0], {**CONFIG["pools"][1], "failureMode": "FailClose"}]}),
            topo,
        )


@pytest.mark.parametrize("mtls", [False, True])
def test_envoy_validates_the_xds_bootstrap(tmp_path: Path, mtls: bool) -> None:
    """The bootstrap `make run` gives Envoy: admin plus the xDS cluster (gateway/xds.py)."""
    topo = _topology(tmp_path, mtls)
    path = tmp_path / "envoy-xds.json"
    path.write_text(json.dumps(xds_bootstrap(topo.admin_port, ("127.0.0.1", 18000), topo.extproc_tls)))
    _envoy_validate(path)
