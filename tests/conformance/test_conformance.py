"""A conformance-style suite modelled on the Gateway API Inference Extension conformance tests
(conformance/tests/*.go, gateway profile): each test checks the same observable behaviour as
the upstream test of that name, through the real Envoy, against our EPP, under each gateway
configuration: our own rendering and the Envoy-Gateway- and kgateway-shaped ones
(tests/conformance/gateway_shapes.py). docs/conformance.md tabulates them.

As upstream, the EPP runs a test picker that honours `test-epp-endpoint-selection` (ours only
in its explicit conformance test mode, epp/requestcontrol/conformance_mode.py). Differences from upstream, all for
speed or because there is no cluster here: 30 requests per case instead of 100 (100 instead of
200 for the weighted split); requests are inference POSTs to the simulated model servers (the
upstream echo server answers GETs too); pods of a static pool share 127.0.0.1 and differ by
port, so selections name `ip:port`; pod identity comes from the model server's
`x-modelsim-pod` header.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import grpc
import httpx
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from epp.requestcontrol.conformance_mode import SELECTION_HEADER, SERVED_RESULT_HEADER
from tests.conformance import harness
from tests.conformance.gateway_shapes import Gateway, InferencePoolBackend, Rule, render
from tests.conformance.harness import CONFIGS, Conformance, completion, eventually

pytestmark = pytest.mark.integration

POD = "x-modelsim-pod"
REQUESTS, CONCURRENCY = 30, 10
# Which configurations report the endpoint that served the request back to the EPP (the
# protocol's `envoy.lb` `x-gateway-destination-endpoint-served`, or Envoy's upstream.address
# attribute). Neither gateway's translator asks Envoy for it.
REPORTS_SERVED = {"ours": True, "envoy-gateway": False, "kgateway": False}
NO_SERVED = "fail: the gateway reported no served endpoint"


@pytest.fixture(scope="module")
def conf(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Conformance]:
    c = harness.start(tmp_path_factory.mktemp("conformance"))
    try:
        yield c
    finally:
        c.stop()


@pytest.fixture(scope="module")
def client() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=30, limits=httpx.Limits(max_connections=CONCURRENCY * 2)) as c:
        yield c


def _post(
    client: httpx.Client,
    conf: Conformance,
    config: str,
    gateway: str,
    path: str,
    select: str | None = None,
    model: str | None = None,
) -> httpx.Response:
    url, pool_model = conf.request(config, gateway, path)
    model = model or pool_model
    headers = {SELECTION_HEADER: select} if select is not None else {}
    return client.post(url, json=completion(model), headers=headers)


def _served_only_by(
    client: httpx.Client,
    conf: Conformance,
    config: str,
    gateway: str,
    path: str,
    select: str,
    n: int = REQUESTS,
    model: str | None = None,
) -> Counter[str]:
    """Upstream's assertTrafficOnlyReachesToExpectedPods: n requests, CONCURRENCY at a time;
    every one must succeed. Returns the serving pods."""
    with ThreadPoolExecutor(CONCURRENCY) as pool:
        responses = list(
            pool.map(lambda _: _post(client, conf, config, gateway, path, select, model), range(n))
        )
    bad = [(r.status_code, r.text[:200]) for r in responses if r.status_code != 200]
    assert not bad, f"{len(bad)}/{n} requests failed under {config}: {bad[:3]}"
    return Counter(r.headers[POD] for r in responses)


def _warm(
    client: httpx.Client, conf: Conformance, config: str, gateway: str, path: str, pod: str
) -> httpx.Response:
    """Upstream's first phase: a request pinned to one pod, retried until that pod answers."""
    return eventually(
        lambda: _post(client, conf, config, gateway, path, conf.pod_address(pod)),
        lambda r: r.status_code == 200 and r.headers.get(POD) == pod,
    )


# -- GatewayFollowingEPPRouting -----------------------------------------------------------------


@pytest.mark.parametrize("config", CONFIGS)
def test_GatewayFollowingEPPRouting(conf: Conformance, client: httpx.Client, config: str) -> None:
    path = "/primary-gateway-test/"
    pods = sorted(conf.pods["primary"])
    for pod in pods:
        _warm(client, conf, config, "primary", path, pod)
    for chosen in ([pods[2]], [pods[0], pods[1]], pods):
        select = ",".join(conf.pod_address(p) for p in chosen)
        served = _served_only_by(client, conf, config, "primary", path, select)
        assert set(served) <= set(chosen), f"{config}: traffic reached {served} outside {chosen}"


