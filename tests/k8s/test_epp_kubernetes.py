"""An EPP configured for Kubernetes discovery follows pods in the (fake) API server and
scrapes the simulated model servers behind them."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import pytest
import yaml

from epp.app import EppApp
from modelsim.fleet import FleetSpec, run_fleet
from tests.fakes.kube_apiserver import (
    INFERENCE_POOLS,
    PODS,
    FakeKubeApiServer,
    make_pod,
    make_pool,
    write_kubeconfig,
)

HOSTS = ("127.0.0.2", "127.0.0.3")


def free_port_on_all(hosts: tuple[str, ...]) -> int:
    for _ in range(50):
        with socket.socket() as probe:
            probe.bind((hosts[0], 0))
            port = probe.getsockname()[1]
        try:
            for host in hosts[1:]:
                with socket.socket() as s:
                    s.bind((host, port))
            return port
        except OSError:
            continue
    raise RuntimeError("no common free port")


async def test_epp_follows_inferencepool_pods(
    tmp_path: Path, kube: FakeKubeApiServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    port = free_port_on_all(HOSTS)
    monkeypatch.setenv("KUBECONFIG", str(write_kubeconfig(tmp_path / "kubeconfig", kube.url)))
    config = tmp_path / "gateway.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "pools": [
                    {
                        "name": "llama",
                        "models": [{"name": "llama"}],
                        "kubernetes": {"namespace": "default", "poolName": "llama"},
                    }
                ],
                "scrape": {"intervalMs": 20},
            }
        )
    )
    labels = {"app": "vllm-llama"}
    kube.apply(INFERENCE_POOLS, make_pool("llama", selector=labels, port=port))
    kube.apply(PODS, make_pod("pod-a", labels=labels, ip=HOSTS[0]))
    fleet = {
        "time_scale": 50.0,
        "pods": [{"name": "p", "model": "llama", "profile": "h100-llama3.1-8b", "port": port}],
    }
    async with (
        run_fleet(FleetSpec.from_dict(fleet), host=HOSTS[0]),
        run_fleet(FleetSpec.from_dict(fleet), host=HOSTS[1]),
    ):
        app = EppApp(config, "llama")
        await app.start()
        try:

            async def addresses(expected: set[str], scraped: bool = False) -> None:
                for _ in range(200):
                    snap = app.pool.snapshot()
                    if {e.address for e in snap.endpoints} == expected and (
                        not scraped or all(e.metrics is not None for e in snap.endpoints)
                    ):
                        return
                    await asyncio.sleep(0.02)
                raise AssertionError(f"pool is {[e.address for e in app.pool.snapshot().endpoints]}")

            a, b = f"{HOSTS[0]}:{port}", f"{HOSTS[1]}:{port}"
            await addresses({a}, scraped=True)
            kube.apply(PODS, make_pod("pod-b", labels=labels, ip=HOSTS[1]))
            await addresses({a, b}, scraped=True)
            kube.apply(PODS, make_pod("pod-a", labels=labels, ip=HOSTS[0], ready=False))
            await addresses({b})
            kube.delete(PODS, "pod-b")
            await addresses(set())
        finally:
            await app.stop()
