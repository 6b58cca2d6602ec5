"""Which rows a table may compare: runs of the same default, in the same shape.

A change between two rows (a target's "+5.6 %", a replica row against one EPP) says something
only when both rows ran the same thing but the one knob the row is about. Each run summary
records what it ran: the profile's weights and thresholds, `default_revision`
(bench/harness/gateway_policies.py: the request path and the EPP's picture of the pods), single-
or two-hop, and the command with its options (`--target-opt shared_publish_ms=5`, `--gateway-ms 0`).
`RanDefault` is that record for one row, and `why_not_comparable` says why two rows may not be
set side by side ("stale: re-run ..." where one of them ran today's default and the other an
earlier one), or None when they may.
"""

from __future__ import annotations

import functools
import itertools
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

Runs = Sequence[Mapping[str, Any]]

# Added with adapter placement (issue #28); they change nothing for a request without an adapter
# (virtual time: uniform, mixed-gpu, shared-prefix and bursty identical before and after).
ADAPTER_ONLY_THRESHOLDS = ("adapterPlacement", "adapterSlotMs")
# Command-line options that name what ran or where it was written, not how: a row's policy,
# label, seeds, scenario and output folders differ between rows that ran the same thing.
NAMING_OPTIONS = frozenset(
    {
        "--scenario",
        "--policy",
        "--label",
        "--seed",
        "--seeds",
        "--summaries",
        "--results",
        "--no-progress",
        "--mode",
        "--worker-urls",
        "--policy-module",
        "--max-wall-s",  # a bound: a run that reached it is marked incomplete (report.py)
    }
)
# What sets the replica count (and the shared store every replica set uses); a replica row
# differs from one EPP's row in these alone. `--store-rtt-ms` (bench sim) is the virtual store's
# round trip: the network the replica set runs on, which one EPP has none of; a gateway setting
# of the store (`shared_publish_ms`) is a shape option and must match.
REPLICA_OPTIONS = frozenset({"--replicas", "replicas", "shared_state", "--store-rtt-ms"})
REPLICAS_IN_NAME = re.compile(r"-(\d+)replicas?(?:$|-)")


def shipped_default() -> dict[str, Any]:
    """The shipped default profile's weights and thresholds, as a run summary records them."""
    from gateway.profiles import DEFAULT

    return json.loads(
        json.dumps(
            {"weights": dict(DEFAULT.weights), "thresholds": DEFAULT.thresholds.model_dump(by_alias=True)}
        )
    )


@functools.cache
def _today() -> str:
    return json.dumps(shipped_default(), sort_keys=True)


def current_revision() -> int:
    from bench.harness.gateway_policies import DEFAULT_REVISION

    return DEFAULT_REVISION


def options(summary: Mapping[str, Any]) -> dict[str, str]:
    """The run command's options that shape what ran (`--target-opt k=v` as `k`), naming ones
    and the replica count left out."""
    command = [str(c) for c in (summary.get("run", {}).get("command") or [])]
    found: dict[str, str] = {}
    i = 0
    while i < len(command):
        token = command[i]
        i += 1
        if not token.startswith("--"):
            continue
        flag, _, value = token.partition("=")
        if not value and i < len(command) and not command[i].startswith("--"):
            value = command[i]
            i += 1
        if flag == "--target-opt":
            flag, _, value = value.partition("=")
        if flag not in NAMING_OPTIONS and flag not in REPLICA_OPTIONS:
            found[flag] = value
    return found


def replica_count(policy: str, summary: Mapping[str, Any]) -> int:
    """EPP replicas of a run: its `replicas` option, else its label's `-<N>replicas`, else 1."""
    command = [str(c) for c in (summary.get("run", {}).get("command") or [])]
    for flag, value in itertools.pairwise(command):
        if flag == "--target-opt" and value.startswith("replicas="):
            return int(value.partition("=")[2])
        if flag == "--replicas":
            return int(value)
    config = summary.get("policy", {}).get("config") or {}
    if isinstance(config.get("replicas"), int):
        return int(config["replicas"])
    match = REPLICAS_IN_NAME.search(policy)
    return int(match.group(1)) if match else 1


def _profile(summary: Mapping[str, Any], current: Mapping[str, Any]) -> str | None:
    """The weights and thresholds a run's EPP ran, as one comparable string; None for a router
    without a profile (round-robin, a peer, the oracle)."""
    profile = (summary.get("policy", {}).get("config") or {}).get("profile")
    if not isinstance(profile, Mapping):
        return None
    thresholds = dict(profile.get("thresholds") or {})
    if not (summary.get("scenario", {}).get("workload") or {}).get("adapters"):
        # Thresholds that act on LoRA requests alone: a run without adapters that predates
        # them ran what today's default runs on its traffic.
        for key in ADAPTER_ONLY_THRESHOLDS:
            thresholds.setdefault(key, current["thresholds"].get(key))
    return json.dumps({"weights": profile.get("weights"), "thresholds": thresholds}, sort_keys=True)


