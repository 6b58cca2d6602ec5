"""The command line every ext_proc service shares (BBR, EPP, the benchmark oracle)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, NoReturn

from extproc.server import StartupError, add_tls_arguments
from gateway.config import ConfigError
from gateway.heaptrace import add_tracemalloc_arguments, start_from_arguments

if TYPE_CHECKING:
    from gateway.config_store import ConfigStore
    from gateway.kube.config_resource import ConfigResourceWatcher

# Libraries that log every scrape or connection at INFO: the EPP scrapes 20 times a second.
_QUIET_LOGGERS = ("httpx", "httpcore", "kubernetes", "urllib3")


def service_parser(
    prog: str, description: str, *, default_port: int, config_required: bool = True
) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.set_defaults(prog=prog)  # run_service's error lines start with it
    parser.add_argument(
        "--config", required=config_required, help="gateway configuration YAML (hot-reloaded)"
    )
    parser.add_argument(
        "--config-resource",
        metavar="NAMESPACE/NAME",
        help="follow this InferenceGatewayConfig resource: while it exists it is the configuration "
        "(--config edits are not applied); absent or deleted, --config is",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=default_port, help="gRPC (ext_proc + health) port")
    parser.add_argument("--drain-seconds", type=float, default=5.0, help="grace period on SIGTERM")
    parser.add_argument("--log-level", default="INFO")
    add_tls_arguments(parser)
    add_tracemalloc_arguments(parser)
    return parser


EVENT_LOOPS = ("uvloop", "asyncio")


def add_event_loop_argument(parser: argparse.ArgumentParser) -> None:
    """`--event-loop`: uvloop by default (a service that scrapes hundreds of pods spends most
    of its CPU in socket reads and callbacks, ~25 % less with uvloop: docs/benchmarks/costs.md)."""
    parser.add_argument(
        "--event-loop",
        choices=EVENT_LOOPS,
        default="uvloop",
        help="asyncio event loop implementation (uvloop falls back to asyncio's when not installed)",
    )


def event_loop_factory(name: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The loop factory for `--event-loop NAME`; None = asyncio's default loop, also when
    uvloop is asked for and not installed (it is an optional speed-up, never a requirement)."""
    if name != "uvloop":
        return None
    try:
        import uvloop
    except ImportError:
        logging.getLogger(__name__).info("uvloop not installed: using asyncio's event loop")
        return None
    return uvloop.new_event_loop


def run_service(
    serve: Callable[[argparse.Namespace], Coroutine[Any, Any, None]], args: argparse.Namespace
) -> None:
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    for name in _QUIET_LOGGERS:
        logging.getLogger(name).setLevel(max(logging.WARNING, logging.getLogger().level))
    tracer = start_from_arguments(args)  # None unless asked for: no cost by default
    factory = event_loop_factory(getattr(args, "event_loop", "asyncio"))
    try:
        with startup_errors_as_exit(args.prog), asyncio.Runner(loop_factory=factory) as runner:
            runner.run(serve(args))
    finally:
        if tracer is not None:
            tracer.stop()


# Exit status of a service that could not start for a reason its user can fix (argparse's).
STARTUP_FAILED = 2


def exit_with_error(prog: str, message: str) -> NoReturn:
    """`<prog>: error: <message>` on one line of stderr, exit status 2 (argparse's format)."""
    print(f"{prog}: error: {' '.join(message.split())}", file=sys.stderr)
    raise SystemExit(STARTUP_FAILED)


@contextmanager
def startup_errors_as_exit(prog: str) -> Iterator[None]:
    """A misuse the user can fix (a bad or unreadable --config, a port in use, a missing
    certificate, no cluster) ends the command with one line saying what to do, not a
    traceback. Anything else is a bug and keeps its traceback."""
    try:
        yield
    except ConfigError as exc:
        exit_with_error(prog, f"configuration not loaded: {exc} (fix it or pass another --config)")
    except StartupError as exc:
        exit_with_error(prog, str(exc))


async def follow_config_resource(
    store: ConfigStore[Any], ref: str | None, *, write_status: bool = False
) -> ConfigResourceWatcher | None:
    """Watch `--config-resource` when one is named. The Kubernetes client is imported only
    then: a service that reads a file alone never loads it."""
    if not ref:
        return None
    from gateway.kube.config_resource import start_resource_watcher

    return await start_resource_watcher(store, ref, write_status=write_status)
