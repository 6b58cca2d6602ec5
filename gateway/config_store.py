"""Hot-reloadable configuration: the last good config stays in force.

Every source (a file, a mounted ConfigMap, the InferenceGatewayConfig custom resource) hands
candidates to `ConfigStore.offer`. One source is in force at a time: the resource while it
exists, the file otherwise (`resource_present` / `resource_absent`). A file edit made while the
resource exists is not applied, and says so (a warning, `gateway_config_reloads_total{result=
"ignored"}`); once the resource is deleted the file is read again and applied. The source in
force is logged when it changes and exported as `gateway_config_source{kind}`.
 a candidate that fails validation is logged, counted in
`gateway_config_reloads_total{result="rejected"}` and dropped. BBR and every EPP validate with
the same schema (gateway/config.py), so they log the same verdict and reason for one file. Kubernetes updates a mounted
ConfigMap by swapping a symlink, so the file source polls the content hash rather than
relying on inotify events on the file itself.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Generic

from prometheus_client import Counter, Gauge

from gateway.config import ConfigError, Schema, load_config, parse_config
from gateway.supervise import report_failure

log = logging.getLogger(__name__)

CONFIG_RELOADS = Counter("gateway_config_reloads", "Configuration reload attempts by result", ["result"])
CONFIG_SOURCE = Gauge(
    "gateway_config_source",
    "1 for the kind of configuration source in force: resource (the InferenceGatewayConfig, while it "
    "exists) or file (--config)",
    ["kind"],
)
CONFIG_LAST_SUCCESS = Gauge(
    "gateway_config_last_reload_success_timestamp_seconds", "When a configuration last loaded successfully"
)


class ConfigStore(Generic[Schema]):
    """The config in force, validated against `schema` (GatewayConfig for every service; tests
    and tools may pass a subclass)."""

    def __init__(self, initial: Schema, *, source: str = "initial") -> None:
        self._current = initial
        self.schema: type[Schema] = type(initial)
        self._listeners: list[Callable[[Schema], None]] = []
        self._checks: list[Callable[[Schema], None]] = []
        self.source = source
        # Why the latest candidate was refused (None: it was applied): what a resource's status says.
        self.last_refusal: str | None = None
        # The InferenceGatewayConfig in force while it exists (None: the file is).
        self.resource: str | None = None
        self.file: FileWatcher | None = None  # set by the file's watcher
        self._absent_announced = False
        CONFIG_LAST_SUCCESS.set_to_current_time()
        _set_source("file")

    @staticmethod
    def from_file(path: str | Path, schema: type[Schema]) -> ConfigStore[Schema]:
        """A bad config at start-up is fatal (ConfigError): there is nothing to fall back to."""
        return ConfigStore(load_config(path, schema), source=str(path))

    def current(self) -> Schema:
        return self._current

    def subscribe(self, listener: Callable[[Schema], None]) -> None:
        self._listeners.append(listener)

    def add_check(self, check: Callable[[Schema], None]) -> None:
        """A further verdict on a schema-valid candidate, raising ConfigError to refuse it: the
        xDS server's (can Envoy be given it?), so a config Envoy cannot run is refused whole."""
        self._checks.append(check)

    def offer(self, load: Callable[[], Schema], source: str) -> bool:
        """Validate a candidate (`load` raises ConfigError when invalid); True if it took effect."""
        try:
            fresh = load()
            for check in self._checks:
                check(fresh)
        except ConfigError as exc:
            CONFIG_RELOADS.labels(result="rejected").inc()
            self.last_refusal = str(exc)
            log.error("config from %s rejected, keeping the last good one: %s", source, exc)
            return False
        self.last_refusal = None
        previous, self._current = self._current, fresh
        self.source = source
        CONFIG_RELOADS.labels(result="applied").inc()
        CONFIG_LAST_SUCCESS.set_to_current_time()
        log.info("config from %s applied: %s", source, describe_change(previous, fresh))
        for listener in self._listeners:
            try:
                listener(fresh)
            except Exception as exc:  # one broken subscriber must not keep the others stale
                report_failure("config-listener", getattr(listener, "__qualname__", repr(listener)), exc)
        return True

    def resource_present(self, source: str) -> None:
        """The resource `source` exists: it is the configuration source; the file is not applied."""
        if self.resource == source:
            return
        self.resource, self._absent_announced = source, False
        _set_source("resource")
        log.info(
            "configuration source: %s (it exists; the --config file is not applied while it does)", source
        )

    def resource_absent(self, source: str) -> None:
        """The resource is absent (never created, or deleted): the file is the source again, read
        now (an invalid file leaves the last good configuration in force)."""
        was, announced = self.resource, self._absent_announced
        self.resource, self._absent_announced = None, True
        _set_source("file")
        if was is None and announced:
            return  # a relist that still finds it absent
        if self.file is None:
            log.warning("%s is absent and no file is followed: keeping the current configuration", source)
            return
        log.warning("configuration source: the file %s (%s is absent)", self.file.path, source)
        if was is not None:
            self.file.apply()

    def offer_data(self, data: Mapping[str, Any], source: str) -> bool:
        return self.offer(lambda: parse_config(data, self.schema), source)

    def load_file(self, path: str | Path) -> Schema:
        return load_config(path, self.schema)


