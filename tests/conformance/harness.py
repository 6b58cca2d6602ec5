"""One shared setup for the conformance-style suite: simulated pods, our EPPs in conformance
test mode, a fake Kubernetes API server for the data-parallel InferencePool, and one Envoy per
(gateway configuration, Gateway).

Pools (named after the upstream suite's resources):
- `primary` (3 pods), `secondary` (3 pods), `failopen` (2 pods, FailOpen): static pools, EPPs
  started with our own flags (`--config ... --pool ...`).
- `dp-pool`: 2 pods (127.0.0.2, 127.0.0.3) x 3 target ports, an InferencePool in the fake
  API server, its EPP started with the reference EPP's flags only (`--pool-name dp-pool
  --pool-namespace default --cert-path ...`, no `--config`).

Every EPP serves TLS (the gateways' shapes dial it with TLS, ours with its mTLS client
certificate). Each configuration gets a "primary" and a "secondary" Gateway (an Envoy each).
"""

from __future__ import annotations

import json
import shutil
import socket
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from devstack.certs import CertSet, make_certs
from devstack.launch import Proc, _spawn, envoy_binary, free_port, grpc_serving, start_fleet, wait_until
from gateway.config import parse_config
from gateway.envoy.bootstrap import render_bootstrap
from gateway.envoy.topology import ExtProcTls, Topology
from tests.conformance.gateway_shapes import SHAPES, Gateway, InferencePoolBackend, Rule, render
from tests.fakes.kube_apiserver import (
    INFERENCE_POOLS,
    PODS,
    FakeKubeApiServer,
    make_pod,
    make_pool,
    write_kubeconfig,
)

CONFIGS = ("ours", *SHAPES)
STATIC_POOLS = {"primary": 3, "secondary": 3, "failopen": 2}
DP_HOSTS = ("127.0.0.2", "127.0.0.3")
DP_RANKS = 3
PROFILE = "h100-llama3.1-8b"
# The one model name upstream sends to every pool; primary and secondary pods serve it too (as
# an adapter name) so that a rule splitting across the two pools can use it.
SHARED_MODEL = "conformance-fake-model"


def model_of(pool: str) -> str:
    return f"{pool}-model"


# HTTPRoute rules per Gateway: path prefix -> weighted pools (upstream suite's paths).
PRIMARY_RULES = {
    "/primary-gateway-test/": (("primary", 1),),
    "/destination-endpoint-served-test/": (("primary", 1),),
    "/primary-gateway-dp-test/": (("dp-pool", 1),),
    "/weighted-two-pools-test/": (("primary", 70), ("secondary", 30)),
    "/primary/": (("primary", 1),),
    "/secondary/": (("secondary", 1),),
    "/test-primary-gateway/": (("primary", 1),),
}
SECONDARY_RULES = {
    "/test-secondary-gateway/": (("secondary", 1),),
    "/failopen-pool-test/": (("failopen", 1),),
}
RULES = {"primary": PRIMARY_RULES, "secondary": SECONDARY_RULES}


