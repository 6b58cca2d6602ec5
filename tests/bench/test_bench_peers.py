"""Peer routers (sglang-router, vllm-router) route real streaming traffic to stub pods."""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator

import pytest

from bench.harness.loadgen import LoadGenConfig, run_trace
from bench.harness.peers import PeerError, free_port, peer_command, start_peer
from bench.harness.workloads import TraceRequest, chat_body
from bench.micro.stub_server import StubServer, start_stubs


def _needs_router(kind: str) -> None:
    """The peer routers are the `bench` extra (make bench installs it; make test does not)."""
    module = {"sglang": "sglang_router", "vllm": "vllm_router"}[kind]
    pytest.importorskip(module, reason=f"{kind}-router is in the bench extra: pip install -e '.[bench]'")


@pytest.fixture
async def pods() -> AsyncIterator[list[StubServer]]:
    servers = await start_stubs(2, first_token_delay_s=0.01, tokens=3)
    yield servers
    for server in servers:
        await server.stop()


def _trace(prompts: list[str]) -> list[TraceRequest]:
    return [
        TraceRequest(i * 0.02, chat_body("llama3.1-8b", [{"role": "user", "content": p}], 3), tag=str(i))
        for i, p in enumerate(prompts)
    ]


async def _send(base_url: str, prompts: list[str]) -> Counter[str]:
    run = await run_trace(_trace(prompts), LoadGenConfig(base_url=base_url, timeout_s=10))
    assert all(r.ok for r in run.results), [r.error for r in run.results]
    assert all(r.ttft_s is not None and r.output_tokens == 3 for r in run.results)
    return Counter(r.pod for r in run.results)


@pytest.mark.parametrize("kind", ["sglang", "vllm"])
async def test_round_robin_spreads_over_both_pods(kind: str, pods: list[StubServer], tmp_path) -> None:
    _needs_router(kind)
    peer = await start_peer(kind, "round_robin", [p.url for p in pods], log_dir=tmp_path)
    try:
        served = await _send(peer.base_url, [f"question number {i} " * 20 for i in range(8)])
    finally:
        code = await peer.stop()
    assert served == {"stub-0": 4, "stub-1": 4}
    assert [p.stats.completions for p in pods] == [4, 4]
    assert code is not None
    for pod in pods:  # what the routers probed; the 404s on metadata paths are tolerated
        assert pod.stats.paths["/health"] >= 1
        metadata = pod.stats.paths["/server_info"] + pod.stats.paths["/model_info"]
        assert metadata >= 1 if kind == "sglang" else metadata == 0


@pytest.mark.parametrize("kind", ["sglang", "vllm"])
async def test_cache_aware_keeps_a_repeated_prompt_on_one_pod(
    kind: str, pods: list[StubServer], tmp_path
) -> None:
    _needs_router(kind)
    peer = await start_peer(kind, "cache_aware", [p.url for p in pods], log_dir=tmp_path)
    try:
        shared = "You are a helpful assistant. " * 40
        served = await _send(peer.base_url, [shared + f"q{i}" for i in range(6)])
    finally:
        await peer.stop()
    assert len(served) == 1 and sum(served.values()) == 6
    tokenize_calls = sum(p.stats.paths["/tokenize"] for p in pods)
    if kind == "vllm":
        assert tokenize_calls >= 6  # vllm-router's cache_aware tokenizes through the workers
    else:
        assert tokenize_calls == 0


async def test_sglang_power_of_two_routes(pods: list[StubServer], tmp_path) -> None:
    _needs_router("sglang")
    peer = await start_peer("sglang", "power_of_two", [p.url for p in pods], log_dir=tmp_path)
    try:
        served = await _send(peer.base_url, [f"p{i}" for i in range(6)])
    finally:
        await peer.stop()
    assert sum(served.values()) == 6 and set(served) <= {"stub-0", "stub-1"}


@pytest.mark.parametrize("kind", ["sglang", "vllm"])
async def test_unreachable_worker_fails_with_log_tail(kind: str, tmp_path) -> None:
    _needs_router(kind)
    dead = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(PeerError, match=f"{kind}-router not ready"):
        await start_peer(kind, "round_robin", [dead], log_dir=tmp_path, ready_timeout_s=2)


def test_peer_command_validation() -> None:
    cmd = peer_command("sglang", "cache_aware", ["http://127.0.0.1:1"], 5, 6)
    assert cmd[1:3] == ["-m", "sglang_router.launch_router"]
    assert cmd[cmd.index("--prometheus-port") + 1] == "6" and cmd[cmd.index("--host") + 1] == "127.0.0.1"
    with pytest.raises(ValueError, match="unsupported"):
        peer_command("vllm", "bucket", ["http://x"], 1, 2)
    with pytest.raises(ValueError, match="unknown peer"):
        peer_command("nginx", "round_robin", ["http://x"], 1, 2)
    with pytest.raises(ValueError, match="worker URL"):
        peer_command("vllm", "round_robin", [], 1, 2)
