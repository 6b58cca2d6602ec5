"""Builders for crafted pool snapshots and requests."""

from __future__ import annotations

import itertools

from epp.datalayer.endpoint_records import Endpoint, EndpointState, Metrics, PoolSnapshot
from epp.scheduling.request import InferenceRequest

_ids = itertools.count()


def state(
    address: str,
    *,
    waiting: float = 0,
    running: float = 0,
    kv: float = 0.0,
    age: float = 0.01,
    scraped: bool = True,
    inflight: int = 0,
    tokens: int = 0,
    ttft: float | None = None,
    tpot: float | None = None,
    healthy: bool = True,
    models: tuple[str, ...] = ("m",),
    adapters: tuple[str, ...] = (),
    running_adapters: tuple[str, ...] = (),
    waiting_adapters: tuple[str, ...] = (),
    max_lora: int = 0,
    block_size: int | None = None,
    num_gpu_blocks: int | None = None,
) -> EndpointState:
    metrics = (
        Metrics(
            waiting=waiting,
            running=running,
            kv_usage=kv,
            running_adapters=frozenset(running_adapters),
            waiting_adapters=frozenset(waiting_adapters),
            max_lora=max_lora,
            block_size=block_size,
            num_gpu_blocks=num_gpu_blocks,
        )
        if scraped
        else None
    )
    return EndpointState(
        endpoint=Endpoint(address, frozenset(models), frozenset(adapters)),
        metrics=metrics,
        metrics_age=age if scraped else float("inf"),
        inflight_requests=inflight,
        inflight_tokens=tokens,
        ttft_ewma=ttft,
        tpot_ewma=tpot,
        healthy=healthy,
    )


def snap(*states: EndpointState) -> PoolSnapshot:
    return PoolSnapshot(endpoints=tuple(states), taken_at=0.0)


def req(
    prompt: str = "hello",
    *,
    model: str = "m",
    adapter: str | None = None,
    objective: str | None = None,
    max_tokens: int | None = 100,
) -> InferenceRequest:
    return InferenceRequest(
        request_id=f"r{next(_ids)}",
        model=adapter or model,
        target_model=model,
        adapter=adapter,
        prompt=prompt,
        prompt_tokens=max(1, len(prompt) // 4),
        max_tokens=max_tokens,
        objective=objective,
    )


def assert_ranked(totals: list[float], band: float) -> None:
    """A picker's ranking as its totals: those within `band` of the best first, in any order (by
    this EPP's exact load, epp/scheduling/picker.py), the rest by descending total (equal within
    the picker's TIE_EPSILON)."""
    from epp.scheduling.picker import TIE_EPSILON

    if not totals:
        return
    floor = max(totals) * (1 - band) - TIE_EPSILON
    near = sum(t >= floor for t in totals) if band > 0 else 0
    assert all(t >= floor for t in totals[:near]), totals
    keys = [round(t / TIE_EPSILON) for t in totals[near:]]
    assert keys == sorted(keys, reverse=True), totals
