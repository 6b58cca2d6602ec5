"""The benchmarks' oracle endpoint picker: ask every pod, take the lowest predicted TTFT.

Not a product: it reads the simulator's exact state (`POST /sim/probe-fleet`: every pod of
the simulator process in one call; `POST /sim/probe` on each pod it did not cover) instead of
scraped metrics. It is a reference, not a bound: it is greedy
per request (no look-ahead), requests probing at the same moment see the same state and can
herd onto one pod, and a metrics-based picker can beat it (one did in mixed-gpu).

Its probes cost HTTP round trips a picker with in-process state would not pay. The time spent
probing is measured per request and returned to the client in the `x-bench-probe-s` response
header (bench.harness.loadgen.PROBE_HEADER); the runner subtracts it from the oracle's TTFT and E2E
and reports it apart, so its TTFT is not charged with its own measurement.

It speaks the same ext_proc protocol and CLI as the EPP
(`python -m bench.harness.oracle --config gateway.yaml --pool NAME --port N [--metrics-port N]`), so
`start_local_gateway(..., epp_module="bench.harness.oracle")` drops it in behind the real Envoy.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp

from bench.harness.loadgen import PROBE_HEADER
from epp.requestcontrol.processor import METADATA_NAMESPACE
from extproc.body import decode_json_object
from extproc.errors import ErrorResponse, unavailable
from extproc.headers import DESTINATION_HEADER, MODEL_HEADER
from extproc.server import start_grpc_service, tls_from_arguments, wait_for_shutdown_signal
from extproc.stream import ExtProcServicer, RequestOnlyProcessor, RequestRoute
from gateway.config import GatewayConfig
from gateway.config_store import ConfigStore
from gateway.service_cli import run_service, service_parser

log = logging.getLogger("bench.harness.oracle")

PROBE_TIMEOUT_S = 2.0


@dataclass(frozen=True, slots=True)
class Probe:
    address: str
    predicted_ttft_s: float
    running: int


def best_probe(probes: Sequence[Probe], rng: random.Random | None = None) -> Probe | None:
    """Lowest predicted TTFT; ties (idle pods) go to the smaller decode batch, then at random."""
    if not probes:
        return None
    key = min((p.predicted_ttft_s, p.running) for p in probes)
    tied = [p for p in probes if (p.predicted_ttft_s, p.running) == key]
    return (rng or random).choice(tied)


class OraclePicker:
    """Shared by all streams of one process: the pool's pods and one HTTP client."""

    def __init__(self, config: GatewayConfig, pool_name: str, client: aiohttp.ClientSession) -> None:
        self.config = config
        self.pool = config.pool(pool_name)
        self.pool_name = pool_name
        self.client = client
        self.rng = random.Random(0)

    def candidates(self, model: str) -> list[str]:
        route = self.config.routes().get(model)
        if route is None or route.pool != self.pool_name:
            return []
        out = []
        for ep in self.pool.endpoints:
            if route.adapter is not None and ep.adapters is not None and route.adapter not in ep.adapters:
                continue
            out.append(ep.address)
        return out

    async def _post(self, address: str, path: str, body: bytes) -> Any:
        """The JSON answer of one probe call; None when the pod cannot answer."""
        try:
            async with self.client.post(
                f"http://{address}{path}",
                data=body,
                headers={"content-type": "application/json"},
                timeout=aiohttp.ClientTimeout(total=PROBE_TIMEOUT_S),
            ) as reply:
                return json.loads(await reply.read()) if reply.status == 200 else None
        except (aiohttp.ClientError, TimeoutError, ValueError):
            return None

    async def probe(self, address: str, body: bytes) -> Probe | None:
        data = await self._post(address, "/sim/probe", body)
        try:
            return Probe(address, float(data["predicted_ttft_s"]), int(data["running"]))
        except (KeyError, TypeError, ValueError):
            return None  # a pod that cannot answer is not a candidate

    async def probe_fleet(self, address: str, body: bytes) -> dict[str, Probe]:
        """Every pod of `address`'s simulator process in one call (`/sim/probe-fleet`); empty
        when it cannot answer (then each pod is probed on its own)."""
        data = await self._post(address, "/sim/probe-fleet", body)
        try:
            return {
                a: Probe(a, float(p["predicted_ttft_s"]), int(p["running"])) for a, p in data["pods"].items()
            }
        except (KeyError, TypeError, ValueError, AttributeError):
            return {}

    async def pick(self, model: str, body: bytes) -> str | ErrorResponse:
        addresses = self.candidates(model)
        if not addresses:
            return ErrorResponse(
                404, f"The model '{model}' is not served by pool '{self.pool_name}'", "model_not_found"
            )
        # One call for the pods the first candidate's process runs, one each for the rest.
        found = await self.probe_fleet(addresses[0], body)
        rest = [a for a in addresses if a not in found]
        probes = [found[a] for a in addresses if a in found]
        probes += await asyncio.gather(*(self.probe(a, body) for a in rest))
        best = best_probe([p for p in probes if p is not None], self.rng)
        if best is None:
            return unavailable(f"no pod of pool '{self.pool_name}' answered /sim/probe")
        return best.address


