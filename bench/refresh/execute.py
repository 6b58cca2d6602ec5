"""Runs a refresh plan: serially (two shared cores: a real-time run needs the machine to itself),
with progress and an ETA, resuming where an interrupted refresh stopped, then regenerates every
page that is generated from the summaries.

The journal (`bench/scratch/refresh.json`, git-ignored) holds the plan as it was made and the units
done. A refresh started again with the same shipped default takes the journal's remaining units,
so the companions of a row already re-run are not lost when the plan is made afresh; a journal of
another default is dropped (its plan is not this default's).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from bench.harness.summary import SCRATCH_DIR, summary_path
from bench.refresh.plan import LiveDefault, Plan, Unit, stale_reasons

JOURNAL = SCRATCH_DIR / "refresh.json"
# Every page generated from the committed summaries, in order (the virtual-time page reads the
# real-time rows for its agreement table).
REGENERATE: tuple[tuple[str, ...], ...] = (
    ("-m", "bench", "report"),
    ("-m", "bench", "slo-report"),
    ("-m", "bench.reports.identical_pods", "--write"),
    ("-m", "bench.reports.figures", "--counts"),  # last: the prose against the tables just written
)
Runner = Callable[[Sequence[str], Path], int]


def run_command(command: Sequence[str], cwd: Path) -> int:
    return subprocess.run(list(command), cwd=cwd, check=False).returncode


def load_journal(repo: Path, live: LiveDefault) -> dict[str, Any] | None:
    """The interrupted refresh of this default, None when there is none (or it was of another)."""
    path = repo / JOURNAL
    if not path.is_file():
        return None
    data = json.loads(path.read_text())
    return data if data.get("default") == live.key() else None


def save_journal(repo: Path, live: LiveDefault, units: Sequence[Unit], done: Sequence[str]) -> None:
    path = repo / JOURNAL
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {"default": live.key(), "units": [asdict(u) for u in units], "done": list(done)}
    path.write_text(json.dumps(data, indent=1) + "\n")


def resume_or(plan: Plan, repo: Path, live: LiveDefault) -> tuple[list[Unit], list[str]]:
    """The units to run and those already done: the journal's, when it is of this default."""
    journal = load_journal(repo, live)
    if journal is None:
        return plan.runnable(), []
    units = [Unit(**u) for u in journal["units"]]
    known = {u.id for u in units}
    units += [u for u in plan.runnable() if u.id not in known]  # stale since the journal was made
    return units, list(journal["done"])


def _fmt_s(seconds: float) -> str:
    seconds = max(0, int(seconds))
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


def check_done(unit: Unit, repo: Path, live: LiveDefault, started: float) -> str | None:
    """Why the unit's re-run did not leave a current summary where its row is; None when it did."""
    path = repo / summary_path(unit.root, unit.mode, unit.scenario, unit.policy, unit.seed)
    if not path.is_file() or path.stat().st_mtime < started:
        return f"no new summary at {path.relative_to(repo)}"
    left = [
        r
        for r in stale_reasons(json.loads(path.read_text()), live, repo)
        if not r.startswith("same campaign")
    ]
    return f"{path.relative_to(repo)} is still stale: {'; '.join(left)}" if left else None


def execute(
    plan: Plan,
    repo: Path,
    live: LiveDefault,
    *,
    runner: Runner = run_command,
    regenerate: bool = True,
    out: Callable[[str], None] = print,
) -> int:
    """Run what is left of the plan, one unit at a time; 1 at the first unit that fails (the
    journal keeps what was done), else regenerate the pages and drop the journal."""
    units, done = resume_or(plan, repo, live)
    left = [u for u in units if u.id not in done]
    if done:
        out(f"resuming: {len(done)} of {len(units)} run(s) done before")
    save_journal(repo, live, units, done)
    estimate = sum(u.core_s for u in left)
    spent_estimate = spent = 0.0
    for index, unit in enumerate(left, 1):
        rate = spent / spent_estimate if spent_estimate else 1.0  # measured / recorded, so far
        eta = (estimate - spent_estimate) * rate
        out(f"[{index}/{len(left)}] {unit.id} ({'; '.join(unit.reasons)}); ETA {_fmt_s(eta)}")
        assert unit.command is not None
        started = time.time()
        code = runner(unit.command, repo)
        problem = f"exit status {code}" if code else check_done(unit, repo, live, started)
        if problem:
            out(f"stopped at {unit.id}: {problem}; `python -m bench refresh` resumes here")
            return 1
        spent += time.time() - started
        spent_estimate += unit.core_s
        done.append(unit.id)
        save_journal(repo, live, units, done)
    if regenerate:
        for args in REGENERATE:
            out(f"regenerating: python {' '.join(args)}")
            if runner([sys.executable, *args], repo):
                out(f"regenerating failed: python {' '.join(args)}")
                return 1
    (repo / JOURNAL).unlink(missing_ok=True)
    out(f"refreshed {len(left)} run(s); pages regenerated" if regenerate else f"refreshed {len(left)} run(s)")
    return 0
