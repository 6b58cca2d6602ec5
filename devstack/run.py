"""`make run`: the whole gateway on this machine until Ctrl-C.

Starts a simulated fleet (two models, two pods each; `--engine llama.cpp`: llama.cpp's real
`llama-server` processes serving a tiny generated model, docs/llamacpp.md), one EPP for every pool (the single-hop
shape: one ext_proc stream per request; `--two-hop` runs BBR and one EPP per pool instead) and a
real Envoy on HTTPS, prints a request that works, and stops every process on exit. The work
directory (certificates, the live config, logs) is a fresh temporary one, removed on exit
unless `--keep` (or `--workdir`, which is never removed) says otherwise.
"""

from __future__ import annotations

import argparse
import shutil
import signal
import sys
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from devstack.launch import DEFAULT_FLEET, POOL_KINDS, Proc, dev_trust, start_local_gateway
from devstack.llamacpp.server import (
    ServerSpec,
    engine_version,
    missing_engine,
    start_llama_servers,
    with_model_tokenizer,
)
from devstack.pd import PD_FLEET, start_pd_gateway
from epp.workers.processes import workers_argument
from extproc.server import StartupError, check_port_free
from gateway.config import ConfigError
from gateway.profiles import BUILTIN_PROFILES
from gateway.service_cli import exit_with_error

PROG = "devstack.run"


def main() -> None:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__)
    parser.add_argument("--port", type=int, default=8443, help="HTTPS port (0 = any free port)")
    parser.add_argument("--fleet", type=Path, help="modelsim fleet YAML (default: 2 models x 2 pods)")
    parser.add_argument(
        "--engine",
        choices=ENGINES,
        default="modelsim",
        help="the model servers: modelsim (simulated GPUs, the default) or llama.cpp (real "
        "llama-server processes on the CPU, built by `make llama-server`)",
    )
    parser.add_argument(
        "--llama-servers",
        type=int,
        default=2,
        choices=range(1, 9),
        metavar="N",
        help="with --engine llama.cpp: how many llama-server processes (default 2)",
    )
    parser.add_argument(
        "--workdir",
        type=Path,
        help="where configs, certificates and logs go (kept on exit; default: a temporary one)",
    )
    parser.add_argument(
        "--keep",
        action="store_true",
        help="keep the temporary work directory on exit (it is removed by default)",
    )
    parser.add_argument("--mtls", action="store_true", help="mTLS between Envoy and the ext_proc services")
    parser.add_argument(
        "--pool-kind",
        choices=POOL_KINDS,
        default="static",
        help="pool clusters: static (OverrideHost) or original_dst (as in Kubernetes)",
    )
    shape = parser.add_mutually_exclusive_group()
    shape.add_argument(
        "--single-hop",
        dest="single_hop",
        action="store_true",
        default=True,
        help="one EPP for every pool and one ext_proc hop per request, no BBR (the default)",
    )
    shape.add_argument(
        "--two-hop",
        dest="single_hop",
        action="store_false",
        help="BBR, then each pool's own EPP (the shape a Gateway API implementation runs)",
    )
    parser.add_argument(
        "--workers",
        type=workers_argument,
        default=1,
        help="each EPP's ext_proc worker processes (epp.workers: a count or 'auto'; default 1, "
        "one process, which keeps a 2-core machine's `make run` light)",
    )
    parser.add_argument(
        "--pd",
        action="store_true",
        help="disaggregated prefill/decode: prefill and decode pods, a P/D sidecar per decode pod",
    )
    args = parser.parse_args()
    llama = args.engine == "llama.cpp"
    if llama:
        if args.fleet or args.pd:
            exit_with_error(
                PROG, "--engine llama.cpp runs llama-server processes: --fleet and --pd do not apply"
            )
        why = missing_engine()
        if why:
            exit_with_error(PROG, why)
    fleet = read_fleet(args.fleet) if args.fleet else PD_FLEET if args.pd else DEFAULT_FLEET
    try:
        check_port_free("127.0.0.1", args.port, "--port")
    except StartupError as exc:
        exit_with_error(PROG, str(exc))
    temporary = args.workdir is None
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="inference-gateway-"))
    remove = temporary and not args.keep
    print(
        f"starting the gateway (work directory {workdir}: "
        f"{'removed on exit, --keep keeps it' if remove else 'kept on exit'}) ...",
        flush=True,
    )
    engines: dict[str, Proc] = {}
    try:
        # Local development: the decision header and the chat/batch objectives are open to any client.
        start = start_pd_gateway if args.pd else start_local_gateway
        backends: dict[str, Any] = {"fleet": fleet, "config_patch": dev_trust}
        if llama:
            engines, pods = start_llama_servers(workdir, [ServerSpec()] * args.llama_servers)
            backends = {"pods": pods, "config_patch": _both(dev_trust, with_model_tokenizer)}
        gw = start(
            workdir,
            listen_port=args.port,
            mtls=args.mtls,
            pool_kind=args.pool_kind,
            single_hop=args.single_hop,
            config_extra=default_profile_block(),
            **backends,
            **({"epp_workers": args.workers} if args.workers != 1 else {}),
        )
        gw.procs.update(engines)  # stopped with the gateway
    except (ConfigError, RuntimeError, TimeoutError, OSError) as exc:  # kept: its logs say why
        for proc in engines.values():
            proc.stop()
        exit_with_error(PROG, f"the gateway did not start: {exc}; its logs are kept in {workdir / 'logs'}")
    except KeyboardInterrupt:  # Ctrl-C while starting: what started is already stopped
        for proc in engines.values():
            proc.stop()
        if remove:
            shutil.rmtree(workdir, ignore_errors=True)
        exit_with_error(PROG, "interrupted while starting")
    stop = threading.Event()
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        models = sorted({p["model"] for p in gw.pods})
        metrics = [f"http://127.0.0.1:{p}/metrics" for p in gw.epp_metrics_ports.values()]
        if gw.bbr_metrics_port:
            metrics.insert(0, f"http://127.0.0.1:{gw.bbr_metrics_port}/metrics")
        path = "one EPP for every pool (single hop)" if gw.single_hop else "BBR -> EPP per pool"
        if args.pd:
            path += " -> P/D sidecars of the decode pods"
        servers = f"llama-server processes ({engine_version()})" if llama else "simulated pods"
        print(
            f"""
The gateway is up: Envoy on {gw.url} -> {path} -> {len(gw.pods)} {servers}.

Send a request (any of the models: {", ".join(models)}):

  curl --cacert {gw.certs.ca} {gw.url}/v1/chat/completions \\
    -H 'content-type: application/json' \\
    -d '{{"model": "{models[0]}", "messages": [{{"role": "user", "content": "Hello!"}}], "max_tokens": 32}}'

Anthropic's Messages API too: the same with {gw.url}/v1/messages (and "max_tokens" required),
or the official anthropic client with base_url="{gw.url}" (README, "The APIs served").

Add -H 'x-gateway-decision: true' -i to see the EPP's choice (the chosen pod, then every pod's
scores; open to any client here, for local development only), or
-H 'x-gateway-inference-objective: batch' to pick a scheduling profile.
Configuration (hot-reloaded by the services and, over xDS, by Envoy: add a model and it is served;
edit the default profile's weights under profiles:): {gw.config_path}
Profiles and weights in force: {", ".join(f"http://127.0.0.1:{p}/debug/pool" for p in gw.epp_metrics_ports.values())}
Logs: {workdir / "logs"}   Metrics: {", ".join(metrics)}
Work directory: {workdir} ({"removed on exit; --keep keeps it" if remove else "kept on exit"})
Press Ctrl-C to stop.""",
            flush=True,
        )
        while not stop.wait(0.5):
            dead = [name for name, proc in gw.procs.items() if proc.popen.poll() is not None]
            if dead:
                print(
                    f"process(es) exited unexpectedly: {', '.join(dead)}; see {workdir / 'logs'}",
                    file=sys.stderr,
                )
                break
    finally:
        print("stopping ...", flush=True)
        gw.stop()
        if remove:
            shutil.rmtree(workdir, ignore_errors=True)
            print(f"removed {workdir} (--keep keeps it)", flush=True)


