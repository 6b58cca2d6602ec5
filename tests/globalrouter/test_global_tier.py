"""The global tier end to end: two simulated clusters, two router replicas, Redis, real Envoys."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import httpx
import pytest
import redis.asyncio as aioredis

from devstack.global_tier import ClusterSpec, GlobalTier, spawn, start_global_tier
from devstack.launch import LocalGateway, start_local_gateway, wait_until

pytestmark = pytest.mark.integration

MODEL = "llama-3.1-8b-instruct"
CHEAP, DEAR = "east-cheap", "west-dear"
FLEET = {
    "time_scale": 20.0,
    "pods": [{"name": "llama", "model": MODEL, "profile": "h100-llama3.1-8b", "replicas": 2}],
}
RAMP_S = 4.0
# Generous, so that a loaded test machine (whose real TTFTs the reporters measure) does not
# push the cheap cluster over it by itself; the spill test drives estimates far past it.
OBJECTIVE_S = 5.0
# The cheap cluster's share of a second of load while it is settled: a cost-blind split gives
# ~0.5. Typically 0.95+, yet on a loaded 2-core machine (the suite's other worker, a benchmark)
# its heartbeats or TTFT estimate can cross a limit for part of the second and the router
# rightly spills (0.73 and 0.81 seen in one CI run), so the bar is a clear majority.
CHEAP_MAJORITY = 0.65
REQUEST_LIMIT = 40
TOKEN_LIMIT = 300


@pytest.fixture(scope="module")
def tier(tmp_path_factory: pytest.TempPathFactory, redis_url: str) -> Iterator[GlobalTier]:
    gateways: list[LocalGateway] = []
    try:
        for name in (CHEAP, DEAR):
            gateways.append(start_local_gateway(tmp_path_factory.mktemp(name), fleet=FLEET))
        clusters = [
            # The cheap cluster can run 4 requests at once unqueued (2 pods x 2 slots).
            ClusterSpec(CHEAP, gateways[0], "us-east-1", 0.2, slots_per_pod=2),
            ClusterSpec(DEAR, gateways[1], "us-west-2", 0.6, slots_per_pod=8),
        ]
        router_config = {
            "stale_after_s": 1.5,
            "ramp_s": RAMP_S,
            "ttft_objective_s": OBJECTIVE_S,
            # The simulated pods run 20x faster than an H100: ~0.3 ms per token, short answers.
            "assumed_tpot_s": 0.0005,
            "assumed_output_tokens": 16,
            "passive_health": {"eject_s": 2.0},
            "region_rtt_ms": {"us-east-1|us-west-2": 70},
            "rate_limits": {
                "redis_url": redis_url,
                "window_s": 60,
                "timeout_s": 5.0,  # a loaded machine must not turn Redis round trips into fail-open
                "tenants": {"limited": {"requests": REQUEST_LIMIT}, "metered": {"tokens": TOKEN_LIMIT}},
            },
        }
        with start_global_tier(
            tmp_path_factory.mktemp("global"), clusters, replicas=2, router_config=router_config
        ) as tier:
            yield tier
    finally:
        for gw in gateways:
            gw.stop()


def chat(content: str = "Hello there", **extra: object) -> dict[str, object]:
    return {"model": MODEL, "messages": [{"role": "user", "content": content}], "max_tokens": 4, **extra}


@dataclass(frozen=True, slots=True)
class Sent:
    t: float  # monotonic send time
    status: int
    member: str  # the member route the router picked
    upstream: str  # the member address Envoy reached


async def send(client: httpx.AsyncClient, **headers: str) -> Sent:
    t = time.monotonic()
    try:
        r = await client.post("/v1/chat/completions", json=chat(), headers=headers)
    except httpx.HTTPError:
        return Sent(t, 0, "", "")
    return Sent(
        t, r.status_code, r.headers.get("x-global-member", ""), r.headers.get("x-global-upstream", "")
    )


async def load(client: httpx.AsyncClient, until: float, workers: int = 2) -> list[Sent]:
    out: list[Sent] = []

    async def worker() -> None:
        while time.monotonic() < until:
            out.append(await send(client, **{"x-gateway-client-region": "us-east-1"}))

    await asyncio.gather(*(worker() for _ in range(workers)))
    return sorted(out, key=lambda s: s.t)


def share(sent: list[Sent], member: str) -> float:
    return sum(s.member == member for s in sent) / max(1, len(sent))


async def eventually(check: Callable[[], bool], timeout_s: float, what: str) -> None:
    """Poll `check` without blocking the event loop (heartbeat tasks run on it)."""
    deadline = time.monotonic() + timeout_s
    while not await asyncio.to_thread(check):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not seen after {timeout_s:.0f} s")
        await asyncio.sleep(0.05)


def estimates(tier: GlobalTier, member: str) -> list[float]:
    """Each router replica's TTFT estimate for `member` (inf while it has no load report)."""
    out = []
    for replica in range(len(tier.router_ports)):
        model = tier.members(replica)[member]["models"].get(MODEL)
        out.append(float("inf") if model is None else model["estimated_ttft_s"])
    return out