# How many changed settings an "applied" line names before it counts the rest.
CHANGES_LOGGED = 8


def describe_change(old: Any, new: Any) -> str:
    """What a reload changed, for its log line: `path: old -> new` of each changed setting (the
    configuration's own field names; list items by index; a whole item added or removed once),
    or "no change"."""
    changed = _diff(
        old.model_dump(mode="json", by_alias=True), new.model_dump(mode="json", by_alias=True), ""
    )
    if not changed:
        return "no change"
    more = len(changed) - CHANGES_LOGGED
    return "; ".join(changed[:CHANGES_LOGGED]) + (f"; and {more} more" if more > 0 else "")


def _diff(before: Any, after: Any, path: str) -> list[str]:
    if isinstance(before, dict) and isinstance(after, dict):
        keys = list(before) + [k for k in after if k not in before]
        pairs = [
            (f"{path}.{k}" if path else str(k), before.get(k, _ABSENT), after.get(k, _ABSENT)) for k in keys
        ]
    elif isinstance(before, list) and isinstance(after, list):
        n = max(len(before), len(after))
        pairs = [
            (
                f"{path}[{i}]",
                before[i] if i < len(before) else _ABSENT,
                after[i] if i < len(after) else _ABSENT,
            )
            for i in range(n)
        ]
    elif before == after:
        return []
    else:
        return [f"{path}: {_short(before)} -> {_short(after)}"]
    return [line for sub, b, a in pairs if b != a for line in _diff(b, a, sub)]


_ABSENT = object()


def _short(value: Any) -> str:
    text = "(absent)" if value is _ABSENT else json.dumps(value, separators=(",", ":"))
    return text if len(text) <= 60 else text[:57] + "..."


def _set_source(kind: str) -> None:
    for each in ("resource", "file"):
        CONFIG_SOURCE.labels(kind=each).set(1 if each == kind else 0)


# How often a file source is read (and hashed): a change is in force everywhere, Envoy
# included (gateway/xds.py), well within a second; a few small reads a second cost nothing.
POLL_S = 0.2


class FileWatcher:
    """Offers the file's content to the store whenever it changes."""

    def __init__(self, store: ConfigStore[Any], path: str | Path, *, poll_s: float = POLL_S) -> None:
        self.store = store
        self.path = Path(path)
        self.poll_s = poll_s
        self._digest = self._read_digest()
        store.file = self

    def _read_digest(self) -> str | None:
        try:
            return hashlib.sha256(self.path.read_bytes()).hexdigest()
        except OSError as exc:
            log.warning("config %s unreadable, keeping the last good one: %s", self.path, exc)
            return None

    def check(self) -> bool:
        digest = self._read_digest()
        if digest is None or digest == self._digest:
            return False
        self._digest = digest
        if self.store.resource is not None:
            CONFIG_RELOADS.labels(result="ignored").inc()
            log.warning(
                "config file %s changed, not applied: %s is the configuration source while it exists "
                "(edit the resource; the file applies once the resource is deleted)",
                self.path,
                self.store.resource,
            )
            return False
        return self.apply()

    def apply(self) -> bool:
        """Offer the file as it is now."""
        self._digest = self._read_digest()
        return self.store.offer(lambda: self.store.load_file(self.path), str(self.path))

    async def run(self) -> None:
        """Poll for ever; run it under `gateway.supervise.spawn` so a crash is restarted."""
        while True:
            await asyncio.sleep(self.poll_s)
            self.check()
