"""The routing sidecar against simulated pods: prefill on the named pod then decode locally,
aggregated without the header, the SSRF allow-list, and clear errors that leave nothing in
flight on either pod."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from aiohttp import web

from modelsim.fleet import Fleet, FleetSpec, run_fleet
from pdsidecar.allowlist import AllowList, PrefillerError, prefiller_base_url
from pdsidecar.proxy import Sidecar, SidecarConfig

LONG = {"model": "llama", "prompt": "summarise this document please " * 150, "max_tokens": 4}


@dataclass
class Stack:
    fleet: Fleet
    sidecar: Sidecar
    url: str
    allow_file: Path


@pytest.fixture
async def stack(tmp_path: Path) -> AsyncIterator[Stack]:
    spec = FleetSpec.from_dict(
        {
            "time_scale": 50.0,
            "pods": [
                {"name": "p0", "model": "llama", "role": "prefill"},
                {"name": "outside", "model": "llama", "role": "prefill"},
                {"name": "d0", "model": "llama", "role": "decode"},
            ],
        }
    )
    async with run_fleet(spec) as fleet:
        allow_file = tmp_path / "hosts"
        allow_file.write_text(f"# the pool's prefill pods\n{fleet.pod('p0').address}\n")
        sidecar = Sidecar(SidecarConfig(fleet.pod("d0").url, AllowList([], str(allow_file)), 30.0))
        runner = web.AppRunner(sidecar.app(), access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        try:
            yield Stack(fleet, sidecar, f"http://127.0.0.1:{port}", allow_file)
        finally:
            await runner.cleanup()
            await sidecar.close()


def generations(fleet: Fleet, name: str) -> int:
    pod = fleet.pod(name)._pod
    return sum(n for (method, path), n in pod.http_requests.items() if path.startswith("/v1/"))


def idle(fleet: Fleet, *names: str) -> bool:
    return all(not fleet.pod(n).engine.running and not fleet.pod(n).engine.waiting for n in names)


async def test_prefill_on_the_named_pod_then_decode_here(stack: Stack) -> None:
    p0 = stack.fleet.pod("p0")
    async with httpx.AsyncClient(timeout=10) as c:
        r = await c.post(
            stack.url + "/v1/completions", json=LONG, headers={"x-prefiller-host-port": p0.address}
        )
        assert r.status_code == 200, r.text
        assert r.headers["x-modelsim-pod"] == "d0" and r.json()["usage"]["completion_tokens"] == 4
        assert p0.engine.stats.generation_tokens == 1  # the prefill's one token
        decode = stack.fleet.pod("d0").engine.stats
        assert decode.external_prefix_cache_hits > 0 and decode.nixl_failed_transfers == 0
        assert not p0.engine.held  # the decode pod read the KV

        # Streaming, with the newer URL header: SSE passes through.
        s = await c.post(
            stack.url + "/v1/chat/completions",
            json={
                "model": "llama",
                "messages": [{"role": "user", "content": "hi " * 300}],
                "max_tokens": 3,
                "stream": True,
            },
            headers={"x-prefiller-url": p0.url},
        )
        assert s.status_code == 200 and s.text.endswith("data: [DONE]\n\n")
        assert p0.engine.stats.generation_tokens == 2
    assert stack.sidecar.inflight._value.get() == 0


async def test_without_the_header_the_request_stays_aggregated(stack: Stack) -> None:
    async with httpx.AsyncClient(timeout=10) as c:
        r = await c.post(stack.url + "/v1/completions", json=LONG)
        assert r.status_code == 200 and r.headers["x-modelsim-pod"] == "d0"
        assert (await c.get(stack.url + "/v1/models")).status_code == 200
    assert generations(stack.fleet, "p0") == 0
    assert stack.fleet.pod("d0").engine.stats.external_prefix_cache_queries == 0


async def test_a_prefiller_outside_the_pool_is_refused(stack: Stack) -> None:
    outside = stack.fleet.pod("outside")  # same host as p0, another port
    async with httpx.AsyncClient(timeout=10) as c:
        for header in ({"x-prefiller-host-port": outside.address}, {"x-prefiller-url": outside.url}):
            r = await c.post(stack.url + "/v1/completions", json=LONG, headers=header)
            assert r.status_code == 403, r.text
            assert "not a pod of this pool" in r.json()["error"]["message"]
        bad = await c.post(
            stack.url + "/v1/completions", json=LONG, headers={"x-prefiller-url": "file:///etc"}
        )
        assert bad.status_code == 400
    assert generations(stack.fleet, "outside") == 0 and generations(stack.fleet, "d0") == 0
    # The pool grew: the file is re-read and the pod is allowed from then on.
    stack.allow_file.write_text(f"{stack.fleet.pod('p0').address}\n{outside.address}\n")
    async with httpx.AsyncClient(timeout=10) as c:
        r = await c.post(
            stack.url + "/v1/completions", json=LONG, headers={"x-prefiller-host-port": outside.address}
        )
    assert r.status_code == 200 and outside.engine.stats.generation_tokens == 1


@pytest.mark.parametrize("fault", [{"error_rate": 1.0}, {"refuse": True}])
async def test_a_failing_prefill_pod_is_a_clear_502(stack: Stack, fault: dict[str, object]) -> None:
    p0 = stack.fleet.pod("p0")
    await p0.set_fault(**fault)
    async with httpx.AsyncClient(timeout=10) as c:
        r = await c.post(
            stack.url + "/v1/completions", json=LONG, headers={"x-prefiller-host-port": p0.address}
        )
    assert r.status_code == 502 and "prefill pod" in r.json()["error"]["message"]
    assert generations(stack.fleet, "d0") == 0  # no decode without its prefill
    assert idle(stack.fleet, "p0", "d0") and stack.sidecar.inflight._value.get() == 0


async def test_a_failing_decode_engine_is_a_clear_502(stack: Stack) -> None:
    p0, d0 = stack.fleet.pod("p0"), stack.fleet.pod("d0")
    await d0.set_fault(refuse=True)
    async with httpx.AsyncClient(timeout=10) as c:
        r = await c.post(
            stack.url + "/v1/completions", json=LONG, headers={"x-prefiller-host-port": p0.address}
        )
    assert r.status_code == 502 and "decode engine unreachable" in r.json()["error"]["message"]
    assert idle(stack.fleet, "p0", "d0") and stack.sidecar.inflight._value.get() == 0


async def test_a_client_error_from_the_prefill_pod_is_passed_on(stack: Stack) -> None:
    p0 = stack.fleet.pod("p0")
    async with httpx.AsyncClient(timeout=10) as c:
        r = await c.post(
            stack.url + "/v1/completions",
            json={**LONG, "model": "nope"},
            headers={"x-prefiller-host-port": p0.address},
        )
        assert r.status_code == 404 and "does not exist" in r.json()["error"]["message"]
        r = await c.post(
            stack.url + "/v1/completions", content=b"{not json", headers={"x-prefiller-host-port": p0.address}
        )
        assert r.status_code == 400


def test_prefiller_header_parsing() -> None:
    assert prefiller_base_url("10.0.0.1:8000", None) == ("http://10.0.0.1:8000", "10.0.0.1", 8000)
    assert prefiller_base_url(None, "https://[::1]:9000") == ("https://[::1]:9000", "::1", 9000)
    for host_port, url in (
        ("10.0.0.1", None),
        ("a@b:1", None),
        (None, "http://h:1/path"),
        (None, "gopher://h:1"),
    ):
        with pytest.raises(PrefillerError) as info:
            prefiller_base_url(host_port, url)
        assert info.value.status == 400
    allow = AllowList(["10.0.0.1", "::1", "127.0.0.1:8001", "[::2]:9"])
    allow.check("10.0.0.1", 1)
    allow.check("[::1]", 8000)
    allow.check("127.0.0.1", 8001)
    allow.check("::2", 9)
    for host, port in (("169.254.169.254", 80), ("127.0.0.1", 8002), ("::2", 10)):
        with pytest.raises(PrefillerError):
            allow.check(host, port)


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--decoder", "ftp://x"], "--decoder"),
        (["--decoder", "http://127.0.0.1:1"], "no prefill pod is allowed"),
        (
            ["--decoder", "http://127.0.0.1:1", "--allow-file", "/nonexistent/hosts"],
            "cannot read --allow-file",
        ),
    ],
)
def test_cli_misuse_is_one_line(args: list[str], says: str) -> None:
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "pdsidecar", *args], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and says in done.stderr and "Traceback" not in done.stderr


def test_the_pod_watch_allows_running_pods_only() -> None:
    from pdsidecar.kube_allow import parse_ref, pod_ips

    pods = {
        "p0": {"status": {"phase": "Running", "podIP": "10.1.0.5"}},
        "p1": {"status": {"phase": "Pending", "podIP": "10.1.0.6"}},
        "p2": {"status": {"phase": "Running"}},
    }
    allow = AllowList([])
    allow.set_pods(pod_ips(pods))
    allow.check("10.1.0.5", 8000)
    with pytest.raises(PrefillerError):
        allow.check("10.1.0.6", 8000)
    assert parse_ref("llm/app=llama,llm-d.ai/role=prefill") == ("llm", "app=llama,llm-d.ai/role=prefill")
    with pytest.raises(ValueError):
        parse_ref("app=llama")
