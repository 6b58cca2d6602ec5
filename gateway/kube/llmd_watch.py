"""List + watch InferenceObjectives or InferenceModelRewrites of one namespace.

The same `Reflector` machinery as InferencePool discovery and the InferenceGatewayConfig source
(gateway/kube/watch.py: 410 Gone re-lists, resumes with backoff, a supervised thread). Each
change is vetted by `LastGood` on the watch thread and the valid set handed to `on_change` on
the asyncio loop. Import this module only when a watch is asked for: it loads `kubernetes`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any, Generic

import kubernetes
from kubernetes.client.exceptions import ApiException

from gateway.kube.llmd_api import GROUP, VERSION, Accepted, LastGood, S
from gateway.kube.watch import Obj, Reflector, default_api_client
from gateway.supervise import report_failure

log = logging.getLogger(__name__)


class LlmdResourceWatcher(Generic[S]):
    def __init__(
        self,
        resources: LastGood[S],
        *,
        namespace: str,
        on_change: Callable[[dict[str, Accepted[S]]], None],
        api_client: kubernetes.client.ApiClient | None = None,
        group: str = GROUP,
        version: str = VERSION,
        backoff_s: float = 1.0,
        watch_timeout_s: int = 300,
    ) -> None:
        self.resources = resources
        self.namespace = namespace
        self._on_change = on_change
        self._api_client = api_client
        self._own_client = api_client is None
        self._group, self._version = group, version
        self._backoff_s = backoff_s
        self._watch_timeout_s = watch_timeout_s
        self._reflector: Reflector | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._hinted = False
        self._closed = False

    @property
    def source(self) -> str:
        return f"{self.resources.kind.plural}.{self._group}/{self.namespace}"

    @property
    def lists(self) -> int:
        return self._reflector.lists if self._reflector else 0

    async def start(self) -> None:
        """Starts following; returns at once (the first list is delivered when it arrives)."""
        self._loop = asyncio.get_running_loop()
        if self._api_client is None:
            self._api_client = await asyncio.to_thread(default_api_client)
        custom = kubernetes.client.CustomObjectsApi(self._api_client)
        plural = self.resources.kind.plural

        def list_resources(**kw: Any) -> Any:  # no return annotation: Watch yields raw dicts
            return custom.list_namespaced_custom_object(
                self._group, self._version, self.namespace, plural, **kw
            )

        self._reflector = Reflector(
            self.source,
            list_resources,
            self._synced,
            self._fatal,
            selector_kind="label_selector",
            selector="",  # every object of the namespace
            backoff_s=self._backoff_s,
            watch_timeout_s=self._watch_timeout_s,
        )
        self._reflector.start()
        log.info("following %s", self.source)

    async def stop(self) -> None:
        self._closed = True
        if self._reflector is not None:
            self._reflector.stop()
            await asyncio.to_thread(self._reflector.join, 5.0)
        if self._own_client and self._api_client is not None:
            self._api_client.close()
            self._api_client = None

    def _fatal(self, exc: ApiException) -> bool:
        """Never fatal: keep retrying with backoff (what is in force stays), but say why once."""
        if exc.status in (403, 404) and not self._hinted:
            self._hinted = True
            hint = "check the RBAC Role" if exc.status == 403 else "is the llm-d CRD installed?"
            log.error("%s: Kubernetes API %s %s: %s", self.source, exc.status, exc.reason, hint)
        return False

    def _synced(self, cache: dict[str, Obj], _selector: str) -> None:
        """Watch thread: vet the new state, hand the valid set to the loop."""
        accepted = self.resources.update(cache)
        if self._loop is not None and not self._closed:
            self._loop.call_soon_threadsafe(self._deliver, accepted)

    def _deliver(self, accepted: dict[str, Accepted[S]]) -> None:
        if self._closed:
            return
        try:
            self._on_change(accepted)
        except Exception as exc:
            report_failure("llmd-resource-callback", self.source, exc)
