"""Which prefill pods the sidecar may call: the pool's pods, by host (SSRF guard).

The prefiller address comes from a request header; without this check any client that can set
it could make the sidecar fetch any address. An entry ``host`` allows every port of that host,
as llm-d's sidecar matches (pod IPs: one pod per host); ``host:port`` allows that port only (pods
sharing a host, as on one machine). The list is static (``--allow``), plus a file
(``--allow-file``, one entry per line, ``#`` comments) re-read when it changes, plus the IPs of
the pods a Kubernetes label selector matches (``--allow-pods``, pdsidecar/kube_allow.py).
"""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path
from urllib.parse import urlsplit


class PrefillerError(ValueError):
    """The prefiller header is malformed (a 400) or names a host outside the pool (a 403)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def normalize_host(host: str) -> str:
    host = host.strip().strip("[]").lower()
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        return host.rstrip(".")


def normalize_entry(entry: str) -> str:
    """``host`` or ``host:port`` (IPv6 in brackets with a port), normalised for comparison."""
    entry = entry.strip()
    parts = urlsplit("//" + entry)
    try:
        port = parts.port
    except ValueError:
        port = None
    if port is not None and parts.hostname:
        return f"{normalize_host(parts.hostname)}:{port}"
    return normalize_host(entry)


def prefiller_base_url(host_port: str | None, url: str | None) -> tuple[str, str, int]:
    """(base URL, host, port) from ``x-prefiller-url`` (preferred) or ``x-prefiller-host-port``."""
    if url:
        parts = urlsplit(url.strip())
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise PrefillerError(400, f"x-prefiller-url {url!r} is not an http(s) URL with a host")
        if parts.path not in ("", "/") or parts.query or parts.fragment or parts.username:
            raise PrefillerError(400, f"x-prefiller-url {url!r} must be scheme://host:port only")
        try:
            port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError:
            raise PrefillerError(400, f"x-prefiller-url {url!r} has a bad port") from None
        return f"{parts.scheme}://{parts.netloc}", parts.hostname, port
    assert host_port is not None
    plain = urlsplit("//" + host_port.strip())
    try:
        plain_port = plain.port
    except ValueError:
        plain_port = None
    if not plain.hostname or plain_port is None or plain.path or plain.username:
        raise PrefillerError(400, f"x-prefiller-host-port {host_port!r} is not host:port")
    return f"http://{plain.netloc}", plain.hostname, plain_port


class AllowList:
    """Hosts the sidecar may send prefills to; ``allows`` re-reads the file when it changed."""

    def __init__(self, hosts: list[str], path: str | None = None) -> None:
        self._static = {normalize_entry(h) for h in hosts if h.strip()}
        self._path = Path(path) if path else None
        self._stamp: tuple[int, int] | None = None
        self._from_file: set[str] = set()
        self._from_pods: frozenset[str] = frozenset()  # replaced whole by the pod watch's thread
        if self._path is not None:
            self._reload()  # raises OSError at startup when unreadable

    def _reload(self) -> None:
        assert self._path is not None
        stat = os.stat(self._path)
        stamp = (stat.st_mtime_ns, stat.st_size)
        if stamp == self._stamp:
            return
        lines = self._path.read_text().splitlines()
        self._from_file = {normalize_entry(h) for line in lines if (h := line.split("#", 1)[0].strip())}
        self._stamp = stamp

    def hosts(self) -> set[str]:
        if self._path is not None:
            try:
                self._reload()
            except OSError:
                pass  # keep the last good list while the file is being replaced
        return self._static | self._from_file | self._from_pods

    def set_pods(self, hosts: set[str]) -> None:
        """The selected pods' IPs now (the pod watch calls this after every change)."""
        self._from_pods = frozenset(normalize_host(h) for h in hosts)

    def check(self, host: str, port: int) -> None:
        allowed, name = self.hosts(), normalize_host(host)
        if name not in allowed and f"{name}:{port}" not in allowed:
            raise PrefillerError(403, f"prefiller {host}:{port} is not a pod of this pool")
