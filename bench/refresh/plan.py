"""What a change made stale: the committed rows whose runs are not of the shipped default today.

A row is one policy on one scenario in one summaries root (`<root>/<mode>/<scenario>/<policy>/
seed-<n>.json`, the reporting seeds). Its runs are stale when

- it is a row of the shipped default (`epp-default*`) and a seed recorded another profile than
  `gateway.profiles.DEFAULT` today, or another `default_revision` than
  `bench.harness.gateway_policies.DEFAULT_REVISION` (a real-time gateway run always records one;
  a virtual-time run is held to it where it recorded one), or
- the scenario file it ran (`scenario.file`) no longer has the digest it recorded.

Both are read live from the summaries and the code, never from a list kept by hand, so a change of
the default anywhere shows up here. A real-time `epp-default` row that is re-run takes its
scenario's round-robin and peer rows with it (`COMPANIONS`): the headline compares them, and rows
of one campaign share the machine's state. Virtual time is deterministic: its rows go alone.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.harness.summary import REPORTING_SEEDS, SCHEMA, file_digest
from bench.reports import comparable
from bench.reports.published import is_peer

REAL_TIME_ROOT = Path("bench/summaries")
VIRTUAL_ROOTS = (Path("bench/summaries-virtual"), Path("bench/summaries-virtual-replicas"))
SHIPPED_PREFIX = "epp-default"
OURS = "epp-default"
BASELINE = "round-robin"
# Options a re-run sets itself: the seed, where it writes, and no progress bar.
RESET_OPTIONS = frozenset({"--seed", "--seeds", "--summaries", "--results", "--no-progress"})
DEFAULT_CPUS = 2  # a real-time run whose summary names no cpu_count held this many cores


@dataclass(frozen=True)
class LiveDefault:
    """Today's shipped default: the profile as a summary records it, and the revision."""

    profile: str
    revision: int

    @classmethod
    def now(cls) -> LiveDefault:
        return cls(json.dumps(comparable.shipped_default(), sort_keys=True), comparable.current_revision())

    def key(self) -> str:
        return f"revision {self.revision} profile {self.profile}"


@dataclass
class Unit:
    """One seed of one row to re-run, and why."""

    root: str
    mode: str
    scenario: str
    policy: str
    seed: int
    virtual: bool
    reasons: list[str]
    command: list[str] | None  # the recorded command made a re-run of this unit; None: cannot
    core_s: float  # recorded wall time x the cores the run held
    problem: str = ""  # why `command` is None

    @property
    def id(self) -> str:
        return f"{self.root}/{self.mode}/{self.scenario}/{self.policy}/seed-{self.seed}"


@dataclass
class Plan:
    units: list[Unit] = field(default_factory=list)

    @property
    def core_hours(self) -> float:
        return sum(u.core_s for u in self.units) / 3600

    def runnable(self) -> list[Unit]:
        return [u for u in self.units if u.command is not None]


def row_roots(repo: Path, virtual_only: bool = False) -> list[Path]:
    """Every summaries root (relative to `repo`) under the committed real-time and virtual-time
    roots: a root holds `<mode>/<scenario>/<policy>/seed-<n>.json`, and one may nest another
    (bench/summaries-virtual/agreement)."""
    tops = list(VIRTUAL_ROOTS) if virtual_only else [REAL_TIME_ROOT, *VIRTUAL_ROOTS]
    roots: set[Path] = set()
    for top in tops:
        for path in (repo / top).glob("**/seed-*.json"):
            roots.add(path.relative_to(repo).parents[3])
    return sorted(roots)


