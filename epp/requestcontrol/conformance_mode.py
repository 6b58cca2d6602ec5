"""Conformance test mode: a request header restricts which endpoints the EPP may pick.

The Gateway API Inference Extension conformance suite drives a test EPP whose picker returns
the endpoints named in `test-epp-endpoint-selection` (`ip` for any port of that pod, or
`ip:port`, comma-separated), and whose response hook reports the endpoint that served the
request in `x-conformance-test-served-endpoint`. Our conformance-style suite needs the same
levers against our real EPP. A client naming its endpoint is exactly what the product must
never honour, so this exists only behind `python -m epp --conformance-test-mode
--i-understand-clients-choose-endpoints`: two command-line flags, never a config file field
(a tenant can edit the config resource, not the EPP's command line), logged as a warning at
start and exported as the `epp_conformance_test_mode` gauge.

The restriction narrows the pool snapshot; scheduling itself is unchanged, so the EPP still
picks (and accounts) within the named set, and a set naming no endpoint of this pool gets the
normal 503 "no endpoint" answer, as the protocol's subset hint prescribes.
"""

from __future__ import annotations

import dataclasses

from epp.datalayer.endpoint_records import PoolSnapshot

SELECTION_HEADER = "test-epp-endpoint-selection"
SERVED_RESULT_HEADER = "x-conformance-test-served-endpoint"
WARNING = (
    "CONFORMANCE TEST MODE: clients choose endpoints with the %r header. "
    "Never run this in front of real traffic."
)


def _host(address: str) -> str:
    host, _, _ = address.rpartition(":")
    return host.strip("[]")


def restrict(headers: dict[str, str], snapshot: PoolSnapshot) -> PoolSnapshot:
    """The endpoints the selection header names; the whole pool when there is no header."""
    value = headers.get(SELECTION_HEADER)
    if value is None:
        return snapshot
    exact: set[str] = set()
    hosts: set[str] = set()
    for token in (t.strip() for t in value.split(",")):
        if not token:
            continue
        if token.count(":") == 1 or token.startswith("["):  # ip:port or [v6]:port
            exact.add(token)
        else:  # a bare IPv4 or IPv6 address: every target port of that pod
            hosts.add(token.strip("[]"))
    kept = tuple(e for e in snapshot.endpoints if e.address in exact or _host(e.address) in hosts)
    return dataclasses.replace(snapshot, endpoints=kept)