@dataclass(frozen=True)
class RanDefault:
    """What one run ran, as far as comparing it with another run goes."""

    profile: str | None  # weights and thresholds (canonical JSON); None: no EPP profile
    revision: int | None  # default_revision; None: recorded before revisions existed
    hop: str | None  # "single-hop" | "two-hop"; None: not a gateway run
    settings: tuple[tuple[str, str], ...]  # shaping options, the replica count left out
    replicas: int
    commit: str | None

    def is_current(self) -> bool:
        """Ran today's shipped default profile at today's default revision."""
        return self.profile == _today() and self.revision == current_revision()

    def describe(self) -> str:
        hop = f"{self.hop}, " if self.hop else ""
        rev = "none" if self.revision is None else str(self.revision)
        return f"{hop}default_revision {rev}"


def ran(policy: str, summary: Mapping[str, Any]) -> RanDefault:
    config = summary.get("policy", {}).get("config") or {}
    hop = config.get("single_hop")
    return RanDefault(
        profile=_profile(summary, shipped_default()),
        revision=config.get("default_revision"),
        hop=None if hop is None else ("single-hop" if hop else "two-hop"),
        settings=tuple(sorted(options(summary).items())),
        replicas=replica_count(policy, summary),
        commit=((summary.get("env", {}).get("git") or {}).get("commit")),
    )


def row_default(policy: str, runs: Runs) -> RanDefault | None:
    """The one default every seed of a row ran; None when its seeds ran different ones."""
    found = {ran(policy, r) for r in runs}
    if len(found) != 1:
        # Seeds of one row from different commits are one campaign's seeds re-run: what matters
        # is that they ran the same default.
        found = {_without_commit(d) for d in found}
    return next(iter(found)) if len(found) == 1 else None


def _without_commit(d: RanDefault) -> RanDefault:
    return RanDefault(d.profile, d.revision, d.hop, d.settings, d.replicas, None)


def differences(a: RanDefault, b: RanDefault, *, replicas: bool, commit: bool) -> list[str]:
    """What differs between two rows' runs; the replica count and commit only when asked."""
    out = []
    if a.profile != b.profile:
        out.append("profile")
    if a.revision != b.revision:
        out.append("default_revision")
    if a.hop != b.hop:
        out.append("hop")
    if a.settings != b.settings:
        out.append("options")
    if replicas and a.replicas != b.replicas:
        out.append("replicas")
    if commit and a.commit != b.commit:
        out.append("commit")
    return out


def _side(d: RanDefault, what: Sequence[str]) -> str:
    parts = []
    if "hop" in what or "default_revision" in what:
        parts.append(d.describe())
    if "profile" in what:
        parts.append("today's profile" if d.profile == _today() else "an earlier profile")
    if "options" in what:
        parts.append(" ".join(f"{k}={v}" if v else k for k, v in d.settings) or "no options")
    if "replicas" in what:
        parts.append(f"{d.replicas} replicas")
    if "commit" in what:
        parts.append(f"commit {(d.commit or 'unknown')[:7]}")
    return ", ".join(parts)


def why_not_comparable(
    a_name: str,
    a_runs: Runs,
    b_name: str,
    b_runs: Runs,
    *,
    replicas_differ: bool = False,
    same_commit: bool = False,
) -> str | None:
    """Why rows `a` and `b` may not be compared (None: they may). `replicas_differ`: a replica
    comparison, the rows may differ in their replica count (and its shared store) alone;
    `same_commit`: the rows must also come from one commit (virtual time: same code, same
    decisions)."""
    a, b = row_default(a_name, a_runs), row_default(b_name, b_runs)
    for name, d in ((a_name, a), (b_name, b)):
        if d is None:
            return f"not comparable: the seeds of {name} ran different defaults"
    assert a is not None and b is not None
    what = differences(a, b, replicas=not replicas_differ, commit=same_commit)
    if not what:
        return None
    text = f"{a_name}: {_side(a, what)}; {b_name}: {_side(b, what)}"
    if a.is_current() != b.is_current():
        stale = b_name if a.is_current() else a_name
        return f"stale: re-run {stale} ({text})"
    return f"not comparable: {text}"


def stale(name: str, runs: Runs) -> str | None:
    """For a row of the shipped default (`epp-default*`) some seed of which ran an earlier one:
    the cell a table shows instead of its figures ("stale: re-run ..."); None when it is current
    or not a row of the default. `python -m bench refresh` re-runs it."""
    if not name.startswith("epp-default") or not runs:
        return None
    found = [ran(name, r) for r in runs]
    old = next((d for d in found if not d.is_current()), None)
    if old is None:
        return None
    what = old.describe() if old.revision != current_revision() else "an earlier profile"
    return f"stale: re-run {name} (ran {what}; shipped: default_revision {current_revision()})"
