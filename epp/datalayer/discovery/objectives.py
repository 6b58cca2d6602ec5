"""The InferenceObjectives (llm-d API) an EPP follows: each names a pool and a priority, and
those naming this EPP's pool set the priority of the requests that name them (the header
policy, epp/requestcontrol/header_policy.py). The watch keeps each object's last valid version
(gateway/kube/llmd_api.py `LastGood`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gateway.config import GatewayConfig
from gateway.kube.llmd_api import (
    GROUP,
    INFERENCE_OBJECTIVES,
    Accepted,
    InferenceObjectiveSpec,
    LastGood,
    config_pool_for,
    is_inference_pool,
)


class ObjectivePriorities:
    """One pool's followed InferenceObjectives; `on_change` runs after every new list."""

    def __init__(self, pool_name: str, on_change: Callable[[], None]) -> None:
        self.pool_name = pool_name
        self._on_change = on_change
        self._objectives: dict[str, Accepted[InferenceObjectiveSpec]] = {}  # name -> last valid
        self._namespace = ""
        self._pool: str | None = None  # the InferencePool they must name; None: mapped
        self.watcher: Any = None

    def priorities(self, config: GatewayConfig) -> dict[str, int]:
        """The followed InferenceObjectives that name this EPP's pool: name -> priority."""
        out = {}
        for name, accepted in self._objectives.items():
            ref = accepted.spec.pool_ref
            if self._pool is not None:
                ours = is_inference_pool(ref) and ref.name == self._pool
            else:
                ours = config_pool_for(config, self._namespace, ref) == self.pool_name
            if ours:
                out[name] = accepted.spec.effective_priority
        return out

    def set(self, objectives: dict[str, Accepted[InferenceObjectiveSpec]]) -> None:
        self._objectives = objectives
        self._on_change()

    async def follow(
        self,
        namespace: str,
        pool: str | None = None,
        *,
        group: str = GROUP,
        api_client: Any = None,
        backoff_s: float = 1.0,
    ) -> None:
        """List + watch the InferenceObjectives of `namespace`; those whose poolRef names `pool`
        (default: the InferencePool of this EPP's configured pool) set request priorities."""
        from gateway.kube.llmd_watch import LlmdResourceWatcher  # loads the kubernetes client

        self._namespace, self._pool = namespace, pool
        self.watcher = LlmdResourceWatcher(
            LastGood(INFERENCE_OBJECTIVES, InferenceObjectiveSpec),
            namespace=namespace,
            on_change=self.set,
            api_client=api_client,
            group=group,
            backoff_s=backoff_s,
        )
        await self.watcher.start()

    async def stop(self) -> None:
        if self.watcher is not None:
            await self.watcher.stop()