# -- GatewayDestinationEndpointServed -----------------------------------------------------------


@pytest.mark.parametrize("config", CONFIGS)
def test_GatewayDestinationEndpointServed(conf: Conformance, client: httpx.Client, config: str) -> None:
    path = "/destination-endpoint-served-test/"
    for pod in sorted(conf.pods["primary"]):
        r = _warm(client, conf, config, "primary", path, pod)
        expected = conf.pod_address(pod) if REPORTS_SERVED[config] else NO_SERVED
        assert r.headers[SERVED_RESULT_HEADER] == expected, config


# -- GatewayFollowingEPPRoutingWithDataParallelism ------------------------------------------------


@pytest.mark.parametrize("config", CONFIGS)
def test_GatewayFollowingEPPRoutingWithDataParallelism(
    conf: Conformance, client: httpx.Client, config: str
) -> None:
    path = "/primary-gateway-dp-test/"
    ranks = sorted(conf.pods["dp-pool"])  # dpa-0..2 on 127.0.0.2, dpb-0..2 on 127.0.0.3
    dp_ports = {conf.pod_address(p).rsplit(":", 1)[1] for p in ranks}
    a, b = harness.DP_HOSTS
    for pod in ranks:
        _warm(client, conf, config, "primary", path, pod)
    ports = sorted(dp_ports)
    cases: list[dict[str, set[str]]] = [
        {a: set()},  # one pod, any rank
        {a: set(), b: {ports[1]}},  # two pods; one with a fixed rank
        {a: {ports[0], ports[2]}, b: set()},  # both; one restricted to two ranks
    ]
    for allowed in cases:
        tokens = [
            h if not ps else f"{h}:{p}" for h, ps in sorted(allowed.items()) for p in (sorted(ps) or [""])
        ]
        select = ",".join(tokens)
        served = _served_only_by(client, conf, config, "primary", path, select)
        for pod in served:
            host, port = conf.pod_address(pod).rsplit(":", 1)
            assert host in allowed, f"{config}: {pod} ({host}) not selected by {select}"
            assert port in (allowed[host] or dp_ports), (
                f"{config}: {pod} on port {port} not selected by {select}"
            )


# -- GatewayWeightedAcrossTwoInferencePools ------------------------------------------------------


@pytest.mark.parametrize("config", CONFIGS)
def test_GatewayWeightedAcrossTwoInferencePools(conf: Conformance, client: httpx.Client, config: str) -> None:
    path = "/weighted-two-pools-test/"
    if config == "ours":
        pytest.skip(
            "our config routes a model name to one pool: weighted splits are between models of a pool"
        )
    if config == "envoy-gateway":
        backend = InferencePoolBackend("p", ("127.0.0.1:1",), ("127.0.0.1", 2))
        gw = Gateway(1, 2, (Rule(path, (("p", 70), ("q", 30))),), {"p": backend, "q": backend})
        with pytest.raises(ValueError, match="at most one inferencepool"):
            render("envoy-gateway", gw)
        assert (config, path) in conf.refused
        return
    every = ",".join(conf.pod_address(p) for pool in ("primary", "secondary") for p in conf.pods[pool])
    shared = harness.SHARED_MODEL
    eventually(
        lambda: _post(client, conf, config, "primary", path, every, shared), lambda r: r.status_code == 200
    )
    total = 100
    served = _served_only_by(client, conf, config, "primary", path, every, n=total, model=shared)
    hits = Counter(conf.pool_of_pod(pod) for pod in served.elements())
    assert set(hits) <= {"primary", "secondary"}
    observed, expected = hits["primary"] / total, 0.7
    tolerance = max(0.10, 3 * math.sqrt(expected * (1 - expected) / total))
    assert abs(observed - expected) <= tolerance, (
        f"primary share {observed:.2f}, expected 0.70 +- {tolerance:.2f}"
    )


# -- HTTPRouteMultipleRulesDifferentPools / HTTPRouteMultipleGatewaysDifferentPools ----------------


