"""A fake Kubernetes API server speaking the real list/watch HTTP protocol on loopback.

No kube-apiserver can run here, yet discovery must be tested against the real `kubernetes`
client, its `Watch` and the protocol's corner cases (410 Gone after compaction, bookmarks,
dropped connections, label selectors that objects move in and out of). The server runs its own
asyncio loop in a background thread so that both sync code (the client) and async tests can use
it; test hooks are plain thread-safe methods.

Supported: `GET {prefix}/namespaces/{ns}/{plural}` (list, or watch with `watch=true`) with
`labelSelector` (equality, inequality and existence terms), `fieldSelector` (`metadata.name`,
`metadata.namespace`), `resourceVersion`, `allowWatchBookmarks`, `timeoutSeconds`; and
`GET {prefix}/namespaces/{ns}/{plural}/{name}`, and `PATCH .../{name}/status` (a JSON merge patch of the
status subresource, as `kubectl` and the client's `patch_*_status` send). As in the real API for
a kind with a status subresource, `metadata.generation` counts spec changes only, a write of
the object without a status keeps the one it had, and a status write keeps its spec and
generation. Kinds: Pod, ConfigMap, InferencePool, the llm-d
InferenceObjective and InferenceModelRewrite, and the project's InferenceGatewayConfig.
"""

from __future__ import annotations

import asyncio
import copy
import json
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from aiohttp import web

Obj = dict[str, Any]


@dataclass(frozen=True, slots=True)
class ResourceKind:
    api_version: str  # "v1" for core, else "group/version"
    kind: str
    plural: str

    @property
    def prefix(self) -> str:
        return "/api/v1" if self.api_version == "v1" else f"/apis/{self.api_version}"

    @property
    def builtin(self) -> bool:
        return self.api_version == "v1"


PODS = ResourceKind("v1", "Pod", "pods")
CONFIGMAPS = ResourceKind("v1", "ConfigMap", "configmaps")
INFERENCE_POOLS = ResourceKind("inference.networking.k8s.io/v1", "InferencePool", "inferencepools")
GATEWAY_CONFIGS = ResourceKind(
    "gateway.inference.dev/v1alpha1", "InferenceGatewayConfig", "inferencegatewayconfigs"
)
INFERENCE_OBJECTIVES = ResourceKind("llm-d.ai/v1alpha2", "InferenceObjective", "inferenceobjectives")
INFERENCE_MODEL_REWRITES = ResourceKind(
    "llm-d.ai/v1alpha2", "InferenceModelRewrite", "inferencemodelrewrites"
)
KINDS = (PODS, CONFIGMAPS, INFERENCE_POOLS, GATEWAY_CONFIGS, INFERENCE_OBJECTIVES, INFERENCE_MODEL_REWRITES)


class SelectorError(ValueError):
    pass


def parse_label_selector(text: str) -> Callable[[dict[str, str]], bool]:
    """`a=b,c==d,e!=f,g,!h` -> predicate over a label dict (the API's equality-based form)."""
    terms: list[Callable[[dict[str, str]], bool]] = []
    for raw in filter(None, (t.strip() for t in text.split(","))):
        if "!=" in raw:
            k, v = (s.strip() for s in raw.split("!=", 1))
            terms.append(lambda labels, k=k, v=v: labels.get(k) != v)
        elif "=" in raw:
            k, v = (s.strip() for s in raw.replace("==", "=").split("=", 1))
            if not k:
                raise SelectorError(f"invalid label selector term {raw!r}")
            terms.append(lambda labels, k=k, v=v: labels.get(k) == v)
        elif raw.startswith("!"):
            absent = raw[1:].strip()
            terms.append(lambda labels, k=absent: k not in labels)
        elif " " in raw or "(" in raw:
            raise SelectorError(f"unsupported label selector term {raw!r}")
        else:
            terms.append(lambda labels, k=raw: k in labels)
    return lambda labels: all(term(labels) for term in terms)


def parse_field_selector(text: str) -> Callable[[Obj], bool]:
    terms: list[tuple[str, str]] = []
    for raw in filter(None, (t.strip() for t in text.split(","))):
        key, sep, value = raw.replace("==", "=").partition("=")
        if not sep or key not in ("metadata.name", "metadata.namespace"):
            raise SelectorError(f"field label not supported: {raw!r}")
        terms.append((key.split(".", 1)[1], value))
    return lambda obj: all(obj["metadata"].get(k) == v for k, v in terms)