@dataclass
class Conformance:
    workdir: Path
    certs: CertSet
    kube: FakeKubeApiServer
    pods: dict[str, dict[str, str]]  # pool -> pod name -> ip:port
    epp_ports: dict[str, int]
    urls: dict[tuple[str, str], str] = field(default_factory=dict)  # (config, gateway) -> URL
    procs: dict[str, Proc] = field(default_factory=dict)
    refused: dict[tuple[str, str], str] = field(default_factory=dict)  # rules a shape refuses
    dp_health_port: int = 0  # the reference-style EPP's gRPC health port
    dp_metrics_port: int = 0

    def pod_address(self, pod: str) -> str:
        return next(pods[pod] for pods in self.pods.values() if pod in pods)

    def pool_of_pod(self, pod: str) -> str:
        return next(pool for pool, pods in self.pods.items() if pod in pods)

    def request(self, config: str, gateway: str, path: str) -> tuple[str, str]:
        """(URL, model) of a request reaching the rule `path` of `gateway` under `config`.

        Gateway shapes route by path, as an HTTPRoute does; ours routes by model name (BBR),
        so there the rule's first pool's model selects the route and the path is the API's."""
        pool = RULES[gateway][path][0][0]
        base = self.urls[(config, gateway)]
        if config == "ours":
            return f"{base}/v1/completions", model_of(pool)
        return f"{base}{path}v1/completions", model_of(pool)

    def stop_epp(self, pool: str) -> None:
        self.procs[f"epp-{pool}"].stop()

    def stop(self) -> None:
        """Envoys first, then everything else at once (each stop waits for its process)."""
        envoys = [p for n, p in self.procs.items() if n.startswith("envoy")]
        rest = [p for n, p in self.procs.items() if not n.startswith("envoy")]
        for group in (envoys, rest):
            with ThreadPoolExecutor(len(group) or 1) as pool:
                list(pool.map(Proc.stop, group))
        self.kube.stop()


class _Ports:
    """Ports handed out before anything binds them: each one distinct from every other."""

    def __init__(self) -> None:
        self.taken: set[int] = set()

    def one(self) -> int:
        return self.range(("127.0.0.1",), 1)

    def range(self, hosts: tuple[str, ...], count: int) -> int:
        """A port p with p .. p+count-1 free on every host (a fleet's pods take consecutive ports)."""
        for _ in range(200):
            base = free_port()
            wanted = set(range(base, base + count))
            if wanted & self.taken:
                continue
            try:
                for host in hosts:
                    for port in wanted:
                        with socket.socket() as s:
                            s.bind((host, port))
            except OSError:
                continue
            self.taken |= wanted
            return base
        raise RuntimeError(f"no {count} consecutive free ports")


def _gateway_config(pods: dict[str, dict[str, str]], epp_ports: dict[str, int]) -> dict[str, Any]:
    pools: list[dict[str, Any]] = [
        {
            "name": pool,
            "models": [{"name": model_of(pool)}],
            "endpoints": [{"address": a} for a in pods[pool].values()],
            "epp": {"host": "127.0.0.1", "port": epp_ports[pool]},
            # Like the reference EPP: the HTTPRoute decides what reaches the pool (upstream
            # sends one "conformance-fake-model" to every pool).
            "acceptAnyModel": True,
            **({"failureMode": "FailOpen"} if pool == "failopen" else {}),
        }
        for pool in STATIC_POOLS
    ]
    pools.append(
        {
            "name": "dp-pool",
            "models": [{"name": model_of("dp-pool")}],
            "kubernetes": {"namespace": "default", "poolName": "dp-pool"},
            "epp": {"host": "127.0.0.1", "port": epp_ports["dp-pool"]},
        }
    )
    # The suite reads the served endpoint the EPP echoes on the response headers.
    return {"pools": pools, "scrape": {"intervalMs": 20}, "listener": {"eppResponseHeaders": "always"}}


def _start_envoy(name: str, bootstrap: dict[str, Any], workdir: Path) -> Proc:
    path = workdir / f"{name}.json"
    path.write_text(json.dumps(bootstrap, indent=1))
    argv = [
        envoy_binary(),
        "-c",
        str(path),
        "--use-dynamic-base-id",
        "--log-level",
        "warn",
        "--concurrency",
        "1",
    ]
    return _spawn(name, argv, workdir)


