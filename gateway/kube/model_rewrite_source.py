"""Follows the InferenceModelRewrites of one namespace into a router (BBR's `BodyRouter`, or the
single-hop EPP's `ModelRouter`).

Imported only when `--inference-model-rewrites` is given: it loads the `kubernetes` client.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import kubernetes

from gateway.config import GatewayConfig
from gateway.kube.llmd_api import (
    GROUP,
    INFERENCE_MODEL_REWRITES,
    Accepted,
    InferenceModelRewriteSpec,
    LastGood,
    check_rewrite_targets,
)
from gateway.kube.llmd_watch import LlmdResourceWatcher
from gateway.model_rewrites import ModelRewrites


class RewriteTarget(Protocol):
    def set_model_rewrites(self, rewrites: ModelRewrites) -> None: ...


async def follow_model_rewrites(
    router: RewriteTarget,
    config: Callable[[], GatewayConfig],
    namespace: str,
    *,
    group: str = GROUP,
    api_client: kubernetes.client.ApiClient | None = None,
    backoff_s: float = 1.0,
) -> LlmdResourceWatcher[InferenceModelRewriteSpec]:
    """Start the watch; every valid change replaces the router's rule set whole."""

    def apply(accepted: dict[str, Accepted[InferenceModelRewriteSpec]]) -> None:
        router.set_model_rewrites(ModelRewrites(namespace, accepted))

    resources = LastGood(INFERENCE_MODEL_REWRITES, InferenceModelRewriteSpec, check_rewrite_targets(config))
    watcher = LlmdResourceWatcher(
        resources,
        namespace=namespace,
        on_change=apply,
        api_client=api_client,
        group=group,
        backoff_s=backoff_s,
    )
    await watcher.start()
    return watcher
