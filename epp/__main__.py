"""`python -m epp --config gateway.yaml --pool NAME --port 9002 --metrics-port 9090
[--inference-objectives NAMESPACE[/INFERENCEPOOL]]`, or the reference EPP's contract:
`python -m epp --pool-name NAME --pool-namespace NS` (gRPC ext_proc on 9002, gRPC health on
9003, metrics on 9090; see epp/reference_flags.py and docs/architecture.md, "Compatibility with the
reference EPP")."""

from __future__ import annotations

import argparse
import logging

from epp import reference_flags
from epp.app import EppApp
from epp.workers.processes import add_workers_argument, worker_options
from extproc.server import wait_for_shutdown_signal
from gateway.kube.llmd_api import add_api_group_argument, parse_watch_ref
from gateway.service_cli import add_event_loop_argument, follow_config_resource, run_service, service_parser

log = logging.getLogger("epp")


async def serve(args: argparse.Namespace) -> None:
    launch = reference_flags.resolve(args)
    app = EppApp(
        launch.config_path,
        launch.pool,
        host=launch.host,
        port=args.port,
        metrics_port=args.metrics_port,
        tls=launch.tls,
        health_port=launch.health_port,
        kubernetes=launch.kubernetes,
        conformance_test_mode=launch.conformance_test_mode,
        workers=args.workers,
        worker_options=worker_options(args),
    )
    await app.start()
    if args.inference_objectives:
        namespace, pool = args.inference_objectives
        await app.objectives.follow(namespace, pool, group=args.llm_d_api_group)
    resource = await follow_config_resource(app.store, args.config_resource)
    log.info(
        "epp for pool %s listening on %s:%d (metrics %d%s)",
        launch.pool,
        launch.host,
        app.port,
        app.metrics_port,
        f", gRPC health {app.health_port}" if app.health is not None else "",
    )
    await wait_for_shutdown_signal()
    if resource is not None:
        await resource.stop()
    await app.stop(args.drain_seconds)


def main() -> None:
    parser = service_parser(
        "epp", "Endpoint Picker (Envoy ext_proc)", default_port=9002, config_required=False
    )
    parser.add_argument("--pool", help="the pool this EPP serves (a pool of --config)")
    parser.add_argument("--metrics-port", type=int, default=9090, help="/metrics and /debug/pool")
    parser.add_argument(
        "--inference-objectives",
        metavar="NAMESPACE[/INFERENCEPOOL]",
        help="follow the InferenceObjective resources of this namespace that reference this pool "
        "(by default the pool's kubernetes.poolName, else its name); the header "
        "x-gateway-inference-objective naming one sets the request's priority",
    )
    add_workers_argument(parser, "the pool's epp.workers")
    add_api_group_argument(parser)
    add_event_loop_argument(parser)
    reference_flags.add_arguments(parser)
    args = reference_flags.parse(parser)
    if args.inference_objectives:
        try:
            args.inference_objectives = parse_watch_ref(args.inference_objectives, "--inference-objectives")
        except ValueError as exc:
            parser.error(str(exc))
    run_service(serve, args)


if __name__ == "__main__":
    main()