def _reaches_pool(
    client: httpx.Client, conf: Conformance, config: str, gateway: str, path: str, pool: str
) -> None:
    r = eventually(lambda: _post(client, conf, config, gateway, path), lambda r: r.status_code == 200)
    assert r.headers[POD] in conf.pods[pool], f"{config} {gateway}{path}: served by {r.headers[POD]}"
    served = _served_only_by(client, conf, config, gateway, path, ",".join(conf.pods[pool].values()), n=10)
    assert set(served) <= set(conf.pods[pool])


@pytest.mark.parametrize("config", CONFIGS)
def test_HTTPRouteMultipleRulesDifferentPools(conf: Conformance, client: httpx.Client, config: str) -> None:
    _reaches_pool(client, conf, config, "primary", "/primary/", "primary")
    _reaches_pool(client, conf, config, "primary", "/secondary/", "secondary")


@pytest.mark.parametrize("config", CONFIGS)
def test_HTTPRouteMultipleGatewaysDifferentPools(
    conf: Conformance, client: httpx.Client, config: str
) -> None:
    _reaches_pool(client, conf, config, "primary", "/test-primary-gateway/", "primary")
    _reaches_pool(client, conf, config, "secondary", "/test-secondary-gateway/", "secondary")


# -- The reference EPP's contract (health service names, metrics) ---------------------------------


@pytest.mark.parametrize(
    "service",
    ["inference-extension", "envoy.service.ext_proc.v3.ExternalProcessor", "", "liveness", "readiness"],
)
def test_reference_health_service_names(conf: Conformance, service: str) -> None:
    with grpc.insecure_channel(f"127.0.0.1:{conf.dp_health_port}") as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=service), timeout=5
        )
    assert reply.status == health_pb2.HealthCheckResponse.SERVING


def test_reference_health_unknown_service(conf: Conformance) -> None:
    with (
        grpc.insecure_channel(f"127.0.0.1:{conf.dp_health_port}") as channel,
        pytest.raises(grpc.RpcError) as err,
    ):
        health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service="nope"), timeout=5)
    assert err.value.code() == grpc.StatusCode.NOT_FOUND


def test_reference_metrics_and_test_mode_gauge(conf: Conformance, client: httpx.Client) -> None:
    text = client.get(f"http://127.0.0.1:{conf.dp_metrics_port}/metrics").text
    assert "epp_conformance_test_mode 1.0" in text
    assert "inference_objective_request_total" in text or "inference_objective_request" in text


# -- EppUnAvailableFailOpen (last: it stops an EPP) ------------------------------------------------

# Our rendering puts FailOpen pools in BUFFERED mode with a fallback cluster; kgateway sets
# failure_mode_allow per route from the pool; Envoy Gateway's translator renders
# failure_mode_allow: false for every pool, so there the request fails closed.
FAILS_OPEN = {"ours": True, "envoy-gateway": False, "kgateway": True}


@pytest.mark.parametrize("config", CONFIGS)
def test_EppUnAvailableFailOpen_baseline(conf: Conformance, client: httpx.Client, config: str) -> None:
    """Phase 1: with the EPP up, a pinned request is served by the pinned pod."""
    _warm(client, conf, config, "secondary", "/failopen-pool-test/", sorted(conf.pods["failopen"])[0])


@pytest.fixture(scope="module")
def failopen_epp_down(conf: Conformance) -> None:
    """The module's last tests: the FailOpen pool's EPP stays down until the module ends."""
    conf.stop_epp("failopen")


@pytest.mark.parametrize("config", CONFIGS)
def test_EppUnAvailableFailOpen(
    conf: Conformance, client: httpx.Client, failopen_epp_down: None, config: str
) -> None:
    """Phase 2: with the EPP gone, a FailOpen pool still serves (any of its pods)."""
    path, pods = "/failopen-pool-test/", conf.pods["failopen"]
    pinned = conf.pod_address(sorted(pods)[0])
    if FAILS_OPEN[config]:
        r = eventually(
            lambda: _post(client, conf, config, "secondary", path, pinned), lambda r: r.status_code == 200
        )
        assert r.headers[POD] in pods
    else:
        r = _post(client, conf, config, "secondary", path, pinned)
        assert r.status_code >= 500, (
            f"{config}: {r.status_code} with the EPP down and failure_mode_allow false"
        )
