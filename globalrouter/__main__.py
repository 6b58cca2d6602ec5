"""`python -m globalrouter --config router.yaml --port 9100 --admin-port 9190 [--router-id r1]`

One global-router replica: the ext_proc service of the global Envoy and the ClusterReports
heartbeat service on `--port`; `/metrics`, `/debug/members`, `/healthz` on `--admin-port`.
`python -m globalrouter.envoy_config` renders the global Envoy bootstrap from the same file.
"""

from __future__ import annotations

import argparse
import asyncio
import logging

from extproc.server import add_tls_arguments, tls_from_arguments, wait_for_shutdown_signal
from gateway.service_cli import startup_errors_as_exit
from globalrouter.app import GlobalRouterApp
from globalrouter.config import load_config

log = logging.getLogger("globalrouter")


async def serve(args: argparse.Namespace) -> None:
    config = load_config(args.config)
    app = GlobalRouterApp(
        config,
        host=args.host,
        port=args.port,
        admin_port=args.admin_port,
        router_id=args.router_id,
        tls=tls_from_arguments(args),
    )
    await app.start()
    log.info(
        "global router %s listening on %s:%d (admin %d), %d members",
        app.router_id,
        args.host,
        app.port,
        app.admin_port,
        len(config.members),
    )
    await wait_for_shutdown_signal()
    await app.stop(args.drain_seconds)


def main() -> None:
    parser = argparse.ArgumentParser(prog="globalrouter", description="Global inference router (ext_proc)")
    parser.add_argument("--config", required=True, help="global router configuration YAML")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=9100)
    parser.add_argument("--admin-port", type=int, default=9190)
    parser.add_argument("--router-id", default=None, help="replica name shown in acks and /debug/members")
    parser.add_argument("--drain-seconds", type=float, default=2.0)
    parser.add_argument("--log-level", default="INFO")
    add_tls_arguments(parser)
    args = parser.parse_args()
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    with startup_errors_as_exit("globalrouter"):  # a bad --config, a port in use, a missing certificate
        asyncio.run(serve(args))


if __name__ == "__main__":
    main()
