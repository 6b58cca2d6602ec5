"""Endpoints from the configuration file, for non-Kubernetes deployments and `make run`."""

from __future__ import annotations

from epp.datalayer.endpoint_records import Endpoint
from gateway.config import GatewayConfig


def static_endpoints(config: GatewayConfig, pool_name: str) -> list[Endpoint]:
    pool = config.pool(pool_name)
    all_models = [m.name for m in pool.models]
    out = []
    for ep in pool.endpoints:
        models = ep.models if ep.models is not None else all_models
        if ep.adapters is not None:
            adapters = ep.adapters
        else:
            adapters = [a for m in pool.models if m.name in models for a in m.adapters]
        out.append(
            Endpoint(
                address=ep.address,
                models=frozenset(models),
                adapters=frozenset(adapters),
                engine=ep.engine or pool.engine,
                kv_events_port=ep.kv_events_port,
                kv_replay_port=ep.kv_replay_port,
                kv_capacity_tokens=ep.kv_capacity_tokens or pool.kv_capacity_tokens,
                name=ep.name,
                labels=dict(ep.labels),
                data_parallel_size=ep.data_parallel_size,
            )
        )
    return out