def start(workdir: Path, timeout_s: float = 60.0) -> Conformance:
    for sub in ("fleet-main", "fleet-dpa", "fleet-dpb"):
        (workdir / sub).mkdir(parents=True, exist_ok=True)
    certs = make_certs(workdir / "certs")
    cert_dir = workdir / "epp-cert"  # the reference EPP's --cert-path layout
    cert_dir.mkdir(exist_ok=True)
    shutil.copy(certs.server_cert, cert_dir / "tls.crt")
    shutil.copy(certs.server_key, cert_dir / "tls.key")
    kube = FakeKubeApiServer().start()
    ports = _Ports()
    procs: dict[str, Proc] = {}
    fleets = ThreadPoolExecutor(3)
    try:
        # Pods on fixed ports, so that every process can start at once: one fleet process on
        # 127.0.0.1, one per data-parallel pod address (its ranks on consecutive ports).
        pods: dict[str, dict[str, str]] = {pool: {} for pool in [*STATIC_POOLS, "dp-pool"]}
        specs: list[tuple[str, str, dict[str, Any]]] = []
        main: list[dict[str, Any]] = []
        for pool, count in STATIC_POOLS.items():
            base = ports.range(("127.0.0.1",), count)
            pod = {"name": pool, "model": model_of(pool), "profile": PROFILE, "replicas": count, "port": base}
            main.append({**pod, "adapters": [SHARED_MODEL]} if pool != "failopen" else pod)
            pods[pool] = {f"{pool}-{r}": f"127.0.0.1:{base + r}" for r in range(count)}
        specs.append(("fleet-main", "127.0.0.1", {"time_scale": 50.0, "pods": main}))
        dp_base = ports.range(DP_HOSTS, DP_RANKS)
        for index, host in enumerate(DP_HOSTS):
            name = f"dp{'ab'[index]}"
            spec = {"name": name, "model": model_of("dp-pool"), "profile": PROFILE, "replicas": DP_RANKS}
            specs.append((f"fleet-{name}", host, {"time_scale": 50.0, "pods": [{**spec, "port": dp_base}]}))
            pods["dp-pool"].update({f"{name}-{r}": f"{host}:{dp_base + r}" for r in range(DP_RANKS)})
            kube.apply(PODS, make_pod(name, labels={"app": "dp"}, ip=host))
        targets = [dp_base + r for r in range(DP_RANKS)]
        kube.apply(INFERENCE_POOLS, make_pool("dp-pool", selector={"app": "dp"}, port=targets))
        started = {
            name: fleets.submit(start_fleet, workdir / name, spec, timeout_s, host=host)
            for name, host, spec in specs
        }

        # EPPs (conformance test mode) and BBR (for our rendering).
        epp_ports = {pool: ports.one() for pool in pods}
        config = _gateway_config(pods, epp_ports)
        config_path = workdir / "gateway.yaml"
        config_path.write_text(yaml.safe_dump(config, sort_keys=False))
        python = sys.executable
        test_mode = [
            "--conformance-test-mode",
            "--i-understand-clients-choose-endpoints",
            "--drain-seconds",
            "0.5",
        ]
        tls = ["--tls-cert", str(certs.server_cert), "--tls-key", str(certs.server_key)]
        for pool in STATIC_POOLS:
            argv = [python, "-m", "epp", "--config", str(config_path), "--pool", pool]
            argv += ["--port", str(epp_ports[pool]), "--metrics-port", str(ports.one()), *tls, *test_mode]
            procs[f"epp-{pool}"] = _spawn(f"epp-{pool}", argv, workdir)
        health_port = ports.one()
        argv = [
            python,
            "-m",
            "epp",
            "--pool-name",
            "dp-pool",
            "--pool-namespace",
            "default",
            "--host",
            "127.0.0.1",
        ]
        argv += ["--grpc-port", str(epp_ports["dp-pool"]), "--grpc-health-port", str(health_port)]
        dp_metrics_port = ports.one()
        argv += ["--metrics-port", str(dp_metrics_port), "--cert-path", str(cert_dir), "--v=2", *test_mode]
        kubeconfig = write_kubeconfig(workdir / "kubeconfig", kube.url)
        procs["epp-dp-pool"] = _spawn("epp-dp-pool", argv, workdir, env={"KUBECONFIG": str(kubeconfig)})
        bbr_port = ports.one()
        procs["bbr"] = _spawn(
            "bbr", [python, "-m", "bbr", "--config", str(config_path), "--port", str(bbr_port), *tls], workdir
        )

        conf = Conformance(
            workdir,
            certs,
            kube,
            pods,
            epp_ports,
            procs=procs,
            dp_health_port=health_port,
            dp_metrics_port=dp_metrics_port,
        )
        admin = _start_gateways(conf, config, bbr_port, ports)
        for name, future in started.items():
            procs[name], listed = future.result()
            assert {p["address"] for p in listed} <= {a for pool in pods.values() for a in pool.values()}
        for name, port in [("bbr", bbr_port), *((f"epp-{p}", epp_ports[p]) for p in pods)]:
            wait_until(lambda port=port: grpc_serving(port, certs), timeout_s, name, procs[name].popen)
        for name, port in admin.items():
            wait_until(
                lambda port=port: httpx.get(f"http://127.0.0.1:{port}/ready", timeout=0.5).status_code == 200,
                timeout_s,
                name,
                procs[name].popen,
            )
        return conf
    except BaseException:
        for future in started.values() if "started" in locals() else ():
            if future.done() and future.exception() is None:
                future.result()[0].stop()
        for proc in procs.values():
            proc.stop()
        kube.stop()
        raise
    finally:
        fleets.shutdown(wait=True)


