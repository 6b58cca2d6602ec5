"""mTLS between Envoy and the ext_proc services: traffic flows; a client without a cert is refused."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from devstack.launch import LocalGateway, grpc_serving, start_local_gateway
from tests.integration.conftest import FAST_FLEET, chat
from tests.security.conftest import LLAMA, LLAMA_POOL, QWEN


@pytest.fixture(scope="module")
def mtls_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalGateway]:
    gw = start_local_gateway(tmp_path_factory.mktemp("mtls"), fleet=FAST_FLEET, mtls=True)
    try:
        yield gw
    finally:
        gw.stop()


async def test_traffic_flows_over_mtls(mtls_gateway: LocalGateway) -> None:
    async with mtls_gateway.client() as client:
        for model in (LLAMA, QWEN):
            r = await client.post("/v1/chat/completions", json=chat(model))
            assert r.status_code == 200, r.text


def _health(channel: grpc.Channel) -> int:
    with channel:
        stub = health_pb2_grpc.HealthStub(channel)
        return int(stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=2).status)


@pytest.mark.parametrize("which", ["bbr", "epp"])
def test_ext_proc_port_refuses_clients_without_a_certificate(mtls_gateway: LocalGateway, which: str) -> None:
    gw = mtls_gateway
    port = gw.bbr_port if which == "bbr" else gw.epp_ports[LLAMA_POOL]
    assert grpc_serving(port, gw.certs)  # with Envoy's client certificate: fine
    options = [("grpc.ssl_target_name_override", "localhost")]
    no_cert = grpc.secure_channel(
        f"127.0.0.1:{port}", grpc.ssl_channel_credentials(gw.certs.ca.read_bytes()), options
    )
    with pytest.raises(grpc.RpcError) as excinfo:
        _health(no_cert)
    assert excinfo.value.code() == grpc.StatusCode.UNAVAILABLE
    with pytest.raises(grpc.RpcError):
        _health(grpc.insecure_channel(f"127.0.0.1:{port}"))  # plaintext: no handshake at all
