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
- label `gateway.inference.dev/engine`: metric dialect (vllm|sglang|tgi|trtllm|llamacpp), overriding
  the pool-wide `engine`.
- annotation `gateway.inference.dev/metrics-port`: scrape `/metrics` there instead of the
  serving port.
- annotations `gateway.inference.dev/kv-events-port` and `.../kv-events-replay-port`: the
  pod's vLLM KV-event PUB and replay ports (over the pool's `kvEvents` ports).
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import kubernetes
from kubernetes.client.exceptions import ApiException

from epp.datalayer.endpoint_records import Endpoint
from extproc.server import StartupError
from gateway.kube.watch import Obj, Reflector, default_api_client
from gateway.supervise import report_failure

log = logging.getLogger(__name__)

MODEL_KEY = "gateway.inference.dev/model"
ADAPTERS_ANNOTATION = "gateway.inference.dev/adapters"
ENGINE_LABEL = "gateway.inference.dev/engine"
METRICS_PORT_ANNOTATION = "gateway.inference.dev/metrics-port"
KV_EVENTS_PORT_ANNOTATION = "gateway.inference.dev/kv-events-port"
KV_REPLAY_PORT_ANNOTATION = "gateway.inference.dev/kv-events-replay-port"
DP_SIZE_ANNOTATION = "gateway.inference.dev/data-parallel-size"  # vLLM --data-parallel-size
ENGINES = frozenset({"vllm", "sglang", "tgi", "trtllm", "llamacpp"})

POOL_GROUP = "inference.networking.k8s.io"
POOL_VERSION = "v1"
POOL_PLURAL = "inferencepools"

_FATAL_AT_START = {401, 403, 404}  # wrong credentials, missing RBAC, CRD not installed


class DiscoveryError(StartupError, RuntimeError):
    """Discovery cannot start (unreachable API, missing permission or CRD): the command line
    prints it as its one-line error."""


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


def _port_annotation(annotations: Mapping[str, str], key: str, pod: object) -> int | None:
    """A port number from an annotation; None (with a warning) for anything else."""
    value = str(annotations.get(key, "")).strip()
    if not value:
        return None
    if value.isascii() and value.isdigit() and 0 < int(value) < 65536:
        return int(value)
    log.warning("pod %s: ignoring %s=%r (not a port)", pod, key, value)
    return None


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
    kv_port = _port_annotation(annotations, KV_EVENTS_PORT_ANNOTATION, meta.get("name"))
    kv_replay = _port_annotation(annotations, KV_REPLAY_PORT_ANNOTATION, meta.get("name"))
    dp_size = str(annotations.get(DP_SIZE_ANNOTATION, "1")).strip()
    if not (dp_size.isascii() and dp_size.isdigit() and 1 <= int(dp_size) <= 64):
        log.warning("pod %s: ignoring %s=%r (not 1-64)", meta.get("name"), DP_SIZE_ANNOTATION, dp_size)
        dp_size = "1"
    metrics_url = None
    metrics_port = str(annotations.get(METRICS_PORT_ANNOTATION, "")).strip()
    if metrics_port:
        if metrics_port.isascii() and metrics_port.isdigit() and 0 < int(metrics_port) < 65536:
            metrics_url = f"http://{_host_port(ip, int(metrics_port))}/metrics"
        else:  # "²" is a digit to str.isdigit and 99999 is no port: scrape the serving port
            log.warning(
                "pod %s: ignoring %s=%r (not a port)", meta.get("name"), METRICS_PORT_ANNOTATION, metrics_port
            )
    return [
        Endpoint(
            address=_host_port(ip, port),
            models=frozenset(models),
            adapters=frozenset(adapters),
            engine=pod_engine,
            labels=labels,
            metrics_url=metrics_url,
            kv_events_port=kv_port,
            kv_replay_port=kv_replay,
            name=meta.get("name"),
            data_parallel_size=int(dp_size),
        )
        for port in spec.ports
    ]


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
        self._pool_reflector: Reflector | None = None
        self._pod_reflector: Reflector | None = None
        self._closed = False

    # -- public -----------------------------------------------------------------------
    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._first = self._loop.create_future()
        if self._api_client is None:
            self._api_client = await asyncio.to_thread(default_api_client)
        core = kubernetes.client.CoreV1Api(self._api_client)
        custom = kubernetes.client.CustomObjectsApi(self._api_client)

        # Plain wrappers without return annotations: Watch then yields raw dicts, not models.
        def list_pods(**kw: Any) -> Any:
            return core.list_namespaced_pod(self.namespace, **kw)

        def list_pools(**kw: Any) -> Any:
            group, version = self._pool_api
            return custom.list_namespaced_custom_object(group, version, self.namespace, POOL_PLURAL, **kw)

        common: dict[str, Any] = {"backoff_s": self._backoff_s, "watch_timeout_s": self._watch_timeout_s}
        self._pod_reflector = Reflector(
            f"pods/{self.namespace}", list_pods, self._pods_synced, self._fatal,
            selector_kind="label_selector", selector=None, **common,
        )  # fmt: skip
        self._pool_reflector = Reflector(
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
        except Exception as exc:
            report_failure("discovery-callback", f"{self.namespace}/{self.pool_name} on_change", exc)
        if self._first is not None and not self._first.done():
            self._first.set_result(None)


def _set_exception(future: asyncio.Future[None], exc: BaseException) -> None:
    if not future.done():
        future.set_exception(exc)
