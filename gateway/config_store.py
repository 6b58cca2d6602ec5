"""Hot-reloadable configuration: the last good config stays in force.

Kubernetes updates a mounted ConfigMap by swapping a symlink, so the store polls the file's
content hash rather than relying on inotify events on the file itself.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Generic, TypeVar

from prometheus_client import Counter, Gauge

from gateway.config import ConfigError

log = logging.getLogger(__name__)

T = TypeVar("T")

CONFIG_RELOADS = Counter("gateway_config_reloads", "Configuration reload attempts by result", ["result"])
CONFIG_LAST_SUCCESS = Gauge(
    "gateway_config_last_reload_success_timestamp_seconds", "When a configuration last loaded successfully"
)


class ConfigStore(Generic[T]):
    def __init__(self, path: str | Path, *, loader: Callable[[Path], T], poll_s: float = 1.0) -> None:
        self.path = Path(path)
        self._loader = loader
        self._poll_s = poll_s
        self._listeners: list[Callable[[T], None]] = []
        raw = self.path.read_bytes()
        self._digest = hashlib.sha256(raw).hexdigest()
        self._current: T = loader(self.path)  # a bad config at start-up is fatal: nothing to fall back to
        CONFIG_LAST_SUCCESS.set_to_current_time()

    def current(self) -> T:
        return self._current

    def subscribe(self, listener: Callable[[T], None]) -> None:
        self._listeners.append(listener)

    def reload_if_changed(self) -> bool:
        """Load the file if its content changed; returns True when a new config took effect."""
        try:
            raw = self.path.read_bytes()
        except OSError as exc:
            log.warning("config %s unreadable, keeping the last good one: %s", self.path, exc)
            return False
        digest = hashlib.sha256(raw).hexdigest()
        if digest == self._digest:
            return False
        self._digest = digest
        try:
            fresh = self._loader(self.path)
        except ConfigError as exc:
            CONFIG_RELOADS.labels(result="rejected").inc()
            log.error("config %s rejected, keeping the last good one: %s", self.path, exc)
            return False
        self._current = fresh
        CONFIG_RELOADS.labels(result="applied").inc()
        CONFIG_LAST_SUCCESS.set_to_current_time()
        log.info("config %s reloaded", self.path)
        for listener in self._listeners:
            try:
                listener(fresh)
            except Exception:
                log.exception("config listener failed")
        return True

    async def watch(self) -> None:
        while True:
            await asyncio.sleep(self._poll_s)
            self.reload_if_changed()
