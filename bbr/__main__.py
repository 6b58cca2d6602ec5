"""`python -m bbr --config gateway.yaml --port 9004 [--metrics-port 9090]
[--inference-model-rewrites NAMESPACE]`"""

from __future__ import annotations

import argparse
import logging

from prometheus_client import REGISTRY, generate_latest

from bbr.router import BodyRouter
from bbr.service import BbrProcessor
from extproc.server import check_port_free, start_grpc_service, tls_from_arguments, wait_for_shutdown_signal
from extproc.stream import ExtProcServicer
from gateway.admin_http import start_admin_http
from gateway.config import GatewayConfig
from gateway.config_store import ConfigStore, FileWatcher
from gateway.kube.llmd_api import add_api_group_argument
from gateway.service_cli import follow_config_resource, run_service, service_parser
from gateway.supervise import spawn
from gateway.tracing import Tracing

log = logging.getLogger("bbr")


async def serve(args: argparse.Namespace) -> None:
    store = ConfigStore.from_file(args.config, GatewayConfig)
    router = BodyRouter(store.current)
    tracing = Tracing.from_config(store.current().tracing, "inference-gateway-bbr")  # read once
    store.subscribe(tracing.warn_on_change(store.current().tracing))
    servicer = ExtProcServicer(lambda: BbrProcessor(router, store.current, tracing), name="bbr")
    # Ports first, then the Kubernetes followers (no cluster is an error; they start at once),
    # then the servers: nothing is left half-started when one of them fails.
    check_port_free(args.host, args.port, "--port")
    if args.metrics_port is not None:
        check_port_free(args.host, args.metrics_port, "--metrics-port")
    resource = await follow_config_resource(store, args.config_resource)
    rewrites = None
    if args.inference_model_rewrites:
        from gateway.kube.model_rewrite_source import follow_model_rewrites  # loads the kubernetes client

        rewrites = await follow_model_rewrites(
            router, store.current, args.inference_model_rewrites, group=args.llm_d_api_group
        )
    service = await start_grpc_service(servicer, host=args.host, port=args.port, tls=tls_from_arguments(args))
    admin = None
    if args.metrics_port is not None:  # the config verdicts: gateway_config_reloads_total
        admin, metrics_port = await start_admin_http(
            args.host, args.metrics_port, metrics=lambda: generate_latest(REGISTRY), views={}
        )
        log.info("bbr metrics on %s:%d", args.host, metrics_port)
    watcher = spawn("config-file", f"config watch {args.config}", FileWatcher(store, args.config).run)
    log.info("bbr listening on %s:%d", args.host, service.port)
    await wait_for_shutdown_signal()
    watcher.cancel()
    for follower in (resource, rewrites):
        if follower is not None:
            await follower.stop()
    await service.drain_and_stop(args.drain_seconds)
    if admin is not None:
        await admin.cleanup()
    tracing.shutdown()


def main() -> None:
    parser = service_parser("bbr", "Body-Based Router (Envoy ext_proc)", default_port=9004)
    parser.add_argument(
        "--inference-model-rewrites",
        metavar="NAMESPACE",
        help="follow the InferenceModelRewrite resources of this namespace (renames and weighted "
        "splits; a matching rule wins over the model's configured rewrites)",
    )
    parser.add_argument(
        "--metrics-port",
        type=int,
        help="serve /metrics (config reloads by result) and /healthz on this port (default: off)",
    )
    add_api_group_argument(parser)
    run_service(serve, parser.parse_args())


if __name__ == "__main__":
    main()