def settled(tier: GlobalTier, member: str = CHEAP) -> None:
    """Wait until every router replica sees `member` fresh, at full ramp weight, not ejected
    and within the TTFT objective: an earlier test (a stopped reporter, a restarted Envoy)
    may have left it ramping back, and a loaded machine makes that take longer."""

    def ready() -> bool:
        for replica in range(len(tier.router_ports)):
            m = tier.members(replica)[member]
            model = m["models"].get(MODEL)
            if not (m["available"] and m["ramp"] >= 1.0 and m["ejected_for_s"] == 0 and model):
                return False
            if model["estimated_ttft_s"] >= OBJECTIVE_S / 2:
                return False
        return True

    wait_until(ready, 60, f"{member} settled on every router replica")


async def heartbeat(
    tier: GlobalTier, cluster: str, *, avg_queue: float, ttft_s: float, tpot_s: float, seconds: float
) -> None:
    """Speak the ClusterReports API directly, as a reporter would, to every replica."""
    import grpc

    from globalrouter.api.v1 import cluster_report_pb2 as rpb
    from globalrouter.api.v1 import cluster_report_pb2_grpc as rpb_grpc

    spec = tier.clusters[cluster]
    report = rpb.ModelReport(
        model=MODEL, ready_pods=2, total_pods=2, avg_queue=avg_queue, running=min(4, 1 + avg_queue), capacity=4,
        ttft_s=ttft_s, tpot_s=tpot_s, inflight_requests=int(min(4, 1 + avg_queue) + 2 * avg_queue),
    )  # fmt: skip

    async def beats() -> object:
        end, seq = time.monotonic() + seconds, 0
        while time.monotonic() < end:
            seq += 1
            yield rpb.ClusterHeartbeat(
                cluster=cluster, region=spec.region, cost_per_1k_tokens=spec.cost_per_1k_tokens,
                sequence=seq, models=[report],
            )  # fmt: skip
            await asyncio.sleep(0.25)

    async def one(port: int) -> list[object]:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            return [ack async for ack in rpb_grpc.ClusterReportsStub(channel).Report(beats())]

    acks = await asyncio.gather(*(one(p) for p in tier.router_ports))
    assert all(a.known_cluster for replica in acks for a in replica)  # type: ignore[attr-defined]


async def test_low_load_goes_to_the_cheap_cluster(tier: GlobalTier) -> None:
    settled(tier)
    async with tier.client() as client:
        sent = [await send(client, **{"x-gateway-client-region": "us-east-1"}) for _ in range(12)]
        # A client cannot steer the global route itself.
        spoofed = await send(client, **{"x-global-cluster": DEAR})
    print(f"\nlow load: cheap share {share(sent, CHEAP):.2f} of {len(sent)}")
    assert all(s.status == 200 for s in sent)
    assert share(sent, CHEAP) >= 0.9, __import__("json").dumps(tier.members(0)[CHEAP])
    assert spoofed.status == 200 and spoofed.member == CHEAP


