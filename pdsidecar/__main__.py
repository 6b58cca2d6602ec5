"""``python -m pdsidecar --decoder http://127.0.0.1:8200 --port 8000 --allow-file pool-hosts``."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import sys
from typing import NoReturn
from urllib.parse import urlsplit

from aiohttp import web

from pdsidecar.allowlist import AllowList
from pdsidecar.proxy import Sidecar, SidecarConfig

PROG = "pdsidecar"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__)
    p.add_argument("--host", default="0.0.0.0", help="listen address (the pod's serving port)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--decoder", required=True, help="the local decode engine's base URL")
    p.add_argument(
        "--allow", action="append", default=[], metavar="HOST", help="a prefill pod host (repeatable)"
    )
    p.add_argument("--allow-file", help="file of prefill pod hosts, one a line; re-read when it changes")
    p.add_argument(
        "--allow-pods",
        metavar="NAMESPACE/SELECTOR",
        help="allow the Running pods this label selector matches (e.g. llm/app=llama,llm-d.ai/role=prefill)",
    )
    p.add_argument("--prefill-timeout", type=float, default=300.0, help="seconds a prefill may take")
    p.add_argument("--log-level", default="INFO")
    return p.parse_args(argv)


def _fail(message: str) -> NoReturn:
    print(f"{PROG}: error: {message}", file=sys.stderr)
    raise SystemExit(2)


async def serve(args: argparse.Namespace) -> None:
    decoder = urlsplit(args.decoder)
    if decoder.scheme not in ("http", "https") or not decoder.hostname:
        _fail(f"--decoder {args.decoder!r} is not an http(s) URL")
    if not args.allow and not args.allow_file and not args.allow_pods:
        _fail("no prefill pod is allowed: pass --allow HOST, --allow-file FILE or --allow-pods NS/SELECTOR")
    try:
        allow = AllowList(args.allow, args.allow_file)
    except OSError as exc:
        _fail(f"cannot read --allow-file: {exc.strerror or exc}")
    watch = None
    if args.allow_pods:
        from extproc.server import StartupError
        from pdsidecar.kube_allow import follow_pods

        try:
            watch = await asyncio.to_thread(follow_pods, allow, args.allow_pods)
        except (ValueError, StartupError) as exc:
            _fail(str(exc))
    config = SidecarConfig(args.decoder.rstrip("/"), allow, prefill_timeout_s=args.prefill_timeout)
    sidecar = Sidecar(config)
    runner = web.AppRunner(sidecar.app(), access_log=None, handler_cancellation=True)
    await runner.setup()
    try:
        site = web.TCPSite(runner, args.host, args.port)
        try:
            await site.start()
        except OSError as exc:
            _fail(f"cannot listen on {args.host}:{args.port}: {exc.strerror or exc}")
        print(f"{PROG}: listening on {args.host}:{args.port}, decoder {config.decoder_url}", flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError):
                loop.add_signal_handler(sig, stop.set)
        await stop.wait()
    finally:
        await runner.cleanup()
        await sidecar.close()
        if watch is not None:
            watch.stop()


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    asyncio.run(serve(args))


if __name__ == "__main__":
    main()
