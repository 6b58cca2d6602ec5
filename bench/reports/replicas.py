"""docs/benchmarks/replicas.md: N EPP replicas against one EPP, in virtual and in real time.

Issue #39 asks N replicas to route as well as one: in virtual time (`bench sim`, no CPU
contention) 2, 4 and 8 replicas within +3 % of one EPP's TTFT P50 and P95 medians on every
scenario; in real time 2 replicas within +5 % of one on five scenarios, one EPP beside them in
the same campaign. Both tables come from run summaries alone:

- virtual: `bench/summaries-virtual-replicas/<mode>/<scenario>/epp-default` and
  `epp-default-<N>replicas`; rows compare only when they ran one commit and the same default
  (bench/reports/comparable.py), so the change is the replicas' alone;
- real: one campaign's summaries (`<campaign>/<mode>/<scenario>/...`, a results root given on
  the command line, else the newest committed `bench/results-committed/*-replicas/`).

A row that did not run says so ("not run"); rows that may not be compared say why instead of a
change. Sections render between marker comments (bench/reports/report.py `write_section`), so
the hand-written text around them stays.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from bench.harness.summary import REPORTING_SEEDS, load_summaries
from bench.reports.comparable import Runs, why_not_comparable
from bench.reports.report import cell, spread, write_section

PAGE = Path("docs/benchmarks/replicas.md")
TITLE = "# EPP replicas against one EPP"
VIRTUAL_SECTION = "replicas-virtual"
REAL_SECTION = "replicas-real"
ONE = "epp-default"
ONE_OWN = "epp-default-1replica"  # a replicas campaign's own one-EPP row, where it ran one
SCENARIOS_DIR = Path("bench/scenarios")
CAMPAIGNS_DIR = Path("bench/results-committed")
CAMPAIGN_SUFFIX = "-replicas"
CAMPAIGN_NAME = re.compile(r"^\d{4}-\d{2}-\d{2}.*-replicas$")  # <date>[-what]-replicas


@dataclass(frozen=True)
class Goal:
    counts: tuple[int, ...]  # replica counts set against one EPP
    margin: float  # the medians' change may be at most this (+3 %: 0.03)
    same_commit: bool  # rows must come from one commit (virtual time: same code, same decisions)


VIRTUAL = Goal(counts=(2, 4, 8), margin=0.03, same_commit=True)
REAL = Goal(counts=(2,), margin=0.05, same_commit=False)
REAL_SCENARIOS = ("bursty", "shared-prefix", "docqa", "kv-cache-wins", "lora")
METRICS = ("ttft_p50", "ttft_p95")


def replicas_label(n: int) -> str:
    return f"{ONE}-{n}replicas"


def one_epp(policies: Mapping[str, Runs]) -> str:
    """The one-EPP row: the campaign's own `epp-default-1replica` where it ran one."""
    return ONE_OWN if ONE_OWN in policies else ONE


def _commits(runs: Runs) -> str:
    found = sorted({((r.get("env", {}).get("git") or {}).get("commit") or "unknown")[:7] for r in runs})
    return ", ".join(found)


def _change(many: Runs, one: Runs, metric: str) -> float | None:
    m, o = spread(many, f"steady.{metric}"), spread(one, f"steady.{metric}")
    if m is None or o is None or o.median <= 0:
        return None
    return m.median / o.median - 1.0


def _not_run(scenario: str, counts: Sequence[int]) -> str:
    return f"| {scenario} | {', '.join(map(str, counts))} | not run | | | | | |"


def scenario_rows(scenario: str, policies: Mapping[str, Runs], goal: Goal) -> list[str]:
    """Markdown rows of one scenario: one EPP, then each replica count that ran; the counts
    that did not run in one `not run` row."""
    one_name = one_epp(policies)
    one = policies.get(one_name)
    ran = [n for n in goal.counts if policies.get(replicas_label(n))]
    missing = [n for n in goal.counts if n not in ran]
    if not one and not ran:
        return [_not_run(scenario, (1, *goal.counts))]
    rows = [_row(scenario, 1, one_name, one, None, goal)] if one else [_not_run(scenario, (1,))]
    rows += [
        _row(scenario, n, replicas_label(n), policies[replicas_label(n)], (one_name, one), goal) for n in ran
    ]
    return rows + ([_not_run(scenario, missing)] if missing else [])


