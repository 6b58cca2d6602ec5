"""`make run`: the whole gateway on this machine until Ctrl-C.

Starts a simulated fleet (two models, two pods each), one EPP for every pool (the single-hop
shape: one ext_proc stream per request; `--two-hop` runs BBR and one EPP per pool instead) and a
real Envoy on HTTPS, prints a request that works, and stops every process on exit.
"""

from __future__ import annotations

import argparse
import signal
import sys
import tempfile
import threading
from pathlib import Path

import yaml

from devstack.launch import DEFAULT_FLEET, POOL_KINDS, dev_trust, start_local_gateway


def main() -> None:
    parser = argparse.ArgumentParser(prog="devstack.run", description=__doc__)
    parser.add_argument("--port", type=int, default=8443, help="HTTPS port (0 = any free port)")
    parser.add_argument("--fleet", type=Path, help="modelsim fleet YAML (default: 2 models x 2 pods)")
    parser.add_argument("--workdir", type=Path, help="where configs, certificates and logs go")
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
    args = parser.parse_args()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="inference-gateway-"))
    fleet = yaml.safe_load(args.fleet.read_text()) if args.fleet else DEFAULT_FLEET
    print(f"starting the gateway (work directory {workdir}) ...", flush=True)
    # Local development: the decision header and the chat/batch objectives are open to any client.
    gw = start_local_gateway(
        workdir,
        fleet=fleet,
        listen_port=args.port,
        mtls=args.mtls,
        pool_kind=args.pool_kind,
        config_patch=dev_trust,
        single_hop=args.single_hop,
    )
    stop = threading.Event()
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        models = sorted({p["model"] for p in gw.pods})
        path = "one EPP for every pool (single hop)" if gw.single_hop else "BBR -> EPP per pool"
        print(
            f"""
The gateway is up: Envoy on {gw.url} -> {path} -> {len(gw.pods)} simulated pods.

Send a request (any of the models: {", ".join(models)}):

  curl --cacert {gw.certs.ca} {gw.url}/v1/chat/completions \\
    -H 'content-type: application/json' \\
    -d '{{"model": "{models[0]}", "messages": [{{"role": "user", "content": "Hello!"}}], "max_tokens": 32}}'

Add -H 'x-gateway-decision: true' -i to see the EPP's per-pod scores (open to any client
here, for local development only), or -H 'x-gateway-inference-objective: batch' to pick a scheduling profile.
Configuration (hot-reloaded): {gw.config_path}
Logs: {workdir / "logs"}   EPP metrics: {", ".join(f"http://127.0.0.1:{p}/metrics" for p in gw.epp_metrics_ports.values())}
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


if __name__ == "__main__":
    main()
