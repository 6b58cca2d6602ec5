"""Our side of the comparison: Envoy baselines, the gateway at two weight sets, the oracle.

- `round-robin`, `least-request`: the same Envoy binary and HTTPS listener (concurrency 1)
  with a STATIC cluster of the scenario's pods and a plain load balancer: what a Kubernetes
  Service gives. Every "change vs round-robin" in docs/benchmarks* is against the first.
- `epp-default`: the full gateway with the shipped default profile, as a user gets it: since
  DEFAULT_REVISION 2 single-hop (Envoy + one EPP, the standalone default shape), before that
  BBR + EPP; since issue #11 predicted-ttft 5, prefix-cache 2, kv-cache 1, before, the
  published GIE weights (each summary records the weights and the shape it ran).
- `epp-gie`: the full gateway with the built-in `gie` profile, GIE's and AWS's published
  defaults (queue 2, kv-cache 2, prefix-cache 3).
- `epp-best`: the full gateway with `BEST_PROFILE`, our tuned profile.
- `epp-predicted`: the full gateway with the built-in `predicted` profile (predicted-ttft
  scorer, epp/scheduling/scorers.py), as shipped; `weights` / `thresholds` / `picker` options
  run a copy of it with those overrides.
- `epp-precise`: epp-best's weights with `prefix-cache` replaced by `precise-prefix-cache` at
  the same weight: the EPP tokenizes each prompt with the model's tokenizer and scores pods by
  the KV blocks they report holding (their KV events), not by what it routed where.
- `epp-predicted-precise`: `epp-predicted` whose predicted-ttft reads the same KV-event index.
- `epp-default-precise`: the shipped default as a user who turns on KV events and names the
  model's tokenizer gets it: the same profile, its prefix terms read from the pods' KV events
  (`epp-default` in the same run, on the same fleet, is its approximate twin, `epp-default+tok`).
- `oracle`: the full gateway with the EPP replaced by `bench.harness.oracle` (exact simulator state).

The precise policies declare `FleetNeeds(kv_events=True, tokenizer=True)`: the harness starts
the fleet with KV events on free loopback ports and the shipped tokenizer (bench/harness/fleet.py), and
the gateway config carries each pod's `kvEventsPort` / `kvReplayPort` and the model's tokenizer.

Target options (`--target-opt key=value`) for tuning without editing code:
`weights='{"queue": 2, ...}'`, `thresholds='{"queue": 5}'`, `picker=max|weighted`,
`scrape_ms=50`, `profile=<built-in name>` (epp-best, epp-gie and epp-predicted only); `replicas=N` (any `epp-*`): N EPP
replicas sharing state through a private redis-server (`shared_state=1`: the same Redis wiring for
one replica; `shared_publish_ms=N`: its sharedState.publishIntervalMs); `single_hop=1|0` (any `epp-*`):
the single-hop mode (each EPP process does BBR's routing and picks the pod), the default (the
standalone default shape, with one replica or several);
`request_body=streamed|buffered` (any `epp-*`): `listener.requestBodyMode`.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

from bench.harness.baseline_envoy import render_baseline_bootstrap
from bench.harness.fleet import FleetNeeds
from bench.harness.oracle import PROBE_TIMEOUT_S
from bench.harness.targets import PolicyTarget, TargetContext, register_policy
from devstack.certs import CertSet, make_certs
from devstack.launch import LocalGateway, Proc, envoy_binary, free_port, start_local_gateway
from devstack.redis_server import RedisServer, start_redis
from gateway.config import parse_config
from gateway.profiles import BUILTIN_PROFILE_DATA
from modelsim.build_tokenizer import OUT as SHIPPED_TOKENIZER_DIR
from modelsim.fleet import FleetSpec

# Tuned on the scenarios of bench/scenarios (see docs/benchmarks/method.md, "epp-best").
BEST_PROFILE: dict[str, Any] = {
    # lora-affinity scores every pod alike for base-model requests, so it only acts on LoRA traffic.
    "weights": {
        "queue": 2,
        "kv-cache": 2,
        "prefix-cache": 3,
        "inflight": 1,
        "queue-speed": 2,
        "lora-affinity": 4,
    },
}
# epp-best with the precise (KV-event) prefix scorer in place of the approximate one.
PRECISE_PROFILE: dict[str, Any] = {
    "weights": {
        ("precise-prefix-cache" if name == "prefix-cache" else name): weight
        for name, weight in BEST_PROFILE["weights"].items()
    },
}
PRECISE_NEEDS = FleetNeeds(kv_events=True, tokenizer=True)
BEST_SCRAPE_MS = 50
ORACLE_CONFIG: dict[str, Any] = {
    "picker": "lowest predicted_ttft_s from POST /sim/probe on every pod (ties: smaller batch, then random)",
    "probe_timeout_s": PROBE_TIMEOUT_S,
    "probe_time": "measured per request, subtracted from TTFT and E2E, reported apart",
}
SETTLE_S = 0.5  # after start: let the EPP scrape every pod before the first request
# What "the shipped default as a user gets it" means, beyond the profile's weights: bumped when
# the request path or the EPP's picture of the pods changes what a default run measures, so the
# report marks older `epp-default` rows as runs of an earlier default (bench/reports/report.py).
# 2: the ledger of committed work per pod (epp/datalayer/ledger.py), single-hop as the standalone shape,
# response trailers alone (listener.eppResponseHeaders: auto).
# 3 (issue #40): near-equal pods ordered by this EPP's exact load (`tieBand`), the ledger keeps a
# prefill the page shows started until its first token, the prefill pace bounded by the requests'
# span rather than the scrape interval.
# 4 (issue #51): the KV memory of whole conversations (epp/datalayer/session_memory.py) in
# predicted-ttft: a pod's cached tokens at any prompt length, the eviction a pick causes and the
# seeding credit of a popular shared prefix priced in its ranking (`evictionWeight` 1).
# 5 (issue #51): a saturated pod holding at least half the prompt stays a candidate
# (epp/scheduling/filters.py `unsaturated`, `holders`): the prediction weighs its wait.
DEFAULT_REVISION = 5


async def describe_pods(ctx: TargetContext) -> list[dict[str, Any]]:
    """The pods as `start_local_gateway(pods=...)` wants them, asked from each pod itself
    (`GET /v1/models`: base model and adapters; llama.cpp's server names itself there, `owned_by:
    llamacpp`, for its dialect), so `--worker-urls` pods work too; the KV-event
    ports come from the harness's fleet (`ctx.fleet_pods`), when it publishes them."""
    events = {
        p["address"]: {k: p[k] for k in ("kv_events_port", "kv_replay_port") if p.get(k)}
        for p in ctx.fleet_pods
        if p.get("kv_events_port")
    }
    dialects: list[str] = []
    if ctx.scenario is not None:
        try:
            spec = FleetSpec.from_dict(dict(ctx.scenario.fleet))
            dialects = [p.dialect for p in spec.pods]
        except Exception:  # the fleet may not be ours (--worker-urls): from /v1/models below
            dialects = []
    if len(dialects) != len(ctx.worker_urls):
        dialects = [""] * len(ctx.worker_urls)
    pods = []
    async with httpx.AsyncClient(timeout=10) as client:
        for i, (url, dialect) in enumerate(zip(ctx.worker_urls, dialects, strict=True)):
            reply = await client.get(f"{url.rstrip('/')}/v1/models")
            reply.raise_for_status()
            data = reply.json()["data"]
            base = [m["id"] for m in data if not m.get("parent")]
            if len(base) != 1:
                raise RuntimeError(f"{url}: expected one base model in /v1/models, got {base}")
            adapters = [m["id"] for m in data if m.get("parent")]
            address = url.split("://", 1)[-1].rstrip("/")
            if not dialect:  # a pod the harness did not start: llama-server says who it is
                dialect = "llamacpp" if any(m.get("owned_by") == "llamacpp" for m in data) else "vllm"
            pods.append(
                {
                    "name": f"pod-{i}",
                    "model": base[0],
                    "adapters": adapters,
                    "dialect": dialect,
                    "address": address,
                    **events.get(address, {}),
                }
            )
    return pods


def with_tokenizer(config: dict[str, Any]) -> None:
    """`config_patch` for start_local_gateway: every model gets the shipped tokenizer's folder
    (the one the fleet's pods tokenize with, bench/harness/fleet.py)."""
    for pool in config.get("pools", []):
        for model in pool.get("models", []):
            model["tokenizer"] = str(SHIPPED_TOKENIZER_DIR)


def _addresses(ctx: TargetContext) -> list[str]:
    return [u.split("://", 1)[-1].rstrip("/") for u in ctx.worker_urls]


@dataclass(frozen=True)
class BaselineFiles:
    bootstrap: Path
    listen_port: int
    admin_port: int
    certs: CertSet


def write_baseline(
    work: Path,
    pods: list[str],
    lb_policy: str,
    *,
    ext_proc: tuple[str, int] | None = None,
    response_body_mode: str = "NONE",
    response_trailer_mode: str = "SEND",
    buffered_request_body: bool = False,
) -> BaselineFiles:
    """Certificates and a baseline Envoy bootstrap (see render_baseline_bootstrap) under `work`."""
    work.mkdir(parents=True, exist_ok=True)
    certs = make_certs(work / "certs")
    listen, admin = free_port(), free_port()
    bootstrap = render_baseline_bootstrap(
        pods, lb_policy, listen, admin, certs.server_cert, certs.server_key,
        ext_proc=ext_proc, response_body_mode=response_body_mode,
        response_trailer_mode=response_trailer_mode, buffered_request_body=buffered_request_body,
    )  # fmt: skip
    path = work / "envoy.json"
    path.write_text(json.dumps(bootstrap, indent=1))
    return BaselineFiles(path, listen, admin, certs)


def baseline_factory(lb_policy: str, name: str):
    def factory(ctx: TargetContext) -> PolicyTarget:
        procs: list[Proc] = []

        async def start() -> str:
            files = write_baseline(ctx.work_dir / name, _addresses(ctx), lb_policy)
            procs.append(start_envoy(files.bootstrap, files.bootstrap.parent))
            await wait_ready_async(f"http://127.0.0.1:{files.admin_port}/ready", procs[0], 30.0)
            return f"https://127.0.0.1:{files.listen_port}"

        async def stop() -> None:
            while procs:
                procs.pop().stop()

        config = {"kind": "envoy", "lb_policy": lb_policy, "envoy_concurrency": 1, "listener": "https"}
        return PolicyTarget(name, start, stop, config)

    return factory


def start_envoy(bootstrap: Path, work: Path) -> Proc:
    """Envoy as a child of this (main) thread: it sets PDEATHSIG on the starting thread."""

    log = work / "envoy.log"
    with log.open("ab") as handle:
        popen = subprocess.Popen(
            [
                envoy_binary(),
                "-c",
                str(bootstrap),
                "--use-dynamic-base-id",
                "--log-level",
                "warn",
                "--concurrency",
                "1",
            ],
            stdout=handle,
            stderr=subprocess.STDOUT,
        )
    return Proc("envoy", popen, log)


async def wait_ready_async(url: str, proc: Proc, timeout_s: float) -> None:
    """Poll without blocking the loop: the in-process simulated fleet must keep running."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    async with httpx.AsyncClient(timeout=0.5) as client:
        while loop.time() < deadline:
            if proc.popen.poll() is not None:
                raise RuntimeError(f"envoy exited with code {proc.popen.returncode}; see {proc.log}")
            try:
                if (await client.get(url)).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            await asyncio.sleep(0.05)
    raise TimeoutError(f"{url} not ready after {timeout_s:.0f} s")


def epp_config(
    options: Mapping[str, str], base: Mapping[str, Any] | None, builtin: str | None = None
) -> dict[str, Any]:
    """`config_extra` for start_local_gateway: a `bench` profile made the default, or the
    built-in profile `builtin` itself when no option overrides it."""
    extra: dict[str, Any] = {}
    if "profile" in options:
        extra["defaultProfile"] = options["profile"]
    elif builtin is not None and not {"weights", "thresholds", "picker"} & options.keys():
        extra["defaultProfile"] = builtin
    elif base is not None or "weights" in options:
        profile: dict[str, Any] = dict(base or {})
        if "weights" in options:
            profile["weights"] = json.loads(options["weights"])
        if "thresholds" in options:
            profile["thresholds"] = json.loads(options["thresholds"])
        if "picker" in options:
            profile["picker"] = options["picker"]
        extra["profiles"] = {"bench": profile}
        extra["defaultProfile"] = "bench"
    best = base is BEST_PROFILE or base is PRECISE_PROFILE
    scrape = options.get("scrape_ms", str(BEST_SCRAPE_MS) if best else None)
    if scrape is not None:
        extra["scrape"] = {"intervalMs": int(scrape)}
    return extra


def profile_record(profile: Any) -> dict[str, Any]:
    """A resolved profile as a run summary records it (real-time and virtual runs alike)."""
    return {
        "name": profile.name,
        "weights": dict(profile.weights),
        "picker": profile.picker,
        "thresholds": profile.thresholds.model_dump(by_alias=True),
        "priority": profile.priority,
    }


def effective_epp_config(config_path: Path) -> dict[str, Any]:
    """The scheduling configuration the EPP really ran with, read back from the gateway's own
    config file: the default profile resolved over the built-ins (so `epp-default` records the
    published weights too), thresholds, scrape and admission settings, and the precise prefix
    index's inputs: each model's tokenizer (repository-relative) and the pods with KV events."""
    config = parse_config(yaml.safe_load(config_path.read_text()))
    profile = config.scheduler_profiles()[config.default_profile]
    endpoints = [ep for pool in config.pools for ep in pool.endpoints]
    return json.loads(
        json.dumps(
            {
                "default_profile": config.default_profile,
                "profile": profile_record(profile),
                "thresholds": config.thresholds.model_dump(by_alias=True),
                "scrape": config.scrape.model_dump(by_alias=True),
                "admission": config.admission.model_dump(by_alias=True),
                "tokenizers": {
                    m.name: _repo_relative(m.tokenizer) for pool in config.pools for m in pool.models
                },
                "kv_events": {
                    "endpoints": len(endpoints),
                    "with_events_port": sum(ep.kv_events_port is not None for ep in endpoints),
                    "with_replay_port": sum(ep.kv_replay_port is not None for ep in endpoints),
                },
            },
            default=str,
        )
    )


async def prefix_scoring(gateway: LocalGateway) -> dict[str, Any]:
    """How the EPP scored prefixes when the run ended, from each pool's /debug/pool (first
    replica): pods per mode ("precise", or "approximate: <why>") and the KV blocks its precise
    index holds; shows a run's precise scoring did not fall back."""
    modes: dict[str, int] = {}
    blocks = 0
    try:
        async with httpx.AsyncClient(timeout=5) as client:
            for port in gateway.epp_metrics_ports.values():
                reply = await client.get(f"http://127.0.0.1:{port}/debug/pool")
                reply.raise_for_status()
                debug = reply.json()
                for per_model in debug["prefix_scoring"].values():
                    for mode in per_model.values():
                        modes[mode] = modes.get(mode, 0) + 1
                blocks += sum(int(p.get("blocks", 0)) for p in debug["kv_events"]["pods"].values())
    except (httpx.HTTPError, ValueError, KeyError, TypeError, AttributeError) as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
    return {"pods_by_mode": modes, "kv_blocks": blocks}


def _repo_relative(path: str | None) -> str | None:
    """A tokenizer folder as the summary records it: relative to the repository when inside it
    (no machine paths in committed summaries)."""
    if path is None:
        return None
    root = Path(__file__).resolve().parents[2]
    try:
        return Path(path).resolve().relative_to(root).as_posix()
    except ValueError:
        return Path(path).name


def gateway_factory(
    name: str,
    *,
    profile: Mapping[str, Any] | None,
    epp_module: str = "epp",
    config_extra: Mapping[str, Any] | None = None,
    builtin: str | None = None,
    needs: FleetNeeds | None = None,
):
    """`config_extra`: fixed gateway config keys of a policy (bench/harness/flow_policies.py);
    `builtin`: run that built-in profile (`profile` is then its data, the base of overrides);
    `needs.tokenizer`: the models get the shipped tokenizer (register the policy with the same
    `needs`, so the fleet tokenizes with it and publishes the KV events the pods' ports name)."""
    tokenizer = needs is not None and needs.tokenizer

    def factory(ctx: TargetContext) -> PolicyTarget:
        running: list[LocalGateway] = []
        stores: list[RedisServer] = []

        async def start() -> str:
            pods = await describe_pods(ctx)
            # Only epp-best takes tuning options: epp-default stays at the published weights.
            extra = (
                epp_config(ctx.options if profile is not None else {}, profile, builtin)
                if epp_module == "epp"
                else {}
            )
            extra = {**extra, **(config_extra or {})}
            # Blocking start on purpose (Envoy must be started by this long-lived thread);
            # the simulated pods are idle meanwhile.
            os.environ.setdefault("GATEWAY_ENVOY_LOG_LEVEL", "warn")
            replicas = int(ctx.options.get("replicas", "1")) if epp_module == "epp" else 1
            shared_opt = ctx.options.get("shared_state", "0") not in ("0", "")
            if epp_module == "epp" and (replicas > 1 or shared_opt):
                stores.append(start_redis(ctx.work_dir / name / "redis"))
                shared: dict[str, Any] = {"redis": stores[-1].url}
                if "shared_publish_ms" in ctx.options:
                    shared["publishIntervalMs"] = int(ctx.options["shared_publish_ms"])
                extra = {**extra, "sharedState": shared}
            # The standalone default shape is single-hop (one ext_proc stream per request), with
            # one EPP process or several replicas, each serving every pool.
            single_hop = epp_module == "epp" and ctx.options.get("single_hop", "1") not in ("0", "")
            if "request_body" in ctx.options:  # streamed | buffered: listener.requestBodyMode
                extra = {**extra, "listener": {"requestBodyMode": ctx.options["request_body"]}}
            gateway = start_local_gateway(
                ctx.work_dir / name,
                pods=pods,
                config_extra=extra,
                epp_module=epp_module,
                epp_replicas=replicas,
                single_hop=single_hop,
                config_patch=with_tokenizer if tokenizer else None,
            )
            running.append(gateway)
            target.handle = gateway
            target.config.update(
                kind="gateway",
                epp_module=epp_module,
                single_hop=single_hop,
                default_revision=DEFAULT_REVISION,
            )
            if epp_module == "epp":
                target.config["target_options"] = dict(ctx.options) if profile is not None else {}
                target.config.update(effective_epp_config(gateway.config_path))
                if config_extra:
                    target.config["config_extra"] = json.loads(json.dumps(config_extra))
            else:  # the oracle ignores the EPP's profiles: record what it does instead
                target.config.update(ORACLE_CONFIG)
            await asyncio.sleep(SETTLE_S)
            return gateway.url

        async def stop() -> None:
            if running and epp_module == "epp" and ctx.fleet_needs.kv_events:
                target.config["prefix_scoring_at_end"] = await prefix_scoring(running[-1])
            while running:
                running.pop().stop()
            while stores:
                stores.pop().stop()

        target = PolicyTarget(name, start, stop)
        return target

    return factory


register_policy("round-robin", baseline_factory("ROUND_ROBIN", "round-robin"))
register_policy("least-request", baseline_factory("LEAST_REQUEST", "least-request"))
register_policy("epp-default", gateway_factory("epp-default", profile=None))
register_policy(
    "epp-default-precise",
    gateway_factory("epp-default-precise", profile=None, needs=PRECISE_NEEDS),
    PRECISE_NEEDS,
)
register_policy("epp-best", gateway_factory("epp-best", profile=BEST_PROFILE))
register_policy("epp-gie", gateway_factory("epp-gie", profile=BUILTIN_PROFILE_DATA["gie"], builtin="gie"))
register_policy(
    "epp-predicted",
    gateway_factory("epp-predicted", profile=BUILTIN_PROFILE_DATA["predicted"], builtin="predicted"),
)
register_policy(
    "epp-precise", gateway_factory("epp-precise", profile=PRECISE_PROFILE, needs=PRECISE_NEEDS), PRECISE_NEEDS
)
register_policy(
    "epp-predicted-precise",
    gateway_factory(
        "epp-predicted-precise",
        profile=BUILTIN_PROFILE_DATA["predicted"],
        builtin="predicted",
        needs=PRECISE_NEEDS,
    ),
    PRECISE_NEEDS,
)
register_policy("oracle", gateway_factory("oracle", profile=None, epp_module="bench.harness.oracle"))