async def test_spills_to_the_dear_cluster_when_the_cheap_one_misses_the_objective(tier: GlobalTier) -> None:
    """Heartbeats say the cheap cluster is slow and queued (6 waiting per pod, TTFT 1 s,
    TPOT 200 ms: estimated TTFT ~15 s > 5 s): traffic spills to the dear one. When they say it
    is fast and lightly loaded again (estimate ~0.03 s) traffic returns to it."""
    settled(tier)
    tier.stop_reporter(CHEAP)
    try:
        async with tier.client() as client:
            beats = asyncio.create_task(
                heartbeat(tier, CHEAP, avg_queue=6, ttft_s=1.0, tpot_s=0.2, seconds=4.0)
            )
            await eventually(
                lambda: min(estimates(tier, CHEAP)) > OBJECTIVE_S, 10, "queued heartbeats applied"
            )
            queued = await load(client, time.monotonic() + 1.2)
            await beats
            beats = asyncio.create_task(
                heartbeat(tier, CHEAP, avg_queue=0, ttft_s=0.01, tpot_s=0.001, seconds=4.0)
            )
            await eventually(
                lambda: max(estimates(tier, CHEAP)) < OBJECTIVE_S / 2, 10, "calm heartbeats applied"
            )
            calm = await load(client, time.monotonic() + 1.2)
            await beats
    finally:
        tier.start_reporter(CHEAP)
    print(
        f"\ncost: queued cheap -> dear share {share(queued, DEAR):.2f} of {len(queued)}; "
        f"calm cheap -> cheap share {share(calm, CHEAP):.2f} of {len(calm)}"
    )
    assert all(s.status == 200 for s in queued + calm)
    assert share(queued, DEAR) >= 0.9, [s.member for s in queued]
    assert share(calm, CHEAP) >= 0.9, [s.member for s in calm]


async def test_unserved_model_is_a_json_503(tier: GlobalTier) -> None:
    async with tier.client() as client:
        r = await client.post("/v1/chat/completions", json={**chat(), "model": "no-such-model"})
    assert r.status_code == 503
    assert r.json()["error"]["code"] == "no_cluster_available"


async def test_request_limit_holds_across_two_replicas(tier: GlobalTier) -> None:
    sem = asyncio.Semaphore(8)
    async with tier.client() as client:

        async def one() -> httpx.Response:
            async with sem:
                return await client.post("/v1/chat/completions", json=chat(), headers={"x-tenant": "limited"})

        replies = await asyncio.gather(*(one() for _ in range(2 * REQUEST_LIMIT)))
    accepted = sum(r.status_code == 200 for r in replies)
    refused = [r for r in replies if r.status_code == 429]
    print(
        f"\nrate limit: {accepted} of {2 * REQUEST_LIMIT} accepted across 2 replicas, limit {REQUEST_LIMIT}"
    )
    assert accepted + len(refused) == 2 * REQUEST_LIMIT
    assert abs(accepted - REQUEST_LIMIT) <= 0.05 * REQUEST_LIMIT, accepted
    assert int(refused[0].headers["retry-after"]) >= 1
    assert refused[0].json()["error"]["code"] == "rate_limit_requests"
    async with httpx.AsyncClient(timeout=2) as admin:
        per_replica = [
            (await admin.get(f"http://127.0.0.1:{port}/metrics")).text for port in tier.router_admin_ports
        ]
    # Both replicas decided part of it (Envoy spreads ext_proc streams over them).
    for text in per_replica:
        assert 'global_router_refused_total{code="rate_limited_requests"}' in text


async def test_token_budget_counts_usage_from_responses(tier: GlobalTier, redis_url: str) -> None:
    headers = {"x-tenant": "metered"}
    spent = 0
    statuses = []
    async with tier.client() as client:
        for i in range(40):
            if i % 2:
                body = chat(stream=True, stream_options={"include_usage": True})
                async with client.stream("POST", "/v1/chat/completions", json=body, headers=headers) as r:
                    text = (await r.aread()).decode()
                if r.status_code == 200:
                    usage_lines = [
                        line for line in text.splitlines() if '"usage"' in line and "total_tokens" in line
                    ]
                    import json

                    assert usage_lines, (r.headers, text[:800])
                    spent += json.loads(usage_lines[-1][6:])["usage"]["total_tokens"]
            else:
                r = await client.post("/v1/chat/completions", json=chat(), headers=headers)
                if r.status_code == 200:
                    spent += r.json()["usage"]["total_tokens"]
            statuses.append(r.status_code)
            if r.status_code == 429:
                assert r.json()["error"]["code"] == "rate_limit_tokens"
                break
            await asyncio.sleep(0.05)  # tokens are charged just after the response ends
    assert statuses[-1] == 429, statuses
    assert statuses.count(200) >= 4
    client_redis = aioredis.from_url(redis_url)
    try:
        counted = sum(int(v) for v in await client_redis.hvals("grl:{metered}:tokens"))
    finally:
        await client_redis.aclose()
    print(
        f"\ntokens: {statuses.count(200)} accepted, {spent} tokens in responses, {counted} counted in Redis"
    )
    assert counted == spent
    assert counted >= TOKEN_LIMIT


