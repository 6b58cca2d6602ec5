"""Launch and stop the peer routers from PyPI (sglang-router, vllm-router) on loopback.

Both are Rust routers behind a Python launcher. What they do with a worker, as observed
against `bench.micro.stub_server`:
- sglang-router probes `/health`, then `/server_info` -> `/get_server_info` and `/model_info`
  -> `/get_model_info` for metadata; 404 on all of them is fine (model id becomes "unknown",
  no tokenizer download). It then routes any `model` name to the workers.
- vllm-router probes the same; with `cache_aware` it additionally calls, for every request and
  on every worker, `POST /v1/chat/completions/render` (404 tolerated) and `POST /tokenize`
  (vLLM format: `{"tokens": [...], "count": n}`), so the worker must serve `/tokenize`.
Both expose `/readiness` (`{"healthy_workers": n, "total_workers": m}`), which is what
`start_peer` waits on. Both open a Prometheus port (default 29000 for both, so it is always
set to a free port here) and forward the worker's response headers (e.g. `x-modelsim-pod`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from devstack.launch import free_port

PEER_POLICIES: dict[str, tuple[str, ...]] = {
    "sglang": ("cache_aware", "power_of_two", "round_robin", "random"),
    "vllm": ("cache_aware", "power_of_two", "round_robin", "consistent_hash", "random"),
}
_MODULES = {"sglang": "sglang_router.launch_router", "vllm": "vllm_router.launch_router"}
_LOG_LEVEL = {"sglang": "warn", "vllm": "warning"}


class PeerError(RuntimeError):
    """A peer router did not come up; the message carries the tail of its log."""


def peer_command(
    kind: str, policy: str, worker_urls: Sequence[str], port: int, metrics_port: int
) -> list[str]:
    """The exact argv that launches a peer router (with this interpreter, so the .venv one)."""
    if kind not in PEER_POLICIES:
        raise ValueError(f"unknown peer {kind!r}; expected one of {', '.join(PEER_POLICIES)}")
    if policy not in PEER_POLICIES[kind]:
        raise ValueError(
            f"{kind}-router policy {policy!r} unsupported; expected {', '.join(PEER_POLICIES[kind])}"
        )
    if not worker_urls:
        raise ValueError("at least one worker URL is required")
    return [
        sys.executable,
        "-m",
        _MODULES[kind],
        "--worker-urls",
        *worker_urls,
        "--policy",
        policy,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--prometheus-host",
        "127.0.0.1",
        "--prometheus-port",
        str(metrics_port),
        "--log-level",
        _LOG_LEVEL[kind],
    ]


@dataclass
class RunningPeer:
    kind: str
    policy: str
    port: int
    process: asyncio.subprocess.Process
    log_path: Path
    command: list[str] = field(default_factory=list)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    async def stop(self, grace_s: float = 5.0) -> int | None:
        """SIGTERM the router's process group, SIGKILL after `grace_s`; returns the exit code."""
        if self.process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGTERM)
            try:
                await asyncio.wait_for(self.process.wait(), grace_s)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.process.pid, signal.SIGKILL)
                await self.process.wait()
        return self.process.returncode


async def start_peer(
    kind: str,
    policy: str,
    worker_urls: Sequence[str],
    port: int | None = None,
    log_dir: str | Path | None = None,
    ready_timeout_s: float = 30.0,
) -> RunningPeer:
    """Start a peer router and wait until it reports every worker healthy on `/readiness`."""
    port = port or free_port()
    cmd = peer_command(kind, policy, worker_urls, port, free_port())
    log_dir = Path(log_dir or tempfile.mkdtemp(prefix="bench-peer-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"{kind}-router-{policy}-{port}.log"
    with log_path.open("wb") as log:
        env = {**os.environ, "NO_COLOR": "1", "RUST_LOG_STYLE": "never"}
        process = await asyncio.create_subprocess_exec(
            *cmd, stdout=log, stderr=asyncio.subprocess.STDOUT, stdin=asyncio.subprocess.DEVNULL,
            start_new_session=True, env=env,
        )  # fmt: skip
    peer = RunningPeer(kind, policy, port, process, log_path, cmd)
    try:
        await _wait_ready(peer, len(worker_urls), ready_timeout_s)
    except BaseException:
        await peer.stop()
        raise
    return peer


async def _wait_ready(peer: RunningPeer, workers: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    last = "no answer"
    async with httpx.AsyncClient(base_url=peer.base_url, timeout=2.0) as client:
        while time.monotonic() < deadline:
            if peer.process.returncode is not None:
                raise PeerError(
                    f"{peer.kind}-router exited with code {peer.process.returncode} before becoming ready:\n"
                    + peer.log_tail()
                )
            try:
                resp = await client.get("/readiness")
                last = f"HTTP {resp.status_code} {resp.text[:200]}"
                if resp.status_code == 200 and resp.json().get("healthy_workers") == workers:
                    return
            except (httpx.HTTPError, ValueError) as exc:
                last = f"{type(exc).__name__}"
            await asyncio.sleep(0.2)
    raise PeerError(
        f"{peer.kind}-router not ready after {timeout_s:g}s (last /readiness: {last}):\n{peer.log_tail()}"
    )