class OracleProcessor(RequestOnlyProcessor):
    """One per ext_proc stream (= one request): remembers its probe time for the response."""

    def __init__(self, picker: OraclePicker) -> None:
        self._picker = picker
        self.max_body_bytes = picker.config.bbr.max_body_bytes
        self._probe_s: float | None = None

    def on_response_headers(self, headers: dict[str, str]) -> dict[str, str] | None:
        return None if self._probe_s is None else {PROBE_HEADER: f"{self._probe_s:.6f}"}

    async def on_request(self, headers: dict[str, str], body: bytes) -> RequestRoute | ErrorResponse:
        if not body:
            return RequestRoute()  # not an inference request (GET /v1/models, health)
        data = decode_json_object(body)
        if isinstance(data, ErrorResponse):
            return data
        model = data.get("model") or headers.get(MODEL_HEADER)
        if not isinstance(model, str):
            return ErrorResponse(400, "'model' must be a string", "invalid_model")
        started = time.perf_counter()
        picked = await self._picker.pick(model, body if "model" in data else json.dumps(data).encode())
        self._probe_s = time.perf_counter() - started
        if isinstance(picked, ErrorResponse):
            return picked
        return RequestRoute(
            set_headers={DESTINATION_HEADER: picked},
            metadata={METADATA_NAMESPACE: {DESTINATION_HEADER: picked}},
            clear_route_cache=True,
        )


async def serve(args: argparse.Namespace) -> None:
    store = ConfigStore.from_file(args.config, GatewayConfig)
    # aiohttp, not httpx: at 32 req/s x 4 pods httpx's pool (a scan of every connection per
    # request, an async-library lookup per call) saturated this process's core and requests
    # queued here for seconds before their probes started, time no probe_s measured.
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=512)) as client:
        picker = OraclePicker(store.current(), args.pool, client)
        servicer = ExtProcServicer(lambda: OracleProcessor(picker), name=f"oracle-{args.pool}")
        service = await start_grpc_service(
            servicer, host=args.host, port=args.port, tls=tls_from_arguments(args)
        )
        log.info("oracle for pool %s listening on %s:%d", args.pool, args.host, service.port)
        await wait_for_shutdown_signal()
        await service.drain_and_stop(args.drain_seconds)


def main(argv: Sequence[str] | None = None) -> None:
    parser = service_parser(
        "bench.harness.oracle", "Oracle endpoint picker (benchmarks only)", default_port=9002
    )
    parser.add_argument("--pool", required=True, help="the pool this picker serves")
    parser.add_argument("--metrics-port", type=int, default=0, help="accepted for EPP CLI parity; unused")
    args = parser.parse_args(argv)
    try:
        ConfigStore.from_file(args.config, GatewayConfig).current().pool(args.pool)
    except KeyError:
        raise SystemExit(f"unknown pool {args.pool!r} in {args.config}") from None
    run_service(serve, args)


if __name__ == "__main__":
    main()
