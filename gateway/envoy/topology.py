"""Where the gateway's parts listen (`Topology`) and the names and limits every piece of the
Envoy rendering shares: filter names, error details, the retry policy's figures.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

ERROR_DETAILS_PREFIX = "gateway_"  # ImmediateResponse details set by our ext_proc services


EPP_FILTER = "gateway.epp"


BBR_FILTER = "gateway.bbr"


# A picked pod that fails before the response started (connection refused, stream refused or
# reset, 503) moves the request to the next pod of the EPP's ranked list; Envoy cannot retry once
# response headers went to the client, so a started stream is never run twice (docs/scheduling.md,
# "Retries").
RETRY_ON = "connect-failure,refused-stream,reset,retriable-status-codes"


# 503 says "not now" (an overloaded or draining engine); a 500 may be the request's own fault.
RETRIABLE_STATUS_CODES = (503,)


RETRIES = 2


# Concurrent retries a pool cluster allows: this share of its active and pending requests, never
# fewer than the floor (a burst of connect failures at low load). A retry counts from Envoy's
# decision to the retried attempt's response headers: when every pod of a pool fails, the
# retries in flight stay within this share of its requests instead of each being tried 3 times.
RETRY_BUDGET_PERCENT = 20.0


RETRY_BUDGET_MIN_CONCURRENCY = 16


@dataclass(frozen=True, slots=True)
class ExtProcTls:
    """mTLS from Envoy to the ext_proc services: Envoy's client cert and the CA it trusts."""

    client_cert: Path
    client_key: Path
    ca: Path


@dataclass(frozen=True, slots=True)
class Topology:
    """Where everything listens: the part of the bootstrap that is not gateway policy."""

    listen_port: int
    admin_port: int
    bbr: tuple[str, int] | None  # None in single-hop mode
    # pool name -> EPP host, port (an IP or a DNS name); with `pools[].epp.replicas` > 1 and an
    # IP, the replicas listen on port, port + 1, ... (`EppAddress.addresses`).
    epps: Mapping[str, tuple[str, int]]
    server_cert: Path | None  # None: plain HTTP listener (TLS terminated in front, e.g. an NLB)
    server_key: Path | None
    listen_host: str = "127.0.0.1"
    extproc_tls: ExtProcTls | None = None
    ext_proc_timeout_s: float = 10.0
    connection_buffer_bytes: int = 4 * 1024 * 1024
    fallback_endpoints: Mapping[str, list[str]] = field(default_factory=dict)  # FailOpen pools
    # Static pools rendered as ORIGINAL_DST (the Kubernetes cluster kind) instead of OverrideHost.
    original_dst_pools: frozenset[str] = frozenset()
    # Single-hop mode (epp/single_hop.py): no BBR; one EPP serves every pool (each entry of
    # `epps` names it) and one ext_proc stream both routes by model and picks the pod.
    single_hop: bool = False


# Streams Envoy puts on one connection to an ext_proc service before it opens another. Each
# request holds its EPP stream until the response ends, so the connections grow with the load;
# an EPP with workers (epp/workers/processes.py) shares its port over SO_REUSEPORT and the kernel spreads
# connections, not streams, over the workers. Measured through Envoy (--concurrency 1), 40
# concurrent requests over 2 workers: no limit 40/0 (one connection), 8 -> 32/8, 4 -> 28/12.
EXT_PROC_STREAMS_PER_CONNECTION = 4


SINGLE_HOP_CLUSTER = "epp"
