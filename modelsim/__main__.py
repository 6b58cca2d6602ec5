"""Command line: ``python -m modelsim serve ...`` (one pod) or ``fleet --spec fleet.yaml``."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import signal
import sys
from pathlib import Path

from modelsim.fleet import DEFAULT_PROFILE, FleetSpec, SpecError, run_fleet

log = logging.getLogger("modelsim")


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="modelsim", description="vLLM-like model-server simulator")
    sub = ap.add_subparsers(dest="cmd", required=True)
    fleet = sub.add_parser("fleet", help="serve every pod of a fleet spec from one process")
    fleet.add_argument("--spec", required=True, type=Path, help="fleet YAML (pods, time_scale, profiles)")
    fleet.add_argument("--host", default="127.0.0.1")
    fleet.add_argument("--ready-file", type=Path, help="write pod addresses as JSON here once all listen")
    fleet.add_argument("--time-scale", type=float, help="override the spec's time_scale")
    serve = sub.add_parser("serve", help="serve one pod")
    serve.add_argument("--model", required=True)
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--name", help="pod name (default: <model>-0)")
    serve.add_argument("--adapters", default="", help="comma-separated LoRA adapter names")
    serve.add_argument("--profile", default=DEFAULT_PROFILE)
    serve.add_argument("--dialect", default="vllm")
    serve.add_argument("--time-scale", type=float, default=1.0)
    serve.add_argument("--ready-file", type=Path)
    serve.add_argument(
        "--kv-events-config",
        help='vLLM\'s KV-event JSON, e.g. \'{"enable_kv_cache_events": true, "publisher": "zmq", '
        '"endpoint": "tcp://127.0.0.1:5557", "replay_endpoint": "tcp://127.0.0.1:5558"}\' (off by default)',
    )
    serve.add_argument(
        "--tokenizer",
        help="the model's tokenizer folder (tokenizer.json + tokenizer_config.json) or a shipped "
        "name (sim-llama3-12k); default: approximate token ids",
    )
    cap = sub.add_parser("capacity", help="measure how many pods / req/s one process holds accurately")
    cap.add_argument("--pods", type=int, nargs="+", default=[1, 4, 8])
    cap.add_argument("--rates", type=float, nargs="+", default=[10, 40, 80])
    cap.add_argument("--duration", type=float, default=8.0)
    cap.add_argument("--time-scale", type=float, default=1.0)
    return ap


async def _serve_fleet(spec: FleetSpec, host: str, ready_file: Path | None) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with run_fleet(spec, host=host) as fleet:
        info = fleet.ready_info()
        text = json.dumps(info)
        if ready_file is not None:
            tmp = ready_file.with_suffix(ready_file.suffix + ".tmp")
            tmp.write_text(text)
            tmp.replace(ready_file)
        log.info("modelsim fleet ready: %s", text)
        await stop.wait()
        log.info("modelsim fleet stopping")


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    args = _parser().parse_args(argv)
    try:
        if args.cmd == "capacity":
            from modelsim.capacity import run_capacity

            return asyncio.run(run_capacity(args.pods, args.rates, args.duration, args.time_scale))
        if args.cmd == "fleet":
            data = FleetSpec.from_yaml(args.spec)
            if args.time_scale is not None:
                data = FleetSpec(pods=data.pods, time_scale=args.time_scale, profiles=data.profiles)
            spec, host = data, args.host
        else:
            adapters = [a for a in args.adapters.split(",") if a]
            pod = {"name": args.name or f"{args.model}-0", "model": args.model, "adapters": adapters,
                   "profile": args.profile, "dialect": args.dialect, "port": args.port}  # fmt: skip
            if args.kv_events_config:
                pod["kv_events"] = args.kv_events_config
            if args.tokenizer:
                pod["tokenizer"] = args.tokenizer
            spec, host = FleetSpec.from_dict({"time_scale": args.time_scale, "pods": [pod]}), args.host
        if spec.time_scale <= 0:
            raise SpecError("time_scale must be > 0")
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(_serve_fleet(spec, host, args.ready_file))
    except (SpecError, OSError) as exc:
        log.error("%s", exc)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