def _start_gateways(
    conf: Conformance, config: dict[str, Any], bbr_port: int, ports: _Ports
) -> dict[str, int]:
    """Spawn one Envoy per (configuration, Gateway); returns their admin ports."""
    backends = {
        pool: InferencePoolBackend(
            pool, tuple(pods.values()), ("127.0.0.1", conf.epp_ports[pool]), pool == "failopen"
        )
        for pool, pods in conf.pods.items()
    }
    admin: dict[str, int] = {}
    for config_name in CONFIGS:
        for gateway, rules in RULES.items():
            name = f"envoy-{config_name}-{gateway}"
            port, admin[name] = ports.one(), ports.one()
            if config_name == "ours":
                used = {pool for routes in rules.values() for pool, _ in routes}
                ours = dict(config, pools=[p for p in config["pools"] if p["name"] in used])
                topo = Topology(
                    listen_port=port,
                    admin_port=admin[name],
                    bbr=("127.0.0.1", bbr_port),
                    epps={p["name"]: ("127.0.0.1", p["epp"]["port"]) for p in ours["pools"]},
                    server_cert=None,
                    server_key=None,
                    extproc_tls=ExtProcTls(conf.certs.client_cert, conf.certs.client_key, conf.certs.ca),
                )
                bootstrap = render_bootstrap(parse_config(ours), topo)
            else:
                kept = []
                for path, pools in rules.items():
                    if config_name == "envoy-gateway" and len(pools) > 1:
                        conf.refused[(config_name, path)] = "several InferencePools on one rule"
                        continue
                    kept.append(Rule(path, pools))
                used = {pool for rule in kept for pool, _ in rule.backends}
                gw = Gateway(port, admin[name], tuple(kept), {p: backends[p] for p in sorted(used)})
                bootstrap = render(config_name, gw)  # type: ignore[arg-type]
            conf.procs[name] = _start_envoy(name, bootstrap, conf.workdir)
            conf.urls[(config_name, gateway)] = f"http://127.0.0.1:{port}"
    return admin


def completion(model: str, prompt: str = "Write as if you were a critic: San Francisco") -> dict[str, Any]:
    return {"model": model, "prompt": prompt, "max_tokens": 2}


def eventually(
    send: Callable[[], httpx.Response], ok: Callable[[httpx.Response], bool], within: float = 30.0
) -> httpx.Response:
    """Upstream's MakeRequestAndExpectEventuallyConsistentResponse: retry until `ok(response)`."""
    deadline = time.monotonic() + within
    last: httpx.Response | None = None
    while time.monotonic() < deadline:
        try:
            last = send()
            if ok(last):
                return last
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    detail = f"{last.status_code} {last.headers} {last.text[:300]}" if last is not None else "no response"
    raise AssertionError(f"no acceptable response within {within}s; last: {detail}")
