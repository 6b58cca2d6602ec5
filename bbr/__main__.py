"""`python -m bbr --config gateway.yaml --port 9004`"""

from __future__ import annotations

import argparse
import asyncio
import logging

from bbr.router import BodyRouter
from bbr.service import BbrProcessor
from extproc.server import add_tls_arguments, start_grpc_service, tls_from_arguments, wait_for_shutdown_signal
from extproc.stream import ExtProcServicer
from gateway.config_resource import add_config_resource_argument, start_resource_watcher
from gateway.config_store import ConfigStore, FileWatcher

log = logging.getLogger("bbr")


async def serve(args: argparse.Namespace) -> None:
    store = ConfigStore.from_file(args.config)
    router = BodyRouter(store.current)
    servicer = ExtProcServicer(lambda: BbrProcessor(router, store.current), name="bbr")
    service = await start_grpc_service(servicer, host=args.host, port=args.port, tls=tls_from_arguments(args))
    watcher = asyncio.create_task(FileWatcher(store, args.config).run())
    resource = await start_resource_watcher(store, args.config_resource)
    log.info("bbr listening on %s:%d", args.host, service.port)
    await wait_for_shutdown_signal()
    watcher.cancel()
    if resource is not None:
        await resource.stop()
    await service.drain_and_stop(args.drain_seconds)


def main() -> None:
    parser = argparse.ArgumentParser(prog="bbr", description="Body-Based Router (Envoy ext_proc)")
    parser.add_argument("--config", required=True, help="gateway configuration YAML")
    add_config_resource_argument(parser)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=9004)
    parser.add_argument("--drain-seconds", type=float, default=5.0)
    parser.add_argument("--log-level", default="INFO")
    add_tls_arguments(parser)
    args = parser.parse_args()
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    asyncio.run(serve(args))


if __name__ == "__main__":
    main()
