"""Endpoints from a Kubernetes InferencePool and the pods its selector matches.

The `kubernetes` client is synchronous, so each list/watch loop (one for the pool object, one
for its pods) runs in a worker thread and hands finished endpoint sets to the asyncio loop with
`call_soon_threadsafe`. A loop keeps a name -> object cache; the endpoint set is recomputed from
the caches after every event and delivered only when it differs from the last one delivered.

Pod metadata the discovery reads (keys documented in deploy/README.md):
- annotation or label `gateway.inference.dev/model`: served base model(s), comma-separated
  (an annotation, because model ids such as `meta-llama/Llama-3.1-8B` are not valid label
  values); default: `default_models`, else the pool's name.
- annotation `gateway.inference.dev/adapters`: LoRA adapters the pod can load, comma-separated.
- label `gateway.inference.dev/engine`: metric dialect (vllm|sglang|tgi|trtllm), overriding
  the pool-wide `engine`.
- annotation `gateway.inference.dev/metrics-port`: scrape `/metrics` there instead of the
  serving port.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import logging
import random
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import kubernetes
from kubernetes import watch as k8s_watch
from kubernetes.client.exceptions import ApiException

from epp.pool import Endpoint

log = logging.getLogger(__name__)

MODEL_KEY = "gateway.inference.dev/model"
ADAPTERS_ANNOTATION = "gateway.inference.dev/adapters"
ENGINE_LABEL = "gateway.inference.dev/engine"
METRICS_PORT_ANNOTATION = "gateway.inference.dev/metrics-port"
ENGINES = frozenset({"vllm", "sglang", "tgi", "trtllm"})

POOL_GROUP = "inference.networking.k8s.io"
POOL_VERSION = "v1"
POOL_PLURAL = "inferencepools"

_GONE = 410
_FATAL_AT_START = {401, 403, 404}  # wrong credentials, missing RBAC, CRD not installed
_MAX_BACKOFF_S = 30.0

Obj = dict[str, Any]


class DiscoveryError(RuntimeError):
    """Discovery cannot start (unreachable API, missing permission or CRD)."""


class PoolSpecError(ValueError):
    """An InferencePool whose spec cannot be used."""


@dataclass(frozen=True, slots=True)
class PoolSpec:
    selector: tuple[tuple[str, str], ...]  # sorted matchLabels
    ports: tuple[int, ...]

    @property
    def label_selector(self) -> str:
        return ",".join(f"{k}={v}" for k, v in self.selector)


def parse_pool(obj: Mapping[str, Any]) -> PoolSpec:
    """The parts of an InferencePool that decide its endpoints."""
    spec = obj.get("spec") or {}
    selector = spec.get("selector") or {}
    if not isinstance(selector, Mapping):
        raise PoolSpecError("spec.selector must be a map")
    # v1: selector.matchLabels + targetPorts; v1alpha2: a flat selector map + targetPortNumber.
    v1 = "matchLabels" in selector or "matchExpressions" in selector or "targetPorts" in spec
    match_labels = selector.get("matchLabels") if v1 else selector
    if not isinstance(match_labels, Mapping) or not match_labels:
        raise PoolSpecError(
            "spec.selector.matchLabels must be a non-empty map (an empty one would select every pod)"
        )
    if selector.get("matchExpressions"):
        raise PoolSpecError("spec.selector.matchExpressions is not supported; use matchLabels")
    ports = []
    if not v1 and "targetPortNumber" in spec:
        spec = {"targetPorts": [{"number": spec["targetPortNumber"]}]}
    for entry in spec.get("targetPorts") or []:
        number = entry.get("number") if isinstance(entry, Mapping) else None
        if not isinstance(number, int) or not 0 < number < 65536:
            raise PoolSpecError(f"spec.targetPorts: invalid port {entry!r}")
        ports.append(number)
    if not ports:
        raise PoolSpecError("spec.targetPorts must list at least one port")
    return PoolSpec(tuple(sorted((str(k), str(v)) for k, v in match_labels.items())), tuple(ports))


def pod_is_serving(pod: Mapping[str, Any]) -> bool:
    """Running, Ready=True, not terminating, and has an IP."""
    meta, status = pod.get("metadata") or {}, pod.get("status") or {}
    if meta.get("deletionTimestamp") or status.get("phase") != "Running" or not status.get("podIP"):
        return False
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])


def _csv(value: str | None) -> list[str]:
    return [part.strip() for part in (value or "").split(",") if part.strip()]


def _host_port(ip: str, port: int) -> str:
    try:
        is_v6 = ipaddress.ip_address(ip).version == 6
    except ValueError:
        is_v6 = False
    return f"[{ip}]:{port}" if is_v6 else f"{ip}:{port}"


def pod_endpoints(
    pod: Mapping[str, Any],
    spec: PoolSpec,
    *,
    pool_name: str,
    engine: str = "vllm",
    default_models: Iterable[str] = (),
    default_adapters: Iterable[str] = (),
) -> list[Endpoint]:
    """One Endpoint per target port of a serving pod; [] for a pod that must not get traffic."""
    if not pod_is_serving(pod):
        return []
    meta = pod.get("metadata") or {}
    labels: dict[str, str] = dict(meta.get("labels") or {})
    annotations: dict[str, str] = dict(meta.get("annotations") or {})
    models = (
        _csv(annotations.get(MODEL_KEY)) or _csv(labels.get(MODEL_KEY)) or list(default_models) or [pool_name]
    )
    adapters = (
        _csv(annotations.get(ADAPTERS_ANNOTATION)) if ADAPTERS_ANNOTATION in annotations else default_adapters
    )
    pod_engine = labels.get(ENGINE_LABEL, engine)
    if pod_engine not in ENGINES:
        log.warning(
            "pod %s: unknown engine %r in %s, using %s", meta.get("name"), pod_engine, ENGINE_LABEL, engine
        )
        pod_engine = engine
    ip = pod["status"]["podIP"]
    metrics_port = annotations.get(METRICS_PORT_ANNOTATION, "")
    metrics_url = f"http://{_host_port(ip, int(metrics_port))}/metrics" if metrics_port.isdigit() else None
    return [
        Endpoint(
            address=_host_port(ip, port),
            models=frozenset(models),
            adapters=frozenset(adapters),
            engine=pod_engine,
            labels=labels,
            metrics_url=metrics_url,
        )
        for port in spec.ports
    ]


def _name(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("name", ""))


def _resource_version(obj: Mapping[str, Any]) -> str | None:
    rv = (obj.get("metadata") or {}).get("resourceVersion")
    return str(rv) if rv else None


class _Reflector:
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
        self._backoff_s = backoff_s
        self._watch_timeout_s = watch_timeout_s
        self._wake = threading.Event()
        self._stopped = False
        self._lock = threading.Lock()
        self._watch: k8s_watch.Watch | None = None
        self._watcher = k8s_watch.Watch()  # reused: each one builds its own ApiClient
        self._cache: dict[str, Obj] = {}
        self.resource_version: str | None = None  # last seen: list, event or bookmark
        self.lists = 0  # full lists done (tests and /debug read it)
        self._thread = threading.Thread(target=self._run, name=f"discovery-{name}", daemon=True)

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

    def _run(self) -> None:
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
                if exc.status == _GONE:
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
                failures += 1
                log.warning("%s: %s: %s, retry #%d", self.name, type(exc).__name__, exc, failures)
                self._sleep_backoff(failures)
            if self._current()[0] != generation:
                need_list = True

    def _sleep_backoff(self, failures: int) -> None:
        delay = min(_MAX_BACKOFF_S, self._backoff_s * 2 ** min(failures - 1, 10))
        self._wake.wait(delay * random.uniform(0.8, 1.2))
        self._wake.clear()

    def _list(self, selector: str) -> dict[str, Obj]:
        resp = self._list_call(
            **{self._selector_kind: selector}, _preload_content=False, _request_timeout=(5, 30)
        )
        if not 200 <= resp.status <= 299:
            raise ApiException(status=resp.status, reason=resp.reason)
        body = json.loads(resp.data)
        self.lists += 1
        self.resource_version = _resource_version(body)
        return {_name(item): item for item in body.get("items") or []}

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
                self.resource_version = _resource_version(obj) or self.resource_version
                kind = event["type"]
                if kind in ("ADDED", "MODIFIED"):
                    cache[_name(obj)] = obj
                elif kind == "DELETED":
                    cache.pop(_name(obj), None)
                else:
                    continue  # BOOKMARK: only the resourceVersion moves
                self._on_sync(dict(cache), selector)
        finally:
            with self._lock:
                self._watch = None


class InferencePoolDiscovery:
    """Follows one InferencePool and calls `on_change(endpoints)` on the loop when they change.

    `start()` returns once the first complete endpoint set has been delivered (empty when the
    pool does not exist yet). It raises `DiscoveryError` if the first list fails for a reason
    retrying cannot fix (401/403/404) or if nothing arrives within `start_timeout_s`.
    """

    def __init__(
        self,
        *,
        namespace: str,
        pool_name: str,
        on_change: Callable[[list[Endpoint]], None],
        api_client: kubernetes.client.ApiClient | None = None,
        engine: str = "vllm",
        resync_backoff_s: float = 1.0,
        default_models: Iterable[str] = (),
        default_adapters: Iterable[str] = (),
        watch_timeout_s: int = 300,
        start_timeout_s: float | None = 60.0,
        pool_group: str = POOL_GROUP,
        pool_version: str = POOL_VERSION,
    ) -> None:
        if engine not in ENGINES:
            raise ValueError(f"engine must be one of {sorted(ENGINES)}, got {engine!r}")
        self.namespace = namespace
        self.pool_name = pool_name
        self._on_change = on_change
        self._api_client = api_client
        self._own_client = api_client is None
        self._engine = engine
        self._backoff_s = resync_backoff_s
        self._default_models = tuple(default_models)
        self._default_adapters = tuple(default_adapters)
        self._watch_timeout_s = watch_timeout_s
        self._start_timeout_s = start_timeout_s
        self._pool_api = (
            pool_group,
            pool_version,
        )  # v1alpha2 clusters: ("inference.networking.x-k8s.io", "v1alpha2")
        self._lock = threading.Lock()
        self._spec: PoolSpec | None = None
        self._pool_known = False  # the pool list has completed at least once
        self._pods: dict[str, Obj] = {}
        self._pods_selector: str | None = None  # the selector `_pods` was listed with
        self._last: list[Endpoint] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._first: asyncio.Future[None] | None = None
        self._pool_reflector: _Reflector | None = None
        self._pod_reflector: _Reflector | None = None
        self._closed = False

    # -- public -----------------------------------------------------------------------
    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._first = self._loop.create_future()
        if self._api_client is None:
            self._api_client = await asyncio.to_thread(_default_api_client)
        core = kubernetes.client.CoreV1Api(self._api_client)
        custom = kubernetes.client.CustomObjectsApi(self._api_client)

        # Plain wrappers without return annotations: Watch then yields raw dicts, not models.
        def list_pods(**kw: Any) -> Any:
            return core.list_namespaced_pod(self.namespace, **kw)

        def list_pools(**kw: Any) -> Any:
            group, version = self._pool_api
            return custom.list_namespaced_custom_object(group, version, self.namespace, POOL_PLURAL, **kw)

        common = {"backoff_s": self._backoff_s, "watch_timeout_s": self._watch_timeout_s}
        self._pod_reflector = _Reflector(
            f"pods/{self.namespace}", list_pods, self._pods_synced, self._fatal,
            selector_kind="label_selector", selector=None, **common,
        )  # fmt: skip
        self._pool_reflector = _Reflector(
            f"inferencepool/{self.namespace}/{self.pool_name}", list_pools, self._pool_synced, self._fatal,
            selector_kind="field_selector", selector=f"metadata.name={self.pool_name}", **common,
        )  # fmt: skip
        self._pod_reflector.start()
        self._pool_reflector.start()
        try:
            await asyncio.wait_for(asyncio.shield(self._first), self._start_timeout_s)
        except TimeoutError:
            await self.stop()
            raise DiscoveryError(
                f"no endpoint list for InferencePool {self.namespace}/{self.pool_name} "
                f"within {self._start_timeout_s:g}s (is the API server reachable?)"
            ) from None
        except DiscoveryError:
            await self.stop()
            raise

    async def stop(self) -> None:
        self._closed = True
        reflectors = [r for r in (self._pool_reflector, self._pod_reflector) if r is not None]
        for r in reflectors:
            r.stop()
        for r in reflectors:
            await asyncio.to_thread(r.join, 5.0)
        if self._own_client and self._api_client is not None:
            self._api_client.close()
            self._api_client = None

    @property
    def endpoints(self) -> list[Endpoint]:
        """The set last handed to `on_change` ([] before the first delivery)."""
        return list(self._last or [])

    @property
    def pod_resource_version(self) -> str | None:
        return self._pod_reflector.resource_version if self._pod_reflector else None

    @property
    def pod_lists(self) -> int:
        return self._pod_reflector.lists if self._pod_reflector else 0

    # -- reflector callbacks (worker threads) -------------------------------------------
    def _pool_synced(self, cache: dict[str, Obj], _selector: str) -> None:
        obj = cache.get(self.pool_name)
        spec: PoolSpec | None = None
        if obj is not None:
            try:
                spec = parse_pool(obj)
            except PoolSpecError as exc:
                log.error(
                    "InferencePool %s/%s: %s; no endpoints until fixed", self.namespace, self.pool_name, exc
                )
        elif not self._pool_known or self._spec is not None:
            log.warning("InferencePool %s/%s not found; no endpoints", self.namespace, self.pool_name)
        with self._lock:
            self._spec, self._pool_known = spec, True
            if spec is None:
                self._pods, self._pods_selector = {}, None  # a returning pool re-lists its pods
        assert self._pod_reflector is not None
        self._pod_reflector.set_selector(spec.label_selector if spec else None)
        self._publish()

    def _pods_synced(self, cache: dict[str, Obj], selector: str) -> None:
        with self._lock:
            self._pods, self._pods_selector = cache, selector
        self._publish()

    def _fatal(self, exc: ApiException) -> bool:
        """At start-up, errors retrying cannot fix fail `start()`; later they are retried."""
        first = self._first
        if first is None or first.done() or exc.status not in _FATAL_AT_START or self._loop is None:
            return False
        hint = {
            401: "check credentials",
            403: "check the RBAC Role",
            404: "is the InferencePool CRD installed?",
        }
        err = DiscoveryError(f"Kubernetes API {exc.status} {exc.reason}: {hint[exc.status or 0]}")
        self._loop.call_soon_threadsafe(_set_exception, first, err)
        return True

    def _publish(self) -> None:
        with self._lock:
            if not self._pool_known:
                return
            spec = self._spec
            if spec is None:
                endpoints: list[Endpoint] = []
            elif self._pods_selector != spec.label_selector:
                return  # pods are being re-listed for a new selector: keep the last set
            else:
                endpoints = []
                for pod in self._pods.values():
                    endpoints += pod_endpoints(
                        pod, spec, pool_name=self.pool_name, engine=self._engine,
                        default_models=self._default_models, default_adapters=self._default_adapters,
                    )  # fmt: skip
                endpoints.sort(key=lambda e: e.address)
            if endpoints == self._last:
                return
            self._last = endpoints
            if self._loop is not None and not self._closed:
                self._loop.call_soon_threadsafe(self._deliver, list(endpoints))

    # -- event loop ---------------------------------------------------------------------
    def _deliver(self, endpoints: list[Endpoint]) -> None:
        if self._closed:
            return
        try:
            self._on_change(endpoints)
        except Exception:
            log.exception("on_change callback failed")
        if self._first is not None and not self._first.done():
            self._first.set_result(None)


def _set_exception(future: asyncio.Future[None], exc: BaseException) -> None:
    if not future.done():
        future.set_exception(exc)


def _default_api_client() -> kubernetes.client.ApiClient:
    """In-cluster service account when running in a pod, else the local kubeconfig."""
    try:
        kubernetes.config.load_incluster_config()
    except kubernetes.config.ConfigException:
        kubernetes.config.load_kube_config()
    return kubernetes.client.ApiClient()
