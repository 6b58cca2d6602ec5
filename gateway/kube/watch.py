"""A list/watch mirror of Kubernetes objects on a worker thread, shared by every watcher.

The `kubernetes` client is synchronous; `Reflector` runs list + watch in its own thread and
hands a complete name -> object cache to a callback after every change. It re-lists on
410 Gone (swapping in the new cache only once complete), resumes from the last
resourceVersion after disconnects with exponential backoff, and follows bookmarks. Anything
else (a bug in a callback, an object of an unexpected shape) escapes the watch loop to
`gateway.supervise.run_supervised`, which logs the traceback, counts it and restarts the
loop with a fresh list after a backoff: the thread never dies silently. Used by
InferencePool discovery (epp/datalayer/discovery/kubernetes.py) and the InferenceGatewayConfig source
(gateway/kube/config_resource.py).
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Callable, Mapping
from typing import Any

import kubernetes
from kubernetes import watch as k8s_watch
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError as Urllib3Error

from extproc.server import StartupError
from gateway.supervise import Backoff, run_supervised

log = logging.getLogger(__name__)

GONE = 410
MAX_BACKOFF_S = 30.0
# What a flaky API server or network does to a list/watch: retried from the last
# resourceVersion. Anything else is a bug and goes to the supervisor (re-list).
TRANSPORT_ERRORS: tuple[type[BaseException], ...] = (Urllib3Error, OSError, ValueError)

Obj = dict[str, Any]


def object_name(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("name", ""))


def resource_version_of(obj: Mapping[str, Any]) -> str | None:
    rv = (obj.get("metadata") or {}).get("resourceVersion")
    return str(rv) if rv else None


class Reflector:
    """Mirrors one list/watch into a name -> object cache, in its own thread.

    Every change calls `on_sync(cache_copy, selector)` from that thread. A 410 Gone re-lists
    into a fresh cache that replaces the old one only once complete; other failures retry the
    watch from the last resourceVersion with exponential backoff. `set_selector` re-lists;
    a `None` selector pauses the loop.
    """

    def __init__(
        self,
        name: str,
        list_call: Callable[..., Any],
        on_sync: Callable[[dict[str, Obj], str], None],
        on_fatal: Callable[[ApiException], bool],
        *,
        selector_kind: str,
        selector: str | None,
        backoff_s: float,
        watch_timeout_s: int,
    ) -> None:
        self.name = name
        self._list_call = list_call  # (**kwargs) -> urllib3 response
        self._on_sync = on_sync
        self._on_fatal = on_fatal
        self._selector_kind = selector_kind  # "label_selector" | "field_selector"
        self._selector = selector
        self._generation = 0
        self._backoff = Backoff(initial_s=backoff_s, max_s=MAX_BACKOFF_S)  # retries and restarts
        self._watch_timeout_s = watch_timeout_s
        self._wake = threading.Event()
        self._stopped = False
        self._lock = threading.Lock()
        self._watch: k8s_watch.Watch | None = None
        self._watcher = k8s_watch.Watch()  # reused: each one builds its own ApiClient
        self._cache: dict[str, Obj] = {}
        self.resource_version: str | None = None  # last seen: list, event or bookmark
        self.lists = 0  # full lists done (tests and /debug read it)
        self._thread = threading.Thread(target=self._supervised, name=f"discovery-{name}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def set_selector(self, selector: str | None) -> None:
        with self._lock:
            if selector == self._selector:
                return
            self._selector = selector
            self._generation += 1
            current = self._watch
        self._wake.set()
        if current is not None:
            current.stop()  # shuts the socket down: the blocked read returns now

    def stop(self) -> None:
        with self._lock:
            self._stopped = True
            current = self._watch
        self._wake.set()
        if current is not None:
            current.stop()

    def join(self, timeout: float) -> None:
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _current(self) -> tuple[int, str | None]:
        with self._lock:
            return self._generation, self._selector

    def _supervised(self) -> None:
        run_supervised(
            "kube-watch",
            self.name,
            self._run,
            stopped=lambda: self._stopped,
            wait=self._wait,
            backoff=self._backoff,
        )

    def _wait(self, seconds: float) -> None:
        self._wake.wait(seconds)
        self._wake.clear()

    def _run(self) -> None:
        """List, then watch from the list's resourceVersion; re-list on 410 or a new selector."""
        failures = 0
        need_list = True
        while not self._stopped:
            generation, selector = self._current()
            if selector is None:
                self._wake.wait()
                self._wake.clear()
                need_list = True
                continue
            try:
                if need_list:
                    cache = self._list(selector)
                    if self._current()[0] != generation:
                        continue  # selector changed while listing: list again
                    need_list = False
                    self._on_sync(dict(cache), selector)
                else:
                    cache = self._cache
                self._cache = cache
                self._watch_from(cache, selector, generation)
                failures = 0
            except ApiException as exc:
                if self._stopped:
                    break
                if self._current()[0] != generation:
                    need_list = True
                    continue
                if exc.status == GONE:
                    log.info("%s: watch expired (410 Gone), re-listing", self.name)
                    need_list = True
                    continue
                if self._on_fatal(exc):
                    break
                failures += 1
                log.warning("%s: API error %s %s, retry #%d", self.name, exc.status, exc.reason, failures)
                self._sleep_backoff(failures)
            except Exception as exc:
                if self._stopped:
                    break
                if self._current()[0] != generation:  # our own stop() cut the connection
                    need_list = True
                    continue
                if not isinstance(exc, TRANSPORT_ERRORS):
                    raise  # a bug, not the network: the supervisor logs, counts and re-lists
                failures += 1
                log.warning("%s: %s: %s, retry #%d", self.name, type(exc).__name__, exc, failures)
                self._sleep_backoff(failures)
            if self._current()[0] != generation:
                need_list = True

    def _sleep_backoff(self, failures: int) -> None:
        self._wait(self._backoff.delay(failures))

    def _list(self, selector: str) -> dict[str, Obj]:
        resp = self._list_call(
            **{self._selector_kind: selector}, _preload_content=False, _request_timeout=(5, 30)
        )
        if not 200 <= resp.status <= 299:
            raise ApiException(status=resp.status, reason=resp.reason)
        body = json.loads(resp.data)
        self.lists += 1
        self.resource_version = resource_version_of(body)
        return {object_name(item): item for item in body.get("items") or []}

    def _watch_from(self, cache: dict[str, Obj], selector: str, generation: int) -> None:
        w = self._watcher
        with self._lock:
            if self._stopped or generation != self._generation:
                return
            self._watch = w

        def call(**kw: Any) -> Any:
            resp = self._list_call(**kw)
            with self._lock:  # a stop() that raced Watch.stream's own reset of its flag
                stale = self._stopped or generation != self._generation
            if stale:
                resp.close()
            return resp

        try:
            stream = w.stream(
                call,
                resource_version=self.resource_version,
                allow_watch_bookmarks=True,
                timeout_seconds=self._watch_timeout_s,
                _request_timeout=(5, self._watch_timeout_s + 15),
                **{self._selector_kind: selector},
            )
            for event in stream:
                if self._stopped or self._current()[0] != generation:
                    return
                obj = event["raw_object"]
                self.resource_version = resource_version_of(obj) or self.resource_version
                kind = event["type"]
                if kind in ("ADDED", "MODIFIED"):
                    cache[object_name(obj)] = obj
                elif kind == "DELETED":
                    cache.pop(object_name(obj), None)
                else:
                    continue  # BOOKMARK: only the resourceVersion moves
                self._on_sync(dict(cache), selector)
        finally:
            with self._lock:
                self._watch = None


def default_api_client() -> kubernetes.client.ApiClient:
    """In-cluster service account when running in a pod, else the local kubeconfig; neither is
    a StartupError saying so (the flags that need a cluster cannot work without one)."""
    try:
        kubernetes.config.load_incluster_config()
    except kubernetes.config.ConfigException:
        # Read KUBECONFIG now: the client library reads it once, at import time.
        try:
            kubernetes.config.load_kube_config(config_file=os.environ.get("KUBECONFIG"))
        except (kubernetes.config.ConfigException, OSError) as exc:
            raise StartupError(
                f"no Kubernetes cluster: not in a pod and no usable kubeconfig ({exc}); run in a cluster "
                "or set KUBECONFIG (--pool-name, --config-resource and the resource-following flags need one)"
            ) from None
    return kubernetes.client.ApiClient()
