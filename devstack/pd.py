"""`make run ARGS=--pd`: a disaggregated pool on this machine, wired as llm-d wires it.

One model, prefill pods and decode pods (modelsim roles, labelled `llm-d.ai/role` in the
pool), a P/D routing sidecar (pdsidecar/) in front of every decode pod, and the pool's
endpoints pointing at the sidecars for decode pods (their serving port, as the InferencePool's
targetPort is in llm-d) and at the engines for prefill pods. The sidecars' allow-list is a file
of the prefill pods' `host:port`s (every pod here shares 127.0.0.1, so hosts alone would allow
any local port).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import httpx

from devstack.launch import (
    LocalGateway,
    Proc,
    _spawn,
    free_port,
    start_fleet,
    start_local_gateway,
    wait_until,
)

PD_MODEL = "llama-3.1-8b-instruct"
PD_POOL = "llama-3-1-8b-instruct"
ROLE_LABEL = "llm-d.ai/role"
PD_FLEET: dict[str, Any] = {
    "time_scale": 1.0,
    "pods": [
        {
            "name": "prefill",
            "model": PD_MODEL,
            "profile": "h100-llama3.1-8b",
            "role": "prefill",
            "replicas": 2,
        },
        {"name": "decode", "model": PD_MODEL, "profile": "h100-llama3.1-8b", "role": "decode", "replicas": 2},
    ],
}
# The pool's disaggregation section (docs/scheduling.md, "The P/D profile").
PD_SETTINGS: dict[str, Any] = {"minUncachedTokens": 1024, "maxPrefillQueue": 4}


def allow_file_text(pods: list[dict[str, Any]]) -> str:
    """The sidecars' allow-list: every prefill-capable pod of the pool, host:port."""
    lines = [p["address"] for p in pods if p.get("role", "both") in ("prefill", "both")]
    return "# prefill pods of the pool (pdsidecar --allow-file)\n" + "".join(f"{a}\n" for a in lines)


def start_sidecar(
    workdir: Path, name: str, decoder: str, allow_file: Path, timeout_s: float
) -> tuple[Proc, str]:
    port = free_port()
    argv = [sys.executable, "-m", "pdsidecar", "--host", "127.0.0.1", "--port", str(port)]
    argv += ["--decoder", f"http://{decoder}", "--allow-file", str(allow_file)]
    proc = _spawn(name, argv, workdir)
    url = f"http://127.0.0.1:{port}/sidecar/metrics"

    def up() -> bool:
        try:
            return httpx.get(url, timeout=0.5).status_code == 200
        except httpx.HTTPError:
            return False

    wait_until(up, timeout_s, name, proc.popen)
    return proc, f"127.0.0.1:{port}"


def start_pd_gateway(
    workdir: Path,
    *,
    fleet: Mapping[str, Any] = PD_FLEET,
    settings: Mapping[str, Any] = PD_SETTINGS,
    config_patch: Callable[[dict[str, Any]], None] | None = None,
    timeout_s: float = 60.0,
    **gateway: Any,
) -> LocalGateway:
    """The fleet, a sidecar per decode pod, then `start_local_gateway` over them. The returned
    gateway's `pods` list the engines (`address`) and, for decode pods, `sidecar` (what the
    pool routes to); its `procs` include the fleet and the sidecars (`sidecar-<pod>`)."""
    workdir.mkdir(parents=True, exist_ok=True)
    procs: dict[str, Proc] = {}
    try:
        procs["fleet"], pods = start_fleet(workdir, fleet, timeout_s)
        allow_file = workdir / "pd-allow.txt"
        allow_file.write_text(allow_file_text(pods))
        routed = []
        for pod in pods:
            entry = dict(pod)
            if pod.get("role") == "decode":
                name = f"sidecar-{pod['name']}"
                procs[name], pod["sidecar"] = start_sidecar(
                    workdir, name, pod["address"], allow_file, timeout_s
                )
                entry["address"] = pod["sidecar"]
            routed.append(entry)

        def patch(config: dict[str, Any]) -> None:
            pool = next(p for p in config["pools"] if p["name"] == PD_POOL)
            pool["disaggregation"] = dict(settings)
            roles = {p["address"]: p.get("role", "both") for p in routed}
            for endpoint in pool["endpoints"]:
                endpoint["labels"] = {ROLE_LABEL: roles[endpoint["address"]]}
            if config_patch is not None:
                config_patch(config)

        gw = start_local_gateway(workdir, pods=routed, config_patch=patch, timeout_s=timeout_s, **gateway)
    except BaseException:
        for proc in procs.values():
            proc.stop()
        raise
    gw.pods = pods
    gw.procs.update(procs)
    return gw
