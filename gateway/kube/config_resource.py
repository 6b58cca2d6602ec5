"""The `InferenceGatewayConfig` custom resource as a configuration source.

The resource's `spec` has exactly the schema of the configuration file (gateway/config.py),
so every change goes through `ConfigStore.offer_data`: validated, applied within the watch
latency, or rejected and counted with the last good configuration left in force. While the
resource exists it is the one configuration source (`ConfigStore.resource_present`: an edit of
the --config file is not applied, and says so); absent or deleted, the file is again
(`resource_absent`: read and applied; without a file the last good configuration stays). The `kubernetes` client is loaded only when a watch starts, so a
service started without `--config-resource` never imports it.

With `write_status` (the xDS server: the one service whose verdict covers both the schema and
what Envoy can be given), every verdict is written to the resource's status subresource: the
`Ready` condition (`Applied`, or `Refused` with the reason and the generation still in force),
`observedGeneration`, `appliedGeneration` and the pools in force, so `kubectl get igc` says
whether an edit took effect and `kubectl describe` says why not.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
from typing import TYPE_CHECKING, Any

from prometheus_client import Gauge

from gateway.config_store import ConfigStore

if TYPE_CHECKING:
    import kubernetes

    from gateway.kube.watch import Obj, Reflector

log = logging.getLogger(__name__)

GROUP = "gateway.inference.dev"
VERSION = "v1alpha1"
PLURAL = "inferencegatewayconfigs"

RESOURCE_PRESENT = Gauge(
    "gateway_config_resource_present",
    "1 while the followed InferenceGatewayConfig exists (the configuration source), 0 while absent (the --config file is)",
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
        write_status: bool = False,
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
        # Set once the first list was handled (the resource offered, or found absent).
        self.synced = asyncio.Event()
        self._write_status = write_status
        self._applied_generation: int | None = None
        self._ready: tuple[str, float] | None = None  # the Ready condition's status and when it last changed
        self._status_pending: dict[str, Any] | None = None
        self._status_task: asyncio.Task[None] | None = None
        self._custom: Any = None

    @property
    def source(self) -> str:
        return f"{PLURAL}/{self.namespace}/{self.name}"

    async def start(self) -> None:
        import kubernetes

        from gateway.kube.watch import Reflector, default_api_client

        self._loop = asyncio.get_running_loop()
        if self._api_client is None:
            self._api_client = await asyncio.to_thread(default_api_client)
        custom = self._custom = kubernetes.client.CustomObjectsApi(self._api_client)

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

    async def wait_synced(self, timeout_s: float) -> bool:
        """Until the first list was handled; False if the API did not answer within `timeout_s`."""
        try:
            await asyncio.wait_for(self.synced.wait(), timeout_s)
        except TimeoutError:
            return False
        return True

    async def stop(self) -> None:
        if self._reflector is not None:
            self._reflector.stop()
            await asyncio.to_thread(self._reflector.join, 5.0)
        if self._status_task is not None:
            await self._status_task

    def _synced(self, cache: dict[str, Obj], _selector: str) -> None:
        """Reflector thread: hand the spec to the loop when the object's spec changed."""
        obj = cache.get(self.name)
        RESOURCE_PRESENT.labels(resource=self.source).set(0 if obj is None else 1)
        assert self._loop is not None
        if obj is None:
            self._last_generation = None  # a resource created again is offered whatever its generation
            self._loop.call_soon_threadsafe(self._absent)
            return
        meta = obj.get("metadata") or {}
        generation = meta.get("generation") or meta.get("resourceVersion")
        if generation == self._last_generation:
            return  # status-only update
        self._last_generation = generation
        spec = obj.get("spec") or {}
        self._loop.call_soon_threadsafe(self._offer, spec, generation)

    def _absent(self) -> None:
        """Loop: the file (when the service follows one) is the configuration source again."""
        self.store.resource_absent(self.source)
        self.synced.set()

    def _offer(self, spec: dict[str, Any], generation: Any) -> None:
        """Loop: the one verdict on this generation, then (write_status) say it in the status."""
        self.store.resource_present(self.source)
        applied = self.store.offer_data(spec, self.source)
        if applied:
            self._applied_generation = generation if isinstance(generation, int) else None
        self.synced.set()
        if self._write_status:
            self._status_pending = self._status(generation, applied)
            if self._status_task is None or self._status_task.done():
                self._status_task = asyncio.ensure_future(self._flush_status())

    def _status(self, generation: Any, applied: bool) -> dict[str, Any]:
        config = self.store.current()
        in_force = "; ".join(
            f"{pool.name} ({', '.join(m.name for m in pool.models)})" for pool in config.pools
        )
        if applied:
            ready, reason = "True", "Applied"
            message = f"in force: generation {generation}: pools {in_force}; {SOURCE_NOTE}"
        else:
            ready, reason = "False", "Refused"
            kept = (
                f"generation {self._applied_generation}" if self._applied_generation else "the previous one"
            )
            message = f"generation {generation} refused, {kept} stays in force: {self.store.last_refusal}"
        now = _now()
        if self._ready is None or self._ready[0] != ready:
            self._ready = (ready, now)
        condition: dict[str, Any] = {
            "type": "Ready",
            "status": ready,
            "reason": reason,
            "message": message[:MAX_MESSAGE],
            "lastTransitionTime": _timestamp(self._ready[1]),
        }
        if isinstance(generation, int):
            condition["observedGeneration"] = generation
        status: dict[str, Any] = {"pools": len(config.pools), "conditions": [condition]}
        if isinstance(generation, int):
            status["observedGeneration"] = generation
        if self._applied_generation is not None:
            status["appliedGeneration"] = self._applied_generation
        return status

    async def _flush_status(self) -> None:
        """Write the latest verdict (one write at a time; a newer verdict replaces a pending one).
        A failed write is logged: the configuration in force does not depend on it."""
        from kubernetes.client.exceptions import ApiException

        from gateway.kube.watch import TRANSPORT_ERRORS

        while self._status_pending is not None:
            status, self._status_pending = self._status_pending, None
            try:
                await asyncio.to_thread(
                    self._custom.patch_namespaced_custom_object_status,
                    GROUP, VERSION, self.namespace, PLURAL, self.name, {"status": status},
                )  # fmt: skip
            except ApiException as exc:
                log.warning("%s: status not written: API error %s %s", self.source, exc.status, exc.reason)
            except TRANSPORT_ERRORS as exc:
                log.warning("%s: status not written: %s: %s", self.source, type(exc).__name__, exc)