def stale_reasons(summary: Mapping[str, Any], live: LiveDefault, repo: Path) -> list[str]:
    """Why one seed's summary is not a run of today's shipped default on today's scenario file."""
    reasons = []
    policy = str(summary["policy"]["name"])
    config = summary["policy"].get("config") or {}
    virtual = bool(summary.get("run", {}).get("virtual"))
    if policy.startswith(SHIPPED_PREFIX):
        d = comparable.ran(policy, summary)
        if d.profile is not None and d.profile != live.profile:
            reasons.append("earlier default profile")
        revision = config.get("default_revision")
        if (revision is not None or not virtual) and revision != live.revision:
            reasons.append(f"default_revision {revision} (shipped: {live.revision})")
    scenario = summary.get("scenario") or {}
    file, digest = scenario.get("file"), scenario.get("digest")
    if file and digest:
        path = repo / file
        if not path.is_file():
            reasons.append(f"scenario file {file} is gone")
        elif file_digest(path) != digest:
            reasons.append(f"scenario file {file} changed")
    return reasons


def rerun_command(summary: Mapping[str, Any], root: str, seed: int) -> tuple[list[str] | None, str]:
    """The recorded command, made to re-run this one row's seed into `root`: the seed, the root
    and the policy set here (a command that ran several policies keeps this row's alone)."""
    command = [str(c) for c in (summary.get("run", {}).get("command") or [])]
    if command[:3] != ["python", "-m", "bench"] or len(command) < 4:
        return None, f"no re-runnable command recorded ({' '.join(command[:4]) or 'none'})"
    head, rest = command[4:], []
    policies: list[str] = []
    i = 0
    while i < len(head):
        token = head[i]
        flag = token.partition("=")[0]
        takes_value = "=" not in token and i + 1 < len(head) and not head[i + 1].startswith("--")
        value = head[i + 1] if takes_value else token.partition("=")[2]
        step = 2 if takes_value else 1
        if flag == "--policy":
            policies.append(value)
        elif flag not in RESET_OPTIONS:
            rest += head[i : i + step]
        i += step
    name = str(summary["policy"]["name"])
    registered = summary.get("run", {}).get("policy_registered_as")
    chosen = [p for p in policies if p in (name, registered)] or (policies if len(policies) == 1 else [])
    if not chosen:  # a variant's name: `<policy>-2replicas`, `<policy>+tok`
        chosen = sorted((p for p in policies if name.startswith((f"{p}-", f"{p}+"))), key=len)[-1:]
    if len(chosen) != 1:
        return (
            None,
            f"the command ran {', '.join(policies) or 'no policy'}: which one is {name} is not recorded",
        )
    rest = [*rest, "--policy", chosen[0]]
    if name.endswith("+tok") and "--fleet-tokenizer" not in rest:
        rest.append("--fleet-tokenizer")  # the fleet tokenized for another policy of that run
    mode = summary["scenario"]["mode"]
    if "--mode" not in rest and mode != "quick":
        rest += ["--mode", mode]
    extra = ["--seed", str(seed), "--summaries", root]
    if command[3] == "run":
        extra.append("--no-progress")
    return [sys.executable, "-m", "bench", command[3], *rest, *extra], ""


def core_seconds(summary: Mapping[str, Any]) -> float:
    """Recorded wall time x the cores the run held: a real-time run holds the whole machine
    (fleet, router and load generator), a virtual-time run one core."""
    run = summary.get("run") or {}
    wall = float(run.get("wall_s") or 0.0)
    if run.get("virtual"):
        return wall
    return wall * int((summary.get("env") or {}).get("cpu_count") or DEFAULT_CPUS)


def _rows(repo: Path, root: Path) -> dict[tuple[str, str, str], dict[int, dict[str, Any]]]:
    """(mode, scenario, policy) -> seed -> summary, reporting seeds only."""
    rows: dict[tuple[str, str, str], dict[int, dict[str, Any]]] = {}
    for path in sorted((repo / root).glob("*/*/*/seed-*.json")):
        data = json.loads(path.read_text())
        if data.get("schema") != SCHEMA or data.get("seed") not in REPORTING_SEEDS:
            continue
        mode, scenario, policy = path.relative_to(repo / root).parts[:3]
        rows.setdefault((mode, scenario, policy), {})[int(data["seed"])] = data
    return rows


