"""The ADS server's protocol: answer what Envoy subscribes to, stay quiet on ACKs, push changes
in ADS order (clusters, listeners, routes), resend when the names asked for change."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import AsyncIterator

import grpc
from envoy.service.discovery.v3 import ads_pb2_grpc, discovery_pb2

from gateway.config import parse_config
from gateway.config_store import ConfigStore
from gateway.envoy.xds_resources import CLUSTER, LISTENER, ROUTE
from gateway.xds import AdsServer, start_xds_server
from tests.unit.test_xds_resources import CONFIG, TOPO


async def _next(responses: AsyncIterator[discovery_pb2.DiscoveryResponse]) -> discovery_pb2.DiscoveryResponse:
    return await asyncio.wait_for(anext(responses), 10)


async def test_subscriptions_acks_and_pushes() -> None:
    ads = AdsServer(TOPO, parse_config(CONFIG))
    service = await start_xds_server(ads, host="127.0.0.1", port=0, tls=None)
    requests: asyncio.Queue[discovery_pb2.DiscoveryRequest | None] = asyncio.Queue()

    async def outgoing() -> AsyncIterator[discovery_pb2.DiscoveryRequest]:
        while (request := await requests.get()) is not None:
            yield request

    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{service.port}") as channel:
            stream = ads_pb2_grpc.AggregatedDiscoveryServiceStub(channel).StreamAggregatedResources(
                outgoing()
            )
            responses = stream.__aiter__()
            await requests.put(discovery_pb2.DiscoveryRequest(type_url=CLUSTER))
            clusters = await _next(responses)
            assert clusters.type_url == CLUSTER and len(clusters.resources) == 3
            ack = discovery_pb2.DiscoveryRequest(
                type_url=CLUSTER, version_info=clusters.version_info, response_nonce=clusters.nonce
            )
            await requests.put(ack)
            await requests.put(discovery_pb2.DiscoveryRequest(type_url=ROUTE, resource_names=["gateway"]))
            routes = await _next(responses)  # the ACK got no answer: the next one is the routes'
            assert routes.type_url == ROUTE
            await requests.put(discovery_pb2.DiscoveryRequest(type_url=LISTENER))
            assert (await _next(responses)).type_url == LISTENER

            changed = copy.deepcopy(CONFIG)
            changed["pools"][0]["models"].append({"name": "llama-new"})
            ads.on_config(parse_config(changed))
            pushed = await _next(responses)
            assert pushed.type_url == ROUTE and pushed.version_info != routes.version_info

            added = copy.deepcopy(changed)
            added["pools"].append({**changed["pools"][0], "name": "other", "models": [{"name": "other"}]})
            ads.on_config(parse_config(added))
            assert [(await _next(responses)).type_url for _ in range(2)] == [CLUSTER, ROUTE]

            # The same names again: an ACK; other names: the resources again.
            again = discovery_pb2.DiscoveryRequest(type_url=ROUTE, resource_names=["gateway", "x"])
            await requests.put(again)
            assert (await _next(responses)).type_url == ROUTE

            # A config the topology cannot serve (an ORIGINAL_DST pool takes one address): the
            # last good resources stay, nothing is pushed.
            unservable = copy.deepcopy(added)
            unservable["pools"][0]["fallbackEndpoints"] = 2
            served = ads.resources
            ads.on_config(parse_config(unservable))
            assert ads.resources is served
            ads.on_config(parse_config(changed))  # the pool removed again: clusters, routes
            assert [(await _next(responses)).type_url for _ in range(2)] == [CLUSTER, ROUTE]
            await requests.put(None)
    finally:
        await service.drain_and_stop(0)


def test_what_envoy_cannot_be_given_is_refused_by_the_store_with_its_reason() -> None:
    """The xDS server's verdict is the store's: every source (file, resource) sees the refusal,
    the resource's status says why, and Envoy keeps the last good resources."""
    ads = AdsServer(TOPO, parse_config(CONFIG))
    store = ConfigStore(parse_config(CONFIG))
    store.add_check(ads.check)
    store.subscribe(ads.on_config)
    served = ads.resources
    unservable = copy.deepcopy(CONFIG)
    unservable["pools"][0]["fallbackEndpoints"] = 2  # an ORIGINAL_DST pool takes one address
    assert not store.offer_data(unservable, "test")
    assert store.last_refusal is not None and "Envoy cannot be given" in store.last_refusal
    assert "ORIGINAL_DST" in store.last_refusal
    assert ads.resources is served
    changed = copy.deepcopy(CONFIG)
    changed["pools"][0]["models"].append({"name": "llama-new"})
    assert store.offer_data(changed, "test") and store.last_refusal is None
    assert ads.resources[ROUTE].version != served[ROUTE].version
