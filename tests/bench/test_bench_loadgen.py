"""Load generator against the local stub: TTFT, ITL, tokens, pods, errors, schedule, bounds."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from bench.harness.loadgen import LoadGenConfig, run_trace
from bench.harness.peers import free_port
from bench.harness.workloads import TraceRequest, chat_body
from bench.micro.stub_server import StubConfig, StubServer


def _trace(times: list[float], model: str = "m") -> list[TraceRequest]:
    body = chat_body(model, [{"role": "user", "content": "hi there"}], 8)
    return [TraceRequest(t, body, tag=f"r{i}") for i, t in enumerate(times)]


@pytest.fixture
async def stub() -> AsyncIterator[StubServer]:
    server = await StubServer(
        StubConfig(name="pod-a", first_token_delay_s=0.2, inter_token_delay_s=0.05, tokens=5)
    ).start()
    yield server
    await server.stop()


async def test_ttft_itl_tokens_and_pod_are_measured(stub: StubServer) -> None:
    run = await run_trace(_trace([0.0, 0.05, 0.1]), LoadGenConfig(base_url=stub.url))
    assert len(run.results) == 3 and run.not_sent == 0
    for r in run.results:
        assert r.ok, r.error
        # Lower bounds are the stub's delays (a loaded machine only adds time); the parts add
        # up to the whole request.
        assert r.ttft_s >= 0.2
        assert len(r.itl_s) == 4
        assert all(gap >= 0.045 for gap in r.itl_s)
        assert r.e2e_s >= 0.4
        assert r.ttft_s + sum(r.itl_s) == pytest.approx(r.e2e_s, abs=0.05)
        assert r.output_tokens == 5 and r.content_chunks == 5
        assert r.pod == "pod-a"
        assert abs(r.lag_s) < 0.25
    assert [r.scheduled_s for r in run.results] == [0.0, 0.05, 0.1]
    assert all(r.sent_s == pytest.approx(r.scheduled_s, abs=0.25) for r in run.results)
    sent = stub.stats.bodies[0]
    assert sent["stream"] is True and sent["stream_options"]["include_usage"] is True


async def test_output_tokens_fall_back_to_chunks_without_usage(stub: StubServer) -> None:
    req = _trace([0.0])[0]
    body = {**req.body, "stream_options": {"include_usage": False}}
    run = await run_trace([TraceRequest(0.0, body)], LoadGenConfig(base_url=stub.url))
    assert run.results[0].output_tokens == 5


async def test_http_errors_are_counted_not_raised() -> None:
    server = await StubServer(StubConfig(fail_every=2, tokens=2)).start()
    try:
        run = await run_trace(_trace([0.0, 0.01, 0.02, 0.03]), LoadGenConfig(base_url=server.url))
    finally:
        await server.stop()
    statuses = sorted(r.status for r in run.results)
    assert statuses == [200, 200, 500, 500]
    failed = [r for r in run.results if not r.ok]
    assert all(r.error.startswith("HTTP 500") and r.ttft_s is None for r in failed)


async def test_connection_refused_and_404_are_errors() -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    run = await run_trace(_trace([0.0]), LoadGenConfig(base_url=dead, timeout_s=2))
    assert run.results[0].status == 0 and "ConnectError" in run.results[0].error
    server = await StubServer().start()
    try:
        run = await run_trace(_trace([0.0]), LoadGenConfig(base_url=server.url, path="/nope"))
    finally:
        await server.stop()
    assert run.results[0].status == 404 and not run.results[0].ok


async def test_open_loop_keeps_the_schedule_while_requests_are_in_flight(stub: StubServer) -> None:
    times = [i * 0.02 for i in range(20)]  # 50 req/s, each request lasts ~0.4 s
    run = await run_trace(_trace(times), LoadGenConfig(base_url=stub.url))
    assert all(r.ok for r in run.results)
    assert max(abs(r.lag_s) for r in run.results) < 0.25
    assert run.wall_s < 4.0  # open loop: one after the other would take 20 x 0.4 s = 8 s


async def test_concurrency_cap_shows_up_as_lag(stub: StubServer) -> None:
    run = await run_trace(_trace([0.0] * 4), LoadGenConfig(base_url=stub.url, concurrency=2))
    lags = sorted(r.lag_s for r in run.results)
    assert lags[1] < 0.3 and lags[2] >= 0.4  # the 3rd waits for a slot (~0.45 s request)


async def test_bounds_on_count_and_wall_time(stub: StubServer) -> None:
    run = await run_trace(_trace([0.0, 0.1, 0.2, 0.3]), LoadGenConfig(base_url=stub.url, max_requests=2))
    assert len(run.results) == 2
    slow = await StubServer(StubConfig(first_token_delay_s=30)).start()
    try:
        started = asyncio.get_running_loop().time()
        run = await run_trace(_trace([0.0, 0.1, 5.0]), LoadGenConfig(base_url=slow.url, max_wall_s=0.5))
        elapsed = asyncio.get_running_loop().time() - started
    finally:
        await slow.stop()
    assert elapsed < 10.0  # cut at the wall-time limit, not after the 30 s first token
    assert len(run.results) == 2 and run.not_sent == 1
    assert all(r.error == "cancelled at wall-time limit" for r in run.results)


async def test_invalid_concurrency_is_rejected(stub: StubServer) -> None:
    with pytest.raises(ValueError, match="concurrency"):
        await run_trace(_trace([0.0]), LoadGenConfig(base_url=stub.url, concurrency=0))


def test_time_scale_conversions_round_trip() -> None:
    from bench.harness.loadgen import RequestResult, to_simulated, to_wall_clock

    trace = to_wall_clock(_trace([0.0, 1.0, 3.0]), time_scale=0.5)  # fleet runs at half speed
    assert [r.at_s for r in trace] == [0.0, 2.0, 6.0]
    wall = RequestResult(0, "t", 2.0, 2.1, 0.1, 0.4, 1.0, [0.02, 0.04], 3, 3, 200, None, "p")
    (sim,) = to_simulated([wall], time_scale=0.5)
    assert (sim.scheduled_s, sim.sent_s, sim.ttft_s, sim.e2e_s) == (1.0, 1.05, 0.2, 0.5)
    assert sim.itl_s == [0.01, 0.02] and sim.output_tokens == 3
    assert to_simulated([RequestResult(1, "t", 0.0)], 2.0)[0].ttft_s is None
    with pytest.raises(ValueError):
        to_wall_clock(trace, 0)


async def test_tls_with_ca_file_or_verification_off(tmp_path) -> None:
    import ssl

    from devstack.certs import make_certs

    certs = make_certs(tmp_path / "certs")
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(certs.server_cert, certs.server_key)
    server = await StubServer(StubConfig(name="tls-pod", tokens=2)).start(ssl_context=ctx)
    other_ca = make_certs(tmp_path / "other").ca
    try:
        by_ca = await run_trace(_trace([0.0]), LoadGenConfig(base_url=server.https_url, verify=str(certs.ca)))
        unverified = await run_trace(_trace([0.0]), LoadGenConfig(base_url=server.https_url, verify=False))
        wrong_ca = await run_trace(
            _trace([0.0]), LoadGenConfig(base_url=server.https_url, verify=str(other_ca))
        )
    finally:
        await server.stop()
    assert by_ca.results[0].ok and by_ca.results[0].pod == "tls-pod"
    assert unverified.results[0].ok
    assert not wrong_ca.results[0].ok and "ConnectError" in wrong_ca.results[0].error


async def test_missing_ca_file_is_a_clear_error(tmp_path) -> None:
    with pytest.raises(ValueError, match=r"CA file .* unusable"):
        await run_trace(
            _trace([0.0]), LoadGenConfig(base_url="https://127.0.0.1:1", verify=str(tmp_path / "no.pem"))
        )
