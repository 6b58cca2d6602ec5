"""The `InferenceGatewayConfig` custom resource as a configuration source.

The resource's `spec` has exactly the schema of the configuration file (gateway/config.py),
so every change goes through `ConfigStore.offer_data`: validated, applied within the watch
latency, or rejected and counted with the last good configuration left in force. A deleted
resource also leaves the last good configuration in force (an accidental `kubectl delete`
must not take traffic down). The `kubernetes` client is loaded only when a watch starts, so a
service started without `--config-resource` never imports it.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from prometheus_client import Gauge

from gateway.config_store import ConfigStore

if TYPE_CHECKING:
    import kubernetes

    from gateway.kube_watch import Obj, Reflector

log = logging.getLogger(__name__)

GROUP = "gateway.inference.dev"
VERSION = "v1alpha1"
PLURAL = "inferencegatewayconfigs"

RESOURCE_PRESENT = Gauge(
    "gateway_config_resource_present",
    "1 while the followed InferenceGatewayConfig exists, 0 once it was deleted (last good config kept)",
    ["resource"],
)


class ConfigResourceWatcher:
    def __init__(
        self,
        store: ConfigStore[Any],
        *,
        namespace: str,
        name: str,
        api_client: kubernetes.client.ApiClient | None = None,
        backoff_s: float = 1.0,
        watch_timeout_s: int = 300,
    ) -> None:
        self.store = store
        self.namespace = namespace
        self.name = name
        self._api_client = api_client
        self._backoff_s = backoff_s
        self._watch_timeout_s = watch_timeout_s
        self._reflector: Reflector | None = None
        self._last_generation: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def source(self) -> str:
        return f"{PLURAL}/{self.namespace}/{self.name}"

    async def start(self) -> None:
        import kubernetes

        from gateway.kube_watch import Reflector, default_api_client

        self._loop = asyncio.get_running_loop()
        if self._api_client is None:
            self._api_client = await asyncio.to_thread(default_api_client)
        custom = kubernetes.client.CustomObjectsApi(self._api_client)

        def list_configs(**kw: Any) -> Any:
            return custom.list_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, **kw)

        self._reflector = Reflector(
            self.source,
            list_configs,
            self._synced,
            lambda exc: False,  # keep retrying: the last good config stays meanwhile
            selector_kind="field_selector",
            selector=f"metadata.name={self.name}",
            backoff_s=self._backoff_s,
            watch_timeout_s=self._watch_timeout_s,
        )
        self._reflector.start()

    async def stop(self) -> None:
        if self._reflector is not None:
            self._reflector.stop()
            await asyncio.to_thread(self._reflector.join, 5.0)

    def _synced(self, cache: dict[str, Obj], _selector: str) -> None:
        """Reflector thread: hand the spec to the loop when the object's spec changed."""
        obj = cache.get(self.name)
        RESOURCE_PRESENT.labels(resource=self.source).set(0 if obj is None else 1)
        if obj is None:
            log.warning("%s is absent; keeping the current configuration", self.source)
            return
        generation = (obj.get("metadata") or {}).get("generation") or (obj.get("metadata") or {}).get(
            "resourceVersion"
        )
        if generation == self._last_generation:
            return  # status-only update
        self._last_generation = generation
        spec = obj.get("spec") or {}
        assert self._loop is not None
        self._loop.call_soon_threadsafe(self.store.offer_data, spec, self.source)


def parse_resource_ref(ref: str) -> tuple[str, str]:
    """`namespace/name` -> (namespace, name)."""
    namespace, sep, name = ref.partition("/")
    if not sep or not namespace or not name:
        raise ValueError(f"--config-resource must be namespace/name, got {ref!r}")
    return namespace, name


async def start_resource_watcher(store: ConfigStore[Any], ref: str | None) -> ConfigResourceWatcher | None:
    if not ref:
        return None
    namespace, name = parse_resource_ref(ref)
    watcher = ConfigResourceWatcher(store, namespace=namespace, name=name)
    await watcher.start()
    return watcher
