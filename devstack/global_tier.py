"""Bring up the global tier locally: router replicas, a reporter per cluster, the global Envoy.

Member clusters come from `devstack.launch.start_local_gateway`. Used by the tests and for
local demos; every process is a child of the caller and logs to `<workdir>/logs/`.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from devstack.certs import CertSet, make_certs
from devstack.launch import (
    LocalGateway,
    Proc,
    envoy_binary,
    free_port,
    grpc_serving,
    https_client,
    wait_until,
)
from globalrouter.config import parse_config
from globalrouter.envoy_config import GlobalTopology, write_bootstrap


def spawn(name: str, argv: list[str], workdir: Path) -> Proc:
    logs = workdir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    log = logs / f"{name}.log"
    with log.open("ab") as handle:
        popen = subprocess.Popen(argv, stdout=handle, stderr=subprocess.STDOUT, env=dict(os.environ))
    return Proc(name, popen, log)


@dataclass(frozen=True, slots=True)
class ClusterSpec:
    """A member cluster: its gateway plus what its reporter says about it."""

    name: str
    gateway: LocalGateway
    region: str
    cost_per_1k_tokens: float
    slots_per_pod: int = 8

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.gateway.listen_port}"

    @property
    def epp_admin_urls(self) -> list[str]:
        return [f"http://127.0.0.1:{p}" for p in self.gateway.epp_metrics_ports.values()]


@dataclass
class GlobalTier:
    workdir: Path
    certs: CertSet
    listen_port: int
    admin_port: int
    router_ports: list[int]
    router_admin_ports: list[int]
    clusters: dict[str, ClusterSpec]
    procs: dict[str, Proc] = field(default_factory=dict)
    reporter_argv: dict[str, list[str]] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.listen_port}"

    def client(self, **kwargs: Any) -> httpx.AsyncClient:
        return https_client(self.url, self.certs.ca, timeout=30, **kwargs)

    def start_reporter(self, cluster: str) -> None:
        self.procs[f"reporter-{cluster}"] = spawn(
            f"reporter-{cluster}", self.reporter_argv[cluster], self.workdir
        )

    def stop_reporter(self, cluster: str) -> None:
        self.procs[f"reporter-{cluster}"].stop()

    def members(self, replica: int = 0) -> dict[str, dict[str, Any]]:
        url = f"http://127.0.0.1:{self.router_admin_ports[replica]}/debug/members"
        return {m["name"]: m for m in httpx.get(url, timeout=2).json()["members"]}

    def all_members_ramped(self, replica: int) -> bool:
        """Every member is available at full weight, as this router replica sees them."""
        return all(m["available"] and m["ramp"] >= 1.0 for m in self.members(replica).values())

    def stop(self) -> None:
        for name in sorted(self.procs, key=lambda n: (n != "envoy", not n.startswith("reporter"))):
            self.procs[name].stop()

    def __enter__(self) -> GlobalTier:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def ca_bundle(paths: list[Path], out: Path) -> Path:
    out.write_bytes(b"".join(p.read_bytes().rstrip(b"\n") + b"\n" for p in paths))
    return out


def start_global_tier(
    workdir: Path,
    clusters: list[ClusterSpec],
    *,
    replicas: int = 2,
    router_config: Mapping[str, Any] | None = None,
    heartbeat_interval_s: float = 0.5,
    timeout_s: float = 30.0,
) -> GlobalTier:
    """Start `replicas` routers, one reporter per cluster (to every replica), the global Envoy."""
    workdir.mkdir(parents=True, exist_ok=True)
    certs = make_certs(workdir / "certs")
    config_data = {
        **dict(router_config or {}),
        "members": [
            {
                "name": c.name,
                "address": c.address,
                "region": c.region,
                "cost_per_1k_tokens": c.cost_per_1k_tokens,
            }
            for c in clusters
        ],
    }
    config = parse_config(config_data)
    config_path = workdir / "router.yaml"
    config_path.write_text(yaml.safe_dump(config_data, sort_keys=False))
    python = sys.executable
    tier = GlobalTier(
        workdir=workdir,
        certs=certs,
        listen_port=free_port(),
        admin_port=free_port(),
        router_ports=[free_port() for _ in range(replicas)],
        router_admin_ports=[free_port() for _ in range(replicas)],
        clusters={c.name: c for c in clusters},
    )
    try:
        for i, (port, admin) in enumerate(zip(tier.router_ports, tier.router_admin_ports, strict=True)):
            tier.procs[f"router-{i}"] = spawn(
                f"router-{i}",
                [python, "-m", "globalrouter", "--config", str(config_path), "--port", str(port),
                 "--admin-port", str(admin), "--router-id", f"r{i}"],
                workdir,
            )  # fmt: skip
        for i, port in enumerate(tier.router_ports):
            wait_until(
                functools.partial(grpc_serving, port),
                timeout_s,
                f"router-{i}",
                tier.procs[f"router-{i}"].popen,
            )
        for c in clusters:
            argv = [python, "-m", "globalrouter.reporter", "--cluster", c.name, "--region", c.region,
                    "--cost-per-1k-tokens", str(c.cost_per_1k_tokens), "--interval", str(heartbeat_interval_s),
                    "--slots-per-pod", str(c.slots_per_pod)]  # fmt: skip
            for url in c.epp_admin_urls:
                argv += ["--epp-admin", url]
            for port in tier.router_ports:
                argv += ["--router", f"127.0.0.1:{port}"]
            tier.reporter_argv[c.name] = argv
            tier.start_reporter(c.name)
        topo = GlobalTopology(
            listen_port=tier.listen_port,
            admin_port=tier.admin_port,
            routers=[("127.0.0.1", p) for p in tier.router_ports],
            server_cert=certs.server_cert,
            server_key=certs.server_key,
            upstream_ca=ca_bundle([c.gateway.certs.ca for c in clusters], workdir / "members-ca.pem"),
            member_cas={c.name: c.gateway.certs.ca for c in clusters},
        )
        bootstrap = write_bootstrap(config, topo, workdir / "global-envoy.json")
        tier.procs["envoy"] = spawn(
            "envoy",
            [envoy_binary(), "-c", str(bootstrap), "--use-dynamic-base-id", "--log-level",
             os.environ.get("GATEWAY_ENVOY_LOG_LEVEL", "warn"), "--concurrency", "1"],
            workdir,
        )  # fmt: skip
        wait_until(
            lambda: httpx.get(f"http://127.0.0.1:{tier.admin_port}/ready", timeout=0.5).status_code == 200,
            timeout_s,
            "global envoy",
            tier.procs["envoy"].popen,
        )
        for i in range(replicas):
            wait_until(
                functools.partial(tier.all_members_ramped, i),
                timeout_s,
                f"every member available at full weight at router-{i}",
            )
        return tier
    except BaseException:
        tier.stop()
        raise
