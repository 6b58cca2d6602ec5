"""The EPP pins a data-parallel rank on pods that have several (`X-data-parallel-rank`): a
prompt goes back to the rank that cached its prefix, new prompts spread over the least busy
ranks, and the rank's in-flight count is returned exactly once."""

from __future__ import annotations

import json

from epp.datalayer.endpoint_records import Endpoint, Metrics
from epp.datalayer.pool import Pool
from epp.requestcontrol.context import EppContext
from epp.requestcontrol.dp_ranks import BALANCE_ABS, RANK_HEADER, RankRouter
from epp.requestcontrol.processor import EppProcessor
from epp.requestcontrol.telemetry import Telemetry
from epp.scheduling.request import InferenceRequest
from epp.scheduling.weighted import WeightedScheduler
from extproc.stream import RequestRoute
from gateway.config import parse_config

CONFIG = parse_config({"pools": [{"name": "llama", "models": [{"name": "llama"}]}]})
DP = "10.0.0.1:8000"


def request(prompt: str, rid: str = "r") -> InferenceRequest:
    return InferenceRequest(rid, "llama", "llama", None, prompt, max(1, len(prompt) // 4), 16)


def test_a_prompt_returns_to_the_rank_that_cached_it() -> None:
    ranks = RankRouter()
    first, second = "the first document " * 200, "another text entirely " * 200
    r1, h1 = ranks.pick(request(first), DP, 4)
    ranks.on_routed(DP, r1, h1)
    r2, h2 = ranks.pick(request(second), DP, 4)
    assert r2 != r1  # nothing cached for it: the least busy rank
    ranks.on_routed(DP, r2, h2)
    assert ranks.pick(request(first), DP, 4)[0] == r1
    assert ranks.pick(request(second), DP, 4)[0] == r2


def test_a_rank_far_busier_than_the_others_loses_its_cache_advantage() -> None:
    ranks = RankRouter()
    prompt = "a shared system prompt " * 200
    rank, hashes = ranks.pick(request(prompt), DP, 2)
    for _ in range(BALANCE_ABS + 1):
        ranks.on_routed(DP, rank, hashes)
    assert ranks.pick(request(prompt), DP, 2)[0] == 1 - rank
    for _ in range(BALANCE_ABS + 1):
        ranks.on_finished(DP, rank)
    assert ranks.pick(request(prompt), DP, 2)[0] == rank and not ranks.inflight


async def test_the_processor_pins_the_rank_and_releases_it_once() -> None:
    pool = Pool([Endpoint(DP, frozenset({"llama"}), data_parallel_size=2)])
    pool.record_metrics(DP, Metrics(waiting=0.0, scraped_at=pool.snapshot().taken_at))
    ctx = EppContext(
        "llama", pool, WeightedScheduler(CONFIG.scheduler_profiles()), lambda: CONFIG, Telemetry("llama")
    )
    data = json.dumps({"model": "llama", "messages": [{"role": "user", "content": "hi " * 300}]}).encode()
    procs = [EppProcessor(ctx) for _ in range(3)]
    routes = [await p.on_request({"x-gateway-model-name": "llama"}, data) for p in procs]
    assert all(isinstance(r, RequestRoute) for r in routes)
    pinned = [r.set_headers[RANK_HEADER] for r in routes if isinstance(r, RequestRoute)]
    assert pinned == [pinned[0]] * 3  # the same prompt stays on the rank that has it
    for p in procs:
        p.on_close(True)
        p.on_close(False)
    assert not ctx.ranks.inflight and ctx.pool.inflight_total() == 0


async def test_single_rank_pods_get_no_rank_header() -> None:
    pool = Pool([Endpoint(DP, frozenset({"llama"}))])
    ctx = EppContext(
        "llama", pool, WeightedScheduler(CONFIG.scheduler_profiles()), lambda: CONFIG, Telemetry("llama")
    )
    data = json.dumps({"model": "llama", "messages": [{"role": "user", "content": "hi"}]}).encode()
    route = await EppProcessor(ctx).on_request({"x-gateway-model-name": "llama"}, data)
    assert isinstance(route, RequestRoute) and RANK_HEADER not in route.set_headers
