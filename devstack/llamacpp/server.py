"""Start llama-server processes on loopback, in the shape the local gateway fronts.

`start_llama_servers` returns the processes and one pod entry each (name, model, adapters,
dialect `llamacpp`, address: what modelsim's fleet ready file lists), so
`devstack.launch.start_local_gateway(pods=...)` puts Envoy and the EPP in front of them exactly
as in front of simulated pods. Each server runs `--metrics` (the EPP scrapes it), `-np` parallel
slots with their prompt caches, `-t`/`-tb` CPU threads, and nothing that reaches the network
(the model is a local file, the binary was built without curl).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from devstack.launch import Proc, _spawn, free_port, wait_until
from devstack.llamacpp.build import read_build_info, server_binary
from devstack.llamacpp.model import DEFAULT_MODEL, MODEL_NAME, TOKENIZER_DIR

DIALECT = "llamacpp"


@dataclass(frozen=True)
class ServerSpec:
    """One llama-server's settings; `threads` differ per server for a heterogeneous fleet."""

    threads: int = 1
    parallel: int = 2  # slots (concurrent sequences, each with its own prompt cache)
    ctx_per_slot: int = 4096  # tokens of context (KV) per slot
    # The host-memory prompt cache (`--cache-ram`, MiB) that keeps prompts evicted from the
    # slots; None: the engine's default (8,192 MiB, far more than the tiny model ever fills).
    cache_ram_mib: int | None = None


def missing_engine() -> str | None:
    """Why llama-server cannot run here (a sentence naming the fix), or None when it can."""
    if read_build_info() is None:
        return f"llama-server is not built ({server_binary()} absent): run `make llama-server`"
    if not DEFAULT_MODEL.is_file():
        return f"the model {DEFAULT_MODEL} is absent: run `make llama-server`"
    return None


def engine_version() -> str:
    """The engine named as summaries record it: llama.cpp commit and the sdist it came from."""
    info = read_build_info() or {}
    commit = str(info.get("llama_cpp_commit", "unknown"))[:7]
    return f"llama.cpp {commit} (llama-server {info.get('engine_version', '?')}, {info.get('sdist', '?')})"


def server_argv(spec: ServerSpec, port: int, model: Path = DEFAULT_MODEL) -> list[str]:
    return [
        str(server_binary()),
        *("--model", str(model), "--alias", MODEL_NAME),
        *("--host", "127.0.0.1", "--port", str(port)),
        *("--threads", str(spec.threads), "--threads-batch", str(spec.threads)),
        *("--parallel", str(spec.parallel), "--ctx-size", str(spec.ctx_per_slot * spec.parallel)),
        *(("--cache-ram", str(spec.cache_ram_mib)) if spec.cache_ram_mib is not None else ()),
        "--metrics",
        "--no-webui",
    ]


def with_model_tokenizer(config: dict[str, Any]) -> None:
    """`config_patch` for the local gateway: the EPP tokenizes the tiny model's prompts with the
    tokenizer the GGUF was written from, so its token counts and ids are the engine's."""
    for pool in config.get("pools", []):
        for model in pool.get("models", []):
            if model.get("name") == MODEL_NAME:
                model["tokenizer"] = str(TOKENIZER_DIR)


def _healthy(port: int) -> bool:
    return httpx.get(f"http://127.0.0.1:{port}/health", timeout=0.5).status_code == 200


def start_llama_servers(
    workdir: Path, specs: Sequence[ServerSpec], timeout_s: float = 60.0, *, model: Path = DEFAULT_MODEL
) -> tuple[dict[str, Proc], list[dict[str, Any]]]:
    """One llama-server per spec, named llama-0, llama-1, ...; returns them once all answer
    /health (the model is loaded), and their pod entries. On failure, stops what started."""
    procs: dict[str, Proc] = {}
    pods: list[dict[str, Any]] = []
    try:
        for i, spec in enumerate(specs):
            name, port = f"llama-{i}", free_port()
            procs[name] = _spawn(name, server_argv(spec, port, model), workdir)
            pods.append(
                {
                    "name": name,
                    "model": MODEL_NAME,
                    "adapters": [],
                    "dialect": DIALECT,
                    "address": f"127.0.0.1:{port}",
                    "threads": spec.threads,
                }
            )
        for pod in pods:
            port = int(pod["address"].rsplit(":", 1)[1])
            proc = procs[pod["name"]]
            wait_until(functools.partial(_healthy, port), timeout_s, pod["name"], proc.popen)
    except BaseException:
        for proc in procs.values():
            proc.stop()
        raise
    return procs, pods
