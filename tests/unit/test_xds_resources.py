"""What the xDS server sends Envoy: the static renderer's output, cut into typed resources."""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path
from typing import Any

import pytest
from envoy.config.bootstrap.v3 import bootstrap_pb2
from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.listener.v3 import listener_pb2
from envoy.config.route.v3 import route_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import http_connection_manager_pb2
from google.protobuf import json_format

from gateway.config import parse_config
from gateway.envoy.blocks import register_types
from gateway.envoy.bootstrap import render_bootstrap
from gateway.envoy.topology import ExtProcTls, Topology
from gateway.envoy.xds_resources import (
    CLUSTER,
    LISTENER,
    ROUTE,
    Resources,
    snapshot,
    topology_from_json,
    topology_to_json,
    xds_bootstrap,
)

CONFIG: dict[str, Any] = {
    "pools": [
        {
            "name": "llama",
            "models": [{"name": "llama", "adapters": ["sql"]}],
            "endpoints": [{"address": "127.0.0.1:8000"}],
            "epp": {"port": 19002},
        },
    ]
}
TOPO = Topology(
    listen_port=18443,
    admin_port=19901,
    bbr=("127.0.0.1", 19004),
    epps={"llama": ("127.0.0.1", 19002)},
    server_cert=Path("/certs/tls.crt"),
    server_key=Path("/certs/tls.key"),
    extproc_tls=ExtProcTls(Path("/c/cert"), Path("/c/key"), Path("/c/ca")),
    original_dst_pools=frozenset({"llama"}),
)


def _unpack(resources: Any, kind: Any) -> list[Any]:
    out = []
    for packed in resources.resources:
        msg = kind()
        assert packed.Unpack(msg)
        out.append(msg)
    return out


def _with(change: Any) -> dict[str, Any]:
    config = copy.deepcopy(CONFIG)
    change(config)
    return snapshot(parse_config(config), TOPO)


def test_the_route_table_is_served_over_rds_and_named_by_the_listener() -> None:
    snap = snapshot(parse_config(CONFIG), TOPO)
    (listener,) = _unpack(snap[LISTENER], listener_pb2.Listener)
    (table,) = _unpack(snap[ROUTE], route_pb2.RouteConfiguration)
    hcm = http_connection_manager_pb2.HttpConnectionManager()
    assert listener.filter_chains[0].filters[0].typed_config.Unpack(hcm)
    assert not hcm.HasField("route_config")
    assert hcm.rds.route_config_name == table.name == "gateway"
    assert hcm.rds.config_source.HasField("ads")
    names = {r.name for r in table.virtual_hosts[0].routes}
    assert {"llama-pick", "llama-picked", "no-route-model", "method-not-allowed"} <= names
    clusters = {c.name for c in _unpack(snap[CLUSTER], cluster_pb2.Cluster)}
    assert clusters == {"bbr", "epp-llama", "pool-llama"}


@pytest.mark.parametrize("single_hop", [False, True])
def test_the_resources_are_the_static_bootstraps_messages(single_hop: bool) -> None:
    """The typed messages' wire bytes (what xDS sends) read back by the real protos equal the
    static bootstrap's JSON read by them: one rendering, two encodings, no drift."""
    topo = dataclasses.replace(TOPO, bbr=None, single_hop=True) if single_hop else TOPO
    assert_snapshot_is_the_bootstrap(
        snapshot(parse_config(CONFIG), topo), render_bootstrap(parse_config(CONFIG), topo)
    )


def assert_snapshot_is_the_bootstrap(snap: dict[str, Resources], bootstrap: dict[str, Any]) -> None:
    """The xDS resources, read by the real protos, are the static bootstrap's listeners, route
    table and clusters (also used on deploy/'s committed files: tests/k8s/test_manifests.py)."""
    register_types()
    static = json_format.ParseDict(bootstrap, bootstrap_pb2.Bootstrap())
    assert _unpack(snap[CLUSTER], cluster_pb2.Cluster) == list(static.static_resources.clusters)
    (listener,) = _unpack(snap[LISTENER], listener_pb2.Listener)
    hcm = http_connection_manager_pb2.HttpConnectionManager()
    listener.filter_chains[0].filters[0].typed_config.Unpack(hcm)
    hcm.ClearField("rds")
    hcm.route_config.CopyFrom(_unpack(snap[ROUTE], route_pb2.RouteConfiguration)[0])
    listener.filter_chains[0].filters[0].typed_config.Pack(hcm)
    expected = static.static_resources.listeners[0]
    inline = http_connection_manager_pb2.HttpConnectionManager()
    expected.filter_chains[0].filters[0].typed_config.Unpack(inline)
    assert hcm == inline
    listener.filter_chains[0].filters[0].ClearField("typed_config")
    expected.filter_chains[0].filters[0].ClearField("typed_config")
    assert listener == expected


def test_a_model_added_changes_the_routes_alone() -> None:
    before = snapshot(parse_config(CONFIG), TOPO)
    after = _with(lambda c: c["pools"][0]["models"].append({"name": "llama-new"}))
    assert after[ROUTE].version != before[ROUTE].version
    assert after[CLUSTER].version == before[CLUSTER].version
    assert after[LISTENER].version == before[LISTENER].version


def test_a_pool_added_brings_its_clusters_and_its_epp_from_the_config() -> None:
    pool = {
        "name": "mistral",
        "models": [{"name": "mistral"}],
        "endpoints": [{"address": "127.0.0.1:8100"}],
        "epp": {"host": "127.0.0.1", "port": 19100},
    }
    after = _with(lambda c: c["pools"].append(pool))
    clusters = {c.name: c for c in _unpack(after[CLUSTER], cluster_pb2.Cluster)}
    assert {"pool-mistral", "epp-mistral"} <= set(clusters)
    address = clusters["epp-mistral"].load_assignment.endpoints[0].lb_endpoints[0].endpoint.address
    assert address.socket_address.port_value == 19100


def test_single_hop_maps_every_pool_to_the_one_epp() -> None:
    topo = dataclasses.replace(TOPO, bbr=None, single_hop=True, epps={"llama": ("127.0.0.1", 19500)})
    config = copy.deepcopy(CONFIG)
    config["pools"].append({**config["pools"][0], "name": "other", "models": [{"name": "other"}]})
    snap = snapshot(parse_config(config), topo)
    assert {c.name for c in _unpack(snap[CLUSTER], cluster_pb2.Cluster)} == {
        "epp",
        "pool-llama",
        "pool-other",
    }
    with pytest.raises(ValueError, match="cannot fail open"):
        config["pools"][1]["failureMode"] = "FailOpen"
        snapshot(parse_config(config), topo)


def test_the_topology_round_trips_through_its_file() -> None:
    assert topology_from_json(topology_to_json(TOPO)) == TOPO


def test_the_xds_bootstrap_is_admin_and_the_xds_cluster_only() -> None:
    boot = xds_bootstrap(19901, ("127.0.0.1", 18000), TOPO.extproc_tls)
    assert [c["name"] for c in boot["static_resources"]["clusters"]] == ["xds"]
    assert "listeners" not in boot["static_resources"]
    assert boot["dynamic_resources"]["lds_config"] == {"ads": {}, "resource_api_version": "V3"}
