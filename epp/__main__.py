"""`python -m epp --config gateway.yaml --pool NAME --port 9002 --metrics-port 9090`"""

from __future__ import annotations

import argparse
import asyncio
import logging

from epp.app import EppApp
from extproc.server import add_tls_arguments, tls_from_arguments, wait_for_shutdown_signal
from gateway.config_resource import add_config_resource_argument, start_resource_watcher

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
    resource = await start_resource_watcher(app.store, args.config_resource)
    log.info(
        "epp for pool %s listening on %s:%d (metrics %d)", args.pool, args.host, app.port, app.metrics_port
    )
    await wait_for_shutdown_signal()
    if resource is not None:
        await resource.stop()
    await app.stop(args.drain_seconds)


def main() -> None:
    parser = argparse.ArgumentParser(prog="epp", description="Endpoint Picker (Envoy ext_proc)")
    parser.add_argument("--config", required=True, help="gateway configuration YAML")
    parser.add_argument("--pool", required=True, help="the pool this EPP serves")
    add_config_resource_argument(parser)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=9002)
    parser.add_argument("--metrics-port", type=int, default=9090)
    parser.add_argument("--drain-seconds", type=float, default=5.0)
    parser.add_argument("--log-level", default="INFO")
    add_tls_arguments(parser)
    args = parser.parse_args()
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    asyncio.run(serve(args))


if __name__ == "__main__":
    main()