async def test_failover_and_gradual_return(tier: GlobalTier) -> None:
    cheap_gw = tier.clusters[CHEAP].gateway
    settled(tier)
    async with tier.client() as client:
        before = await load(client, time.monotonic() + 1.0)
        assert share(before, CHEAP) >= CHEAP_MAJORITY, tier.members(0)[CHEAP]
        # Kill the cheap cluster's Envoy and its reporter while traffic flows.
        killed_at = time.monotonic()
        cheap_gw.procs["envoy"].stop()
        tier.stop_reporter(CHEAP)
        during = await load(client, time.monotonic() + 3.0)
        assert not tier.members(0)[CHEAP]["available"]
        # Bring it back: same Envoy bootstrap, same port; its reporter resumes heartbeats.
        argv = [str(a) for a in cheap_gw.procs["envoy"].popen.args]  # type: ignore[union-attr]
        cheap_gw.procs["envoy"] = spawn("envoy-restarted", argv, cheap_gw.workdir)
        wait_until(
            lambda: httpx.get(f"http://127.0.0.1:{cheap_gw.admin_port}/ready", timeout=0.5).status_code == 200,
            20, "restarted member envoy",
        )  # fmt: skip
        tier.start_reporter(CHEAP)
        wait_until(lambda: tier.members(0)[CHEAP]["available"], 20, "cheap member back")
        back_at = time.monotonic()
        after = await load(client, back_at + RAMP_S + 1.5)

    to_cheap = [s.t - killed_at for s in during if s.member == CHEAP]
    failures = [s.t - killed_at for s in during if s.status != 200]
    moved_after_s = max(to_cheap, default=0.0)
    assert moved_after_s < 5.0
    assert max(failures, default=0.0) < 5.0
    # Passive health usually moves traffic at the first refused connection; the heartbeat
    # staleness bound (1.5 s) guarantees it even on a machine too busy for that to show.
    assert share([s for s in during if s.t - killed_at > 2.0], DEAR) == 1.0
    buckets = [
        share([s for s in after if lo <= s.t - back_at < lo + 1.0], CHEAP) for lo in range(int(RAMP_S) + 1)
    ]
    print(
        f"\nfailover: last request routed to the dead member {moved_after_s * 1000:.0f} ms after the kill, "
        f"{len(failures)}/{len(during)} failed requests; ramp share per second after return: "
        + ", ".join(f"{b:.2f}" for b in buckets)
    )
    assert buckets[0] < 0.5
    # The ramp rises: its first half carries less of the traffic than its second (halves, not
    # single seconds, so a second in which a busy machine sent few requests cannot decide it).
    early = share([s for s in after if s.t - back_at < RAMP_S / 2], CHEAP)
    late = share([s for s in after if RAMP_S / 2 <= s.t - back_at < RAMP_S], CHEAP)
    assert early < late, (early, late)
    assert buckets[0] < buckets[-1]
    assert buckets[-1] >= 0.85


async def test_silent_cluster_is_dropped_when_heartbeats_stop(tier: GlobalTier) -> None:
    """Active health alone: the cluster still answers, but its reporter went quiet (a hung
    control plane, a partition of the reporting path). Stale after 1.5 s, traffic moves."""
    settled(tier)
    async with tier.client() as client:
        before = await load(client, time.monotonic() + 0.5)
        assert share(before, CHEAP) >= CHEAP_MAJORITY, tier.members(0)[CHEAP]
        silenced_at = time.monotonic()
        tier.stop_reporter(CHEAP)
        try:
            during = await load(client, time.monotonic() + 4.0)
        finally:
            tier.start_reporter(CHEAP)
    moved_after_s = max((s.t - silenced_at for s in during if s.member == CHEAP), default=0.0)
    print(f"\nheartbeat loss: last request routed to the silent member {moved_after_s * 1000:.0f} ms after")
    assert all(s.status == 200 for s in during)
    # stale_after_s 1.5 s minus the age of the last heartbeat (sent every 0.5 s); slack for a busy CPU
    assert 0.5 <= moved_after_s < 3.0
    assert any(s.t - silenced_at > 3.0 for s in during)  # traffic kept flowing, all of it elsewhere