def _unit(
    root: Path, key: tuple[str, str, str], seed: int, summary: Mapping[str, Any], reasons: list[str]
) -> Unit:
    command, problem = rerun_command(summary, root.as_posix(), seed)
    mode, scenario, policy = key
    virtual = bool(summary.get("run", {}).get("virtual"))
    return Unit(
        root.as_posix(),
        mode,
        scenario,
        policy,
        seed,
        virtual,
        reasons,
        command,
        core_seconds(summary),
        problem,
    )


def companions(policies: Iterable[str]) -> list[str]:
    """The rows a real-time `epp-default` row is compared with in the headline: round-robin and
    the peers on the usual fleet."""
    return sorted(p for p in policies if p == BASELINE or is_peer(p))


def build_plan(
    repo: Path, live: LiveDefault | None = None, *, virtual_only: bool = False, alone: bool = False
) -> Plan:
    """Every stale seed of every committed row: real time first (virtual rows replaying real-time
    ones, `--as-recorded`, read them), then virtual time; `alone`: no companions."""
    live = live or LiveDefault.now()
    plan = Plan()
    for root in row_roots(repo, virtual_only):
        rows = _rows(repo, root)
        chosen: dict[tuple[tuple[str, str, str], int], list[str]] = {}
        for key, seeds in rows.items():
            for seed, summary in seeds.items():
                reasons = stale_reasons(summary, live, repo)
                if reasons:
                    chosen[(key, seed)] = reasons
        for (key, seed), reasons in list(chosen.items()):
            summary = rows[key][seed]
            if alone or key[2] != OURS or summary.get("run", {}).get("virtual"):
                continue
            scenario_rows = [k for k in rows if k[:2] == key[:2]]
            for other in companions(k[2] for k in scenario_rows):
                okey = (*key[:2], other)
                if seed in rows[okey] and (okey, seed) not in chosen:
                    chosen[(okey, seed)] = [f"same campaign as {OURS} ({reasons[0]})"]
        for (key, seed), reasons in sorted(chosen.items()):
            plan.units.append(_unit(root, key, seed, rows[key][seed], reasons))
    plan.units.sort(key=lambda u: (u.virtual, u.root, u.mode, u.scenario, u.policy, u.seed))
    return plan


def render_plan(plan: Plan, live: LiveDefault) -> str:
    """The plan as a reader checks it: one line per row (its seeds), core-hours per root."""
    if not plan.units:
        return (
            f"nothing stale: every committed row ran the shipped default (default_revision {live.revision})"
        )
    lines = [f"stale against the shipped default (default_revision {live.revision}):"]
    by_row: dict[tuple[str, str, str, str], list[Unit]] = {}
    for unit in plan.units:
        by_row.setdefault((unit.root, unit.mode, unit.scenario, unit.policy), []).append(unit)
    for (root, mode, scenario, policy), units in by_row.items():
        seeds = ",".join(str(u.seed) for u in units)
        hours = sum(u.core_s for u in units) / 3600
        why = "; ".join(dict.fromkeys(r for u in units for r in u.reasons))
        cannot = next((u.problem for u in units if u.command is None), "")
        note = f"  CANNOT RE-RUN: {cannot}" if cannot else ""
        lines.append(f"  {root}/{mode}/{scenario}/{policy} seeds {seeds}: {hours:.3f} core-h ({why}){note}")
    totals: dict[str, float] = {}
    for unit in plan.units:
        kind = "virtual time" if unit.virtual else "real time"
        totals[kind] = totals.get(kind, 0.0) + unit.core_s / 3600
    parts = ", ".join(f"{kind} {hours:.2f}" for kind, hours in sorted(totals.items()))
    lines.append(
        f"{len(plan.units)} run(s) in {len(by_row)} row(s): {plan.core_hours:.2f} core-hours"
        f" ({parts}; from the recorded wall times, start-up not counted)"
    )
    return "\n".join(lines)


def units_by_id(units: Sequence[Unit]) -> dict[str, Unit]:
    return {u.id: u for u in units}
