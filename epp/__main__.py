"""`python -m epp --config gateway.yaml --pool NAME --port 9002 --metrics-port 9090`"""

from __future__ import annotations

import argparse
import logging

from epp.app import EppApp
from extproc.server import tls_from_arguments, wait_for_shutdown_signal
from gateway.service_cli import follow_config_resource, run_service, service_parser

log = logging.getLogger("epp")


async def serve(args: argparse.Namespace) -> None:
    app = EppApp(
        args.config,
        args.pool,
        host=args.host,
        port=args.port,
        metrics_port=args.metrics_port,
        tls=tls_from_arguments(args),
    )
    await app.start()
    resource = await follow_config_resource(app.store, args.config_resource)
    log.info(
        "epp for pool %s listening on %s:%d (metrics %d)", args.pool, args.host, app.port, app.metrics_port
    )
    await wait_for_shutdown_signal()
    if resource is not None:
        await resource.stop()
    await app.stop(args.drain_seconds)


def main() -> None:
    parser = service_parser("epp", "Endpoint Picker (Envoy ext_proc)", default_port=9002)
    parser.add_argument("--pool", required=True, help="the pool this EPP serves")
    parser.add_argument("--metrics-port", type=int, default=9090, help="/metrics and /debug/pool")
    run_service(serve, parser.parse_args())


if __name__ == "__main__":
    main()
