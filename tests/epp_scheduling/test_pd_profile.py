"""The P/D profile: a decode pod always, a prefill pod when the prompt's uncached part is long
enough and a prefill pod has room; roles from the llm-d.ai/role label."""

from __future__ import annotations

import dataclasses
import random

from epp.datalayer.endpoint_records import EndpointState
from epp.scheduling.disaggregation import pick_disaggregated, uncached_tokens
from epp.scheduling.weighted import WeightedScheduler
from gateway.pool_config import DisaggregationConfig

from .factories import req, snap, state

CONFIG = DisaggregationConfig(minUncachedTokens=1000, maxPrefillQueue=2)
LONG = "x" * 4 * 4000  # ~4,000 tokens
SHORT = "hello there"


def role(s: EndpointState, value: str | None) -> EndpointState:
    labels = {} if value is None else {"llm-d.ai/role": value}
    return dataclasses.replace(s, endpoint=dataclasses.replace(s.endpoint, labels=labels))


def fleet(**waiting: float) -> tuple[EndpointState, ...]:
    return (
        role(state("p0", waiting=waiting.get("p0", 0)), "prefill"),
        role(state("p1", waiting=waiting.get("p1", 0)), "prefill"),
        role(state("d0", waiting=waiting.get("d0", 0)), "decode"),
        role(state("d1", waiting=waiting.get("d1", 0)), "decode"),
    )


def sched() -> WeightedScheduler:
    return WeightedScheduler(rng=random.Random(0))


def test_a_long_prompt_gets_a_decode_and_a_prefill_pod() -> None:
    d = pick_disaggregated(sched().rank, CONFIG, req(LONG), snap(*fleet(p0=1, d1=1)))
    assert d.ranked[0] == "d0" and set(d.ranked) == {"d0", "d1"}  # prefill pods never decode
    assert d.prefill == "p1"  # the less loaded prefill pod


def test_a_short_prompt_stays_aggregated_on_a_decode_pod() -> None:
    d = pick_disaggregated(sched().rank, CONFIG, req(SHORT), snap(*fleet()))
    assert d.ranked[0] in ("d0", "d1") and d.prefill is None


def test_busy_prefill_pods_keep_the_request_aggregated() -> None:
    d = pick_disaggregated(sched().rank, CONFIG, req(LONG), snap(*fleet(p0=5, p1=3)))
    assert d.prefill is None and d.ranked[0] in ("d0", "d1")


def test_a_cached_prompt_stays_on_its_decode_pod() -> None:
    s = sched()
    first = req(LONG)
    d = pick_disaggregated(s.rank, CONFIG, first, snap(*fleet()))
    s.on_routed(first, d.ranked[0])
    again = dataclasses.replace(first, request_id="again")
    d2 = pick_disaggregated(s.rank, CONFIG, again, snap(*fleet()))
    assert d2.ranked[0] == d.ranked[0]
    assert uncached_tokens(again, d2) < CONFIG.min_uncached_tokens and d2.prefill is None


def test_unlabelled_pods_do_both_and_never_prefill_for_themselves() -> None:
    pods = (role(state("a"), None), role(state("b", waiting=1), None))
    d = pick_disaggregated(sched().rank, CONFIG, req(LONG), snap(*pods))
    assert d.ranked[0] == "a" and d.prefill == "b"
    alone = pick_disaggregated(sched().rank, CONFIG, req(LONG), snap(pods[0]))
    assert alone.ranked == ("a",) and alone.prefill is None


def test_no_decode_pod_is_no_endpoint() -> None:
    pods = (role(state("p0"), "prefill"),)
    d = pick_disaggregated(sched().rank, CONFIG, req(LONG), snap(*pods))
    assert d.ranked == () and d.prefill is None


async def test_the_prefill_pod_holds_a_slot_until_the_decode_pod_answers() -> None:
    import json

    from epp.datalayer.endpoint_records import Endpoint, Metrics
    from epp.datalayer.pool import Pool
    from epp.requestcontrol.context import EppContext
    from epp.requestcontrol.processor import EppProcessor
    from epp.requestcontrol.telemetry import Telemetry
    from extproc.stream import RequestRoute
    from gateway.config import parse_config

    config = parse_config(
        {"pools": [{"name": "m", "models": [{"name": "m"}], "disaggregation": {"minUncachedTokens": 100}}]}
    )
    pool = Pool(
        [
            Endpoint("10.0.0.1:8000", frozenset({"m"}), labels={"llm-d.ai/role": "prefill"}),
            Endpoint("10.0.0.2:8000", frozenset({"m"}), labels={"llm-d.ai/role": "decode"}),
        ]
    )
    for address in ("10.0.0.1:8000", "10.0.0.2:8000"):
        pool.record_metrics(address, Metrics(waiting=0.0, scraped_at=pool.snapshot().taken_at))
    from epp.app import build_scheduler

    ctx = EppContext("m", pool, build_scheduler(config, pool_name="m"), lambda: config, Telemetry("m"))
    data = json.dumps({"model": "m", "messages": [{"role": "user", "content": LONG}]}).encode()
    proc = EppProcessor(ctx)
    route = await proc.on_request({"x-gateway-model-name": "m"}, data)
    assert isinstance(route, RequestRoute)
    assert route.set_headers["x-prefiller-host-port"] == "10.0.0.1:8000"
    assert route.set_headers["x-gateway-destination-endpoint"] == "10.0.0.2:8000"
    inflight = {e.address: e.inflight_requests for e in pool.snapshot().endpoints}
    assert inflight == {"10.0.0.1:8000": 1, "10.0.0.2:8000": 1}
    proc.on_response_headers({":status": "200"})
    inflight = {e.address: e.inflight_requests for e in pool.snapshot().endpoints}
    assert inflight == {"10.0.0.1:8000": 0, "10.0.0.2:8000": 1}
    proc.on_close(True)
    proc.on_close(False)
    assert pool.inflight_total() == 0