def _row(
    scenario: str, n: int, name: str, runs: Runs, one: tuple[str, Runs | None] | None, goal: Goal
) -> str:
    """One row: figures, then the change vs one EPP and the verdict (none for one EPP itself)."""
    seeds = ", ".join(str(r["seed"]) for r in runs)
    figures = " | ".join(cell(spread(runs, f"steady.{m}"), "s") for m in METRICS)
    head = f"| {scenario} | {n} | {seeds} | {_commits(runs)} | {figures} |"
    if one is None:
        return f"{head} (one EPP: {name}) | |"
    one_name, one_runs = one
    if not one_runs:
        return f"{head} no one-EPP row | n/a |"
    reason = why_not_comparable(
        name, runs, one_name, one_runs, replicas_differ=True, same_commit=goal.same_commit
    )
    if reason is not None:
        return f"{head} {reason} | n/a |"
    changes = [_change(runs, one_runs, m) for m in METRICS]
    text = " / ".join("n/a" if c is None else f"{c * 100:+.1f} %" for c in changes)
    hit = all(c is not None and c <= goal.margin for c in changes)
    return f"{head} {text} | {'hit' if hit else '**missed**'} |"


def render_table(scenarios: Sequence[str], runs: Mapping[str, Mapping[str, Runs]], goal: Goal) -> str:
    margin = f"+{goal.margin * 100:.0f} %"
    lines = [
        f"| scenario | EPP replicas | seeds | commit | TTFT P50 | TTFT P95 | change of the medians vs one EPP, "
        f"P50 / P95 | within {margin} |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for scenario in scenarios:
        lines += scenario_rows(scenario, runs.get(scenario, {}), goal)
    return "\n".join(lines)


def commands(
    runs: Mapping[str, Mapping[str, Runs]], scenarios: Sequence[str], wanted: Sequence[str]
) -> list[str]:
    """The distinct commands behind the rows (from the summaries), the scenario as `<scenario>`;
    the seeds and the output folders left out."""
    found = set()
    for scenario in scenarios:
        policies = runs.get(scenario, {})
        for policy, rs in policies.items():
            if policy not in wanted:
                continue
            for r in rs:
                words = [str(w) for w in (r.get("run", {}).get("command") or [])]
                text = " ".join(_shown_command(words))
                found.add(re.sub(rf"\b{re.escape(scenario)}\.yaml\b", "<scenario>.yaml", text))
    return sorted(found)


OMITTED = ("--seed", "--seeds", "--summaries", "--results")  # options with a value, left out


def _shown_command(words: Sequence[str]) -> list[str]:
    out: list[str] = []
    skip = False
    for word in words:
        if skip:
            skip = False
            continue
        if word in OMITTED:
            skip = True
            continue
        out.append(word)
    return out


def _policies(goal: Goal) -> tuple[str, ...]:
    return (ONE, ONE_OWN, *(replicas_label(n) for n in goal.counts))


def _command_lines(runs: Mapping[str, Mapping[str, Runs]], scenarios: Sequence[str], goal: Goal) -> list[str]:
    found = commands(runs, scenarios, _policies(goal))
    if not found:
        return []
    return ["", "Commands (from the summaries; the seeds are those in the table):", "", "```", *found, "```"]


def render_virtual(runs: Mapping[str, Mapping[str, Runs]], scenarios: Sequence[str], source: str) -> str:
    seeds = ", ".join(map(str, REPORTING_SEEDS))
    lines = [
        "### Virtual time: every scenario, 2, 4 and 8 replicas",
        "",
        f"From `{source}` (`bench sim`: the EPP's own code against the simulated engines in",
        "virtual time, no CPU contention). TTFT of the steady window, median [min-max] over the",
        f"reporting seeds {seeds}; the change compares medians with the one-EPP row of the same",
        "scenario, and counts only between rows of one commit and one default (profile,",
        "`default_revision`, options but the replica count); a hit needs both the P50 and the P95",
        f"change at or below +{VIRTUAL.margin * 100:.0f} %.",
        "",
        render_table(scenarios, runs, VIRTUAL),
    ]
    return "\n".join(lines + _command_lines(runs, scenarios, VIRTUAL)) + "\n"


def render_real(runs: Mapping[str, Mapping[str, Runs]], source: str | None) -> str:
    seeds = ", ".join(map(str, REPORTING_SEEDS))
    lines = ["### Real time: one campaign, 2 replicas", ""]
    if source is None:
        lines += [
            "No replicas campaign found (a results root with `--replicas-campaign`, or a committed",
            f"`{CAMPAIGNS_DIR.as_posix()}/<date>{CAMPAIGN_SUFFIX}/`): every row is not run.",
            "",
        ]
    else:
        lines += [
            f"From `{source}`: one campaign, `{ONE}` (one EPP; `{ONE_OWN}` where the campaign",
            f"named it so) and `{replicas_label(2)}` on the same machine. TTFT of the steady window,",
            f"median [min-max] over the reporting seeds {seeds}; the change compares medians, only",
            "between rows of one default and shape (profile, `default_revision`, single- or two-hop,",
            "options but the replica count); a hit needs both the P50 and the P95 change at or below",
            f"+{REAL.margin * 100:.0f} %.",
            "",
        ]
    lines.append(render_table(REAL_SCENARIOS, runs, REAL))
    return "\n".join(lines + _command_lines(runs, REAL_SCENARIOS, REAL)) + "\n"


def virtual_scenarios(root: Path, runs: Mapping[str, Mapping[str, Runs]]) -> list[str]:
    """Every scenario file's name but those whose fleet is real engines (`fleet.engine`, e.g.
    llama.cpp processes: nothing virtual time can run), and any other scenario that ran replicas
    (a scaled one)."""
    names = {p.stem for p in (root / SCENARIOS_DIR).glob("*.yaml") if not _real_engines(p)}
    labels = {replicas_label(n) for n in VIRTUAL.counts}
    names |= {s for s, policies in runs.items() if labels & set(policies)}
    return sorted(names)


def _real_engines(path: Path) -> bool:
    """Whether a scenario file's fleet runs real engines (`fleet.engine` set) rather than modelsim."""
    data = yaml.safe_load(path.read_text()) or {}
    fleet = data.get("fleet") if isinstance(data, dict) else None
    return isinstance(fleet, dict) and bool(fleet.get("engine"))


def latest_campaign(root: Path, mode: str) -> Path | None:
    """The newest committed replicas campaign (`<date>-replicas`, by name) holding `mode` runs."""
    found = sorted(
        p
        for p in (root / CAMPAIGNS_DIR).glob(f"*{CAMPAIGN_SUFFIX}")
        if CAMPAIGN_NAME.match(p.name) and (p / mode).is_dir()
    )
    return found[-1] if found else None


def render_page(
    root: str | Path,
    virtual_dir: str | Path,
    campaign: str | Path | None = None,
    mode: str = "quick",
    page: str | Path | None = None,
) -> Path:
    """Write both sections into the replicas page (created with its title when missing);
    `campaign`: the real-time results root (default: the newest committed one). Returns the page."""
    root = Path(root)
    target = Path(page) if page is not None else root / PAGE
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(f"{TITLE}\n\n")
    virtual = load_summaries(virtual_dir, mode, REPORTING_SEEDS)
    write_section(
        target,
        VIRTUAL_SECTION,
        render_virtual(virtual, virtual_scenarios(root, virtual), _shown(virtual_dir, root)),
    )
    real_dir = Path(campaign) if campaign is not None else latest_campaign(root, mode)
    real: dict[str, Any] = load_summaries(real_dir, mode, REPORTING_SEEDS) if real_dir else {}
    write_section(target, REAL_SECTION, render_real(real, _shown(real_dir, root) if real_dir else None))
    return target


def _shown(path: str | Path, root: Path) -> str:
    """A path as the page shows it: relative to the repository when inside it."""
    rel = os.path.relpath(Path(path).resolve(), root.resolve())
    return Path(path).name if rel.startswith("..") else Path(rel).as_posix()