ENGINES = ("modelsim", "llama.cpp")


def _both(*patches: Callable[[dict[str, Any]], None]) -> Callable[[dict[str, Any]], None]:
    def patch(config: dict[str, Any]) -> None:
        for p in patches:
            p(config)

    return patch


def default_profile_block() -> dict[str, Any]:
    """The live config's `profiles:` block: the shipped default profile's weights, written out
    so that tuning one is an edit of the file (hot-reloaded), not a read of the source first.
    Only the weights: the profile's thresholds stay the pool-wide ones."""
    weights = {k: int(w) if w.is_integer() else w for k, w in BUILTIN_PROFILES["default"].weights.items()}
    return {"profiles": {"default": {"weights": weights}}}


def read_fleet(path: Path) -> Any:
    """The `--fleet` YAML, or a one-line error saying why it cannot be used."""
    try:
        fleet = yaml.safe_load(path.read_text())
    except OSError as exc:
        exit_with_error(
            PROG, f"cannot read --fleet {path} ({exc.strerror or exc}): pass a readable fleet YAML"
        )
    except yaml.YAMLError as exc:
        exit_with_error(PROG, f"--fleet {path} is not valid YAML: {exc}")
    if not isinstance(fleet, dict):
        exit_with_error(
            PROG, f"--fleet {path}: the top level must be a mapping (see modelsim's fleet format)"
        )
    return fleet


if __name__ == "__main__":
    main()