@dataclass(slots=True)
class _Event:
    rv: int
    kind: ResourceKind
    type: str  # ADDED | MODIFIED | DELETED
    old: Obj | None
    new: Obj  # for DELETED: the object as last seen, with the deletion's resourceVersion


@dataclass(eq=False)
class _Watcher:
    kind: ResourceKind
    namespace: str
    matches: Callable[[Obj], bool]
    bookmarks: bool
    cursor: int
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    controls: list[str] = field(default_factory=list)  # "bookmark" | "close" | "abort"


class FakeKubeApiServer:
    """Start with `start()` (or as a context manager); `url` is the host for the client."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._objects: dict[tuple[ResourceKind, str, str], Obj] = {}
        self._history: list[_Event] = []
        self._rv = 1
        self._compacted_rv = 0  # watches from a resourceVersion below this get 410 Gone
        self._unavailable = False
        self._forbidden: set[ResourceKind] = set()
        self._status_forbidden: set[ResourceKind] = set()
        self.expired_watches: Counter[ResourceKind] = Counter()  # watches answered with 410 Gone
        self._watchers: set[_Watcher] = set()
        self.requests: list[tuple[str, dict[str, str]]] = []  # (path, query) of every API call
        self.request_times: list[float] = []  # monotonic arrival time of each of `requests`
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None
        self.port = 0

    # -- lifecycle --------------------------------------------------------------------
    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> FakeKubeApiServer:
        ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, args=(ready,), name="fake-kube-api", daemon=True)
        self._thread.start()
        if not ready.wait(10) or not self.port:
            raise RuntimeError("fake API server did not start")
        return self

    def stop(self) -> None:
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        self._control_all("abort")
        asyncio.run_coroutine_threadsafe(self._shutdown(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        self._loop = self._thread = None

    def __enter__(self) -> FakeKubeApiServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _serve(self, ready: threading.Event) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        app = web.Application()
        app.router.add_get("/api/v1/namespaces/{ns}/{plural}", self._handle_collection)
        app.router.add_get("/api/v1/namespaces/{ns}/{plural}/{name}", self._handle_item)
        app.router.add_get("/apis/{group}/{version}/namespaces/{ns}/{plural}", self._handle_collection)
        app.router.add_get("/apis/{group}/{version}/namespaces/{ns}/{plural}/{name}", self._handle_item)
        app.router.add_patch(
            "/apis/{group}/{version}/namespaces/{ns}/{plural}/{name}/status", self._handle_status_patch
        )
        self._runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=0.5)
        loop.run_until_complete(self._runner.setup())
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        loop.run_until_complete(site.start())
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        ready.set()
        try:
            loop.run_forever()
        finally:
            loop.close()

    async def _shutdown(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    # -- test hooks: objects ----------------------------------------------------------
    @property
    def resource_version(self) -> int:
        with self._lock:
            return self._rv

    def apply(self, kind: ResourceKind, obj: Obj) -> Obj:
        """Create or replace an object (by namespace/name); returns the stored copy."""
        obj = copy.deepcopy(obj)
        meta = obj.setdefault("metadata", {})
        ns, name = meta.setdefault("namespace", "default"), meta["name"]
        obj["apiVersion"], obj["kind"] = kind.api_version, kind.kind
        with self._lock:
            self._rv += 1
            old = self._objects.get((kind, ns, name))
            meta["uid"] = old["metadata"]["uid"] if old else str(uuid.uuid4())
            generation = old["metadata"].get("generation", 1) if old else 0
            meta["generation"] = (
                generation + 1 if old is None or old.get("spec") != obj.get("spec") else generation
            )
            if old is not None and "status" in old and "status" not in obj:  # written apart (PATCH)
                obj["status"] = copy.deepcopy(old["status"])
            meta["resourceVersion"] = str(self._rv)
            meta.setdefault("creationTimestamp", "2026-01-01T00:00:00Z")
            self._objects[(kind, ns, name)] = obj
            self._history.append(_Event(self._rv, kind, "MODIFIED" if old else "ADDED", old, obj))
        self._wake_all()
        return copy.deepcopy(obj)

    def modify(
        self, kind: ResourceKind, name: str, mutate: Callable[[Obj], None], namespace: str = "default"
    ) -> Obj:
        with self._lock:
            current = copy.deepcopy(self._objects[(kind, namespace, name)])
        mutate(current)
        return self.apply(kind, current)

    def delete(self, kind: ResourceKind, name: str, namespace: str = "default") -> None:
        with self._lock:
            old = self._objects.pop((kind, namespace, name))
            self._rv += 1
            gone = copy.deepcopy(old)
            gone["metadata"]["resourceVersion"] = str(self._rv)
            self._history.append(_Event(self._rv, kind, "DELETED", old, gone))
        self._wake_all()

    def patch_status(self, kind: ResourceKind, name: str, patch: Obj, namespace: str = "default") -> Obj:
        """Merge `patch` into the object's status (RFC 7386: a null removes a key); KeyError if
        there is no such object."""
        with self._lock:
            old = self._objects[(kind, namespace, name)]
            obj = copy.deepcopy(old)
            obj["status"] = _merge(obj.get("status") or {}, patch)
            self._rv += 1
            obj["metadata"]["resourceVersion"] = str(self._rv)
            self._objects[(kind, namespace, name)] = obj
            self._history.append(_Event(self._rv, kind, "MODIFIED", old, obj))
        self._wake_all()
        return copy.deepcopy(obj)

    def get(self, kind: ResourceKind, name: str, namespace: str = "default") -> Obj | None:
        with self._lock:
            obj = self._objects.get((kind, namespace, name))
            return copy.deepcopy(obj) if obj else None

    # -- test hooks: protocol events --------------------------------------------------
    def compact(self) -> int:
        """Forget history: later watches from an older resourceVersion get 410 Gone."""
        with self._lock:
            self._compacted_rv = self._rv
            return self._rv

    def send_bookmark(self) -> int:
        """Every watch that asked for bookmarks receives one at the current resourceVersion."""
        self._control_all("bookmark")
        return self.resource_version

    def drop_watches(self, *, abort: bool = True) -> None:
        """End every open watch: `abort` cuts the TCP connection mid-stream, else a clean end."""
        self._control_all("abort" if abort else "close")

    def set_unavailable(self, unavailable: bool) -> None:
        """While set, every API call gets 503 (as during an API server restart)."""
        self._unavailable = unavailable
        if unavailable:
            self.drop_watches()

    def forbid(self, kind: ResourceKind) -> None:
        """Answer 403 for this kind, as for a ServiceAccount whose Role lacks it."""
        self._forbidden.add(kind)

    def forbid_status(self, kind: ResourceKind) -> None:
        """Answer 403 to status writes of this kind (a Role without `<plural>/status` patch)."""
        self._status_forbidden.add(kind)

    def watching(self, kind: ResourceKind) -> int:
        """Open watch connections on a kind."""
        with self._lock:
            return sum(1 for w in self._watchers if w.kind == kind)

    def wait_watching(self, kind: ResourceKind, count: int = 1, timeout: float = 3.0) -> None:
        """Block until `count` watches on `kind` are open (hooks act on open watches only)."""
        deadline = time.monotonic() + timeout
        while self.watching(kind) < count:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.watching(kind)} watches on {kind.plural}, wanted {count}")
            time.sleep(0.005)

    def calls(self, kind: ResourceKind, *, watch: bool) -> list[dict[str, str]]:
        """Queries of the list (watch=False) or watch (watch=True) calls made for a kind."""
        return [query for _, query in self.timed_calls(kind, watch=watch)]

    def timed_calls(self, kind: ResourceKind, *, watch: bool) -> list[tuple[float, dict[str, str]]]:
        """(arrival time, query) of the list or watch calls made for a kind."""
        out = []
        for t, (path, query) in zip(list(self.request_times), list(self.requests), strict=False):
            if path.startswith(kind.prefix + "/") and path.endswith("/" + kind.plural):
                if (query.get("watch") in ("true", "1")) == watch:
                    out.append((t, query))
        return out

    def _control_all(self, control: str) -> None:
        loop = self._loop
        if loop is None:
            return

        def push() -> None:
            for w in list(self._watchers):
                w.controls.append(control)
                w.wake.set()

        loop.call_soon_threadsafe(push)

    def _wake_all(self) -> None:
        loop = self._loop
        if loop is None:
            return

        def wake() -> None:
            for w in list(self._watchers):
                w.wake.set()

        loop.call_soon_threadsafe(wake)

    # -- HTTP -------------------------------------------------------------------------
    def _kind(self, request: web.Request) -> ResourceKind:
        m = request.match_info
        api_version = f"{m['group']}/{m['version']}" if "group" in m else "v1"
        for kind in KINDS:
            if kind.api_version == api_version and kind.plural == m["plural"]:
                return kind
        raise web.HTTPNotFound(
            text=_status_json(
                404, "NotFound", f"the server could not find the requested resource ({request.path})"
            ),
            content_type="application/json",
        )

    def _precheck(self, request: web.Request) -> None:
        self.request_times.append(time.monotonic())
        self.requests.append((request.path, dict(request.query)))
        if self._unavailable:
            raise web.HTTPServiceUnavailable(
                text=_status_json(503, "ServiceUnavailable", "apiserver is shutting down"),
                content_type="application/json",
            )

    async def _handle_item(self, request: web.Request) -> web.StreamResponse:
        self._precheck(request)
        kind = self._kind(request)
        obj = self.get(kind, request.match_info["name"], request.match_info["ns"])
        if obj is None:
            msg = f'{kind.plural} "{request.match_info["name"]}" not found'
            return web.json_response(json.loads(_status_json(404, "NotFound", msg)), status=404)
        return web.json_response(obj)

    async def _handle_status_patch(self, request: web.Request) -> web.StreamResponse:
        self._precheck(request)
        kind, name, ns = self._kind(request), request.match_info["name"], request.match_info["ns"]
        if kind in self._forbidden or kind in self._status_forbidden:
            msg = f'{kind.plural}/status "{name}" is forbidden: cannot patch resource "{kind.plural}/status"'
            return web.json_response(json.loads(_status_json(403, "Forbidden", msg)), status=403)
        if request.content_type != "application/merge-patch+json":
            msg = f"the body of the request was in an unknown format ({request.content_type})"
            return web.json_response(json.loads(_status_json(415, "UnsupportedMediaType", msg)), status=415)
        body = await request.json()
        if not isinstance(body, dict) or not isinstance(body.get("status", {}), dict):
            return web.json_response(json.loads(_status_json(400, "BadRequest", "not an object")), status=400)
        try:
            obj = self.patch_status(kind, name, body.get("status") or {}, ns)
        except KeyError:
            msg = f'{kind.plural} "{name}" not found'
            return web.json_response(json.loads(_status_json(404, "NotFound", msg)), status=404)
        return web.json_response(obj)

    async def _handle_collection(self, request: web.Request) -> web.StreamResponse:
        self._precheck(request)
        kind, ns, q = self._kind(request), request.match_info["ns"], request.query
        if kind in self._forbidden:
            msg = f'{kind.plural} is forbidden: cannot list resource "{kind.plural}" in namespace "{ns}"'
            return web.json_response(json.loads(_status_json(403, "Forbidden", msg)), status=403)
        try:
            labels = parse_label_selector(q.get("labelSelector", ""))
            fields = parse_field_selector(q.get("fieldSelector", ""))
        except SelectorError as exc:
            return web.json_response(json.loads(_status_json(400, "BadRequest", str(exc))), status=400)

        def matches(obj: Obj) -> bool:
            meta = obj["metadata"]
            return meta["namespace"] == ns and labels(meta.get("labels") or {}) and fields(obj)

        if q.get("watch") in ("true", "1"):
            return await self._watch(request, kind, ns, matches)
        with self._lock:
            items = [
                copy.deepcopy(o) for (k, _, _), o in sorted(self._objects.items(), key=_key) if k == kind
            ]
            rv = self._rv
        items = [o for o in items if matches(o)]
        if kind.builtin:  # the real API omits kind/apiVersion on built-in list items
            for o in items:
                o.pop("kind", None)
                o.pop("apiVersion", None)
        body = {"kind": f"{kind.kind}List", "apiVersion": kind.api_version}
        body |= {"metadata": {"resourceVersion": str(rv)}, "items": items}
        return web.json_response(body)

    async def _watch(
        self, request: web.Request, kind: ResourceKind, ns: str, matches: Callable[[Obj], bool]
    ) -> web.StreamResponse:
        q = request.query
        try:
            timeout = float(q.get("timeoutSeconds", "1800"))
            since = int(q.get("resourceVersion") or 0)
        except ValueError:
            return web.json_response(json.loads(_status_json(400, "BadRequest", "bad query")), status=400)
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        with self._lock:
            expired = bool(since) and since < self._compacted_rv
            compacted = self._compacted_rv
        if expired:  # the real API answers 200 and streams one ERROR event carrying a 410 Status
            self.expired_watches[kind] += 1
            msg = f"too old resource version: {since} ({compacted})"
            await resp.write(
                _line({"type": "ERROR", "object": json.loads(_status_json(410, "Expired", msg))})
            )
            await resp.write_eof()
            return resp
        with self._lock:
            watcher = _Watcher(kind, ns, matches, q.get("allowWatchBookmarks") in ("true", "1"), since)
            initial: list[Obj] = []
            if not since:  # no resourceVersion: synthetic ADDED for the current state first
                watcher.cursor = self._rv
                initial = [
                    copy.deepcopy(o) for (k, _, _), o in sorted(self._objects.items(), key=_key) if k == kind
                ]
            self._watchers.add(watcher)
        try:
            for obj in initial:
                if matches(obj):
                    await resp.write(_line({"type": "ADDED", "object": obj}))
            while True:
                for line in self._pending_lines(watcher):
                    await resp.write(line)
                controls, watcher.controls = watcher.controls, []
                for control in controls:
                    if control == "abort":
                        if request.transport is not None:  # None: the client already left
                            request.transport.close()
                        return resp
                    if control == "close":
                        await resp.write_eof()
                        return resp
                    if control == "bookmark" and watcher.bookmarks:
                        bookmark = {"kind": kind.kind, "apiVersion": kind.api_version}
                        bookmark["metadata"] = {"resourceVersion": str(watcher.cursor)}
                        await resp.write(_line({"type": "BOOKMARK", "object": bookmark}))
                watcher.wake.clear()
                if self._has_pending(watcher) or watcher.controls:
                    continue
                remaining = deadline - loop.time()
                if remaining <= 0:
                    await resp.write_eof()
                    return resp
                try:
                    await asyncio.wait_for(watcher.wake.wait(), remaining)
                except TimeoutError:
                    pass
        except (ConnectionResetError, asyncio.CancelledError):
            return resp
        finally:
            with self._lock:
                self._watchers.discard(watcher)

    def _has_pending(self, watcher: _Watcher) -> bool:
        with self._lock:
            return bool(self._history) and self._history[-1].rv > watcher.cursor

    def _pending_lines(self, watcher: _Watcher) -> list[bytes]:
        """Events after the watcher's cursor as it sees them through its selector."""
        with self._lock:
            events = [e for e in self._history if e.rv > watcher.cursor]
            # A bookmark promises every event up to its resourceVersion was sent.
            watcher.cursor = max(watcher.cursor, self._rv)
        lines = []
        for e in events:
            if e.kind != watcher.kind:
                continue
            was = e.old is not None and watcher.matches(e.old)
            now = watcher.matches(e.new)
            if e.type == "DELETED":
                kind = "DELETED" if was else None
            elif now:
                kind = "MODIFIED" if was else "ADDED"
            else:
                kind = "DELETED" if was else None  # moved out of the selector
            if kind:
                lines.append(_line({"type": kind, "object": e.new}))
        return lines