# Said in every Ready message: which configuration source is in force, and what that means for
# the file every service also mounts (gateway/config_store.py).
SOURCE_NOTE = (
    "source: this resource (each service's --config file, the gateway-config ConfigMap, is not "
    "applied while it exists)"
)
# The Ready condition's message: the pools in force, or the reason of a refusal, cut to this.
MAX_MESSAGE = 4000


def _now() -> float:
    return datetime.datetime.now(datetime.UTC).timestamp()


def _timestamp(seconds: float) -> str:
    """RFC 3339 in UTC, whole seconds: the form Kubernetes writes for a condition's time."""
    return datetime.datetime.fromtimestamp(int(seconds), datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_resource_ref(ref: str) -> tuple[str, str]:
    """`namespace/name` -> (namespace, name)."""
    namespace, sep, name = ref.partition("/")
    if not sep or not namespace or not name:
        raise ValueError(f"--config-resource must be namespace/name, got {ref!r}")
    return namespace, name


async def start_resource_watcher(
    store: ConfigStore[Any], ref: str | None, *, write_status: bool = False
) -> ConfigResourceWatcher | None:
    if not ref:
        return None
    namespace, name = parse_resource_ref(ref)
    watcher = ConfigResourceWatcher(store, namespace=namespace, name=name, write_status=write_status)
    await watcher.start()
    return watcher
