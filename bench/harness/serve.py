"""Keep one policy's router up in front of a scenario's simulated fleet, for any load generator.

`bench run` starts the fleet and the router, replays its own trace and stops them. `bench serve`
starts the same two (the same fleet spec and fleet options, the same policy target) and waits,
so that another tool (inference-perf, `vllm bench serve`, guidellm) or `bench run --policy url`
can be pointed at the very same gateway and pods. It prints, and writes to `--ready-file`, the
base URL, the CA bundle of an HTTPS listener, the pods' URLs and the model name, then serves
until SIGINT/SIGTERM or `--seconds`.

    python -m bench serve --scenario bench/scenarios/uniform.yaml --policy epp-default \\
        --ready-file /tmp/serve.json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.harness.fleet import FleetNeeds, FleetUnavailable, fleet_with, running_fleet_pods
from bench.harness.scenario import Scenario
from bench.harness.targets import POLICIES, TargetContext, fleet_needs, load_plugins, make_target


def ready_info(
    base_url: str, work_dir: Path, pods: list[dict[str, Any]], scenario: Scenario, policy: str
) -> dict[str, Any]:
    """What a load generator needs to reach the router (and, for `bench run --worker-urls`, the pods)."""
    ca = next(iter(sorted(work_dir.rglob("ca.pem"))), None)
    return {
        "base_url": base_url,
        "ca_file": str(ca) if ca and base_url.startswith("https") else None,
        "worker_urls": [f"http://{pod['address']}" for pod in pods],
        "model": scenario.workload.get("model"),
        "scenario": scenario.name,
        "policy": policy,
    }


async def _until_stopped(seconds: float | None) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), seconds)


async def serve(
    scenario: Scenario, policy: str, options: dict[str, str], ready_file: str | None, seconds: float | None
) -> int:
    load_plugins()
    if policy not in POLICIES:
        print(f"unknown policy {policy!r}; known: {', '.join(sorted(POLICIES))}", file=sys.stderr)
        return 2
    needs: FleetNeeds = fleet_needs([policy])
    work_dir = Path(tempfile.mkdtemp(prefix=f"bench-serve-{scenario.name}-"))
    try:
        async with running_fleet_pods(fleet_with(scenario.fleet, needs)) as pods:
            urls = [f"http://{pod['address']}" for pod in pods]
            target = make_target(policy, TargetContext(urls, work_dir, scenario, options, pods, needs))
            base_url = await target.start()
            try:
                info = ready_info(base_url, work_dir, pods, scenario, policy)
                text = json.dumps(info, indent=1)
                print(text, flush=True)
                if ready_file:
                    await asyncio.to_thread(Path(ready_file).write_text, text + "\n")
                await _until_stopped(seconds)
            finally:
                await target.stop()
    except FleetUnavailable as exc:
        print(str(exc), file=sys.stderr)
        return 2
    return 0


def add_parser(sub: Any, modes: tuple[str, ...]) -> argparse.ArgumentParser:
    srv: argparse.ArgumentParser = sub.add_parser(
        "serve", help="keep a scenario's fleet and one policy's router up for another load generator"
    )
    srv.add_argument("--scenario", required=True)
    srv.add_argument("--policy", required=True)
    srv.add_argument("--mode", choices=modes, default="quick")
    srv.add_argument(
        "--target-opt", action="append", default=[], help="key=value passed to the policy target"
    )
    srv.add_argument("--ready-file", help="also write the URLs (JSON) here once the router is up")
    srv.add_argument("--seconds", type=float, help="stop after this long (default: at SIGINT/SIGTERM)")
    return srv
