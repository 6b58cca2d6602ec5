"""Fixtures: a fake API server on loopback and a real `kubernetes` client pointed at it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator

import kubernetes
import pytest

from epp.datalayer.discovery.kubernetes import InferencePoolDiscovery
from epp.datalayer.endpoint_records import Endpoint
from tests.fakes.kube_apiserver import FakeKubeApiServer


@pytest.fixture
def kube() -> Iterator[FakeKubeApiServer]:
    with FakeKubeApiServer() as server:
        yield server


@pytest.fixture
def api_client(kube: FakeKubeApiServer) -> Iterator[kubernetes.client.ApiClient]:
    client = kubernetes.client.ApiClient(kubernetes.client.Configuration(host=kube.url))
    yield client
    client.close()


class Recorder:
    """The `on_change` callback: keeps every delivered set, lets a test await the next ones."""

    def __init__(self) -> None:
        self.calls: list[list[Endpoint]] = []
        self._changed = asyncio.Event()

    def __call__(self, endpoints: list[Endpoint]) -> None:
        self.calls.append(endpoints)
        self._changed.set()

    @property
    def addresses(self) -> set[str]:
        return {e.address for e in self.calls[-1]} if self.calls else set()

    def history(self) -> list[set[str]]:
        return [{e.address for e in call} for call in self.calls]

    async def until(self, predicate: Callable[[set[str]], bool], within: float = 15.0) -> None:
        async def wait() -> None:
            while not predicate(self.addresses):
                self._changed.clear()
                await self._changed.wait()

        try:
            await asyncio.wait_for(wait(), within)
        except TimeoutError:
            raise AssertionError(
                f"still {self.addresses} after {within}s; history {self.history()}"
            ) from None


StartDiscovery = Callable[..., Awaitable[tuple[InferencePoolDiscovery, Recorder]]]


@pytest.fixture
async def start_discovery(api_client: kubernetes.client.ApiClient) -> AsyncIterator[StartDiscovery]:
    started: list[InferencePoolDiscovery] = []

    async def start(pool_name: str = "llama", **kwargs: object) -> tuple[InferencePoolDiscovery, Recorder]:
        recorder = Recorder()
        kwargs.setdefault("resync_backoff_s", 0.05)
        discovery = InferencePoolDiscovery(
            namespace="default", pool_name=pool_name, on_change=recorder, api_client=api_client, **kwargs
        )
        started.append(discovery)
        await discovery.start()
        return discovery, recorder

    yield start
    for discovery in started:
        await discovery.stop()