def _key(item: tuple[tuple[ResourceKind, str, str], Obj]) -> tuple[str, str]:
    (_, ns, name), _obj = item
    return ns, name


def _merge(target: Obj, patch: Obj) -> Obj:
    """RFC 7386 JSON merge patch: objects merge key by key, a null deletes, anything else replaces."""
    out = dict(target)
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _line(event: Obj) -> bytes:
    return json.dumps(event, separators=(",", ":")).encode() + b"\n"


def _status_json(code: int, reason: str, message: str) -> str:
    return json.dumps(
        {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": message,
            "reason": reason,
            "code": code,
        }
    )


# -- object builders for tests -----------------------------------------------------------
def make_pod(
    name: str,
    *,
    labels: dict[str, str],
    ip: str | None = "10.0.0.1",
    ready: bool = True,
    phase: str = "Running",
    annotations: dict[str, str] | None = None,
    namespace: str = "default",
) -> Obj:
    status: Obj = {
        "phase": phase,
        "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
    }
    if ip:
        status["podIP"] = ip
    return {
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": dict(labels),
            "annotations": annotations or {},
        },
        "spec": {"containers": [{"name": "server", "image": "vllm/vllm-openai"}]},
        "status": status,
    }


def make_pool(
    name: str, *, selector: dict[str, str], port: int | list[int] = 8000, namespace: str = "default"
) -> Obj:
    ports = [port] if isinstance(port, int) else port
    return {
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "selector": {"matchLabels": dict(selector)},
            "targetPorts": [{"number": p} for p in ports],
            "endpointPickerRef": {"name": "epp", "port": {"number": 9002}, "failureMode": "FailClose"},
        },
    }


def write_kubeconfig(path: Path, url: str) -> Path:
    """A kubeconfig at `path` pointing a real `kubernetes` client (or a child process, via
    KUBECONFIG) at this fake server's `url`, namespace `default`."""
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "fake", "cluster": {"server": url}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [
                    {"name": "c", "context": {"cluster": "fake", "user": "u", "namespace": "default"}}
                ],
                "current-context": "c",
            }
        )
    )
    return path
