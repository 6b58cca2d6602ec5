"""`<!-- check: <root> <scenario> <policy> [vs <policy>] <metric> -->`: a prose figure recomputed
from the summaries (median over the reporting seeds), for bench/reports/figures.py."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.harness.stats import change_pct
from bench.harness.summary import REPORTING_SEEDS, load_summaries
from bench.reports.figure_text import Figure
from bench.reports.report import spread


@dataclass(frozen=True)
class Check:
    root: str
    scenario: str
    policy: str
    versus: str | None
    metric: str


def parse_check(body: str) -> Check | None:
    words = body.split()
    if words[:1] != ["check:"]:
        return None
    rest = words[1:]
    if len(rest) == 6 and rest[3] == "vs":
        return Check(rest[0], rest[1], rest[2], rest[4], rest[5])
    if len(rest) == 4:
        return Check(rest[0], rest[1], rest[2], None, rest[3])
    raise ValueError(f"a check reads `check: <root> <scenario> <policy> [vs <policy>] <metric>`: {body!r}")


class Summaries:
    """Medians over the reporting seeds, by root, scenario, policy and metric (loaded once)."""

    def __init__(self, root: Path, mode: str = "quick") -> None:
        self.root = root
        self.mode = mode
        self._loaded: dict[str, dict[str, dict[str, list[dict[str, Any]]]]] = {}

    def median(self, where: str, scenario: str, policy: str, metric: str) -> float | None:
        if where not in self._loaded:
            self._loaded[where] = load_summaries(self.root / where, self.mode, REPORTING_SEEDS)
        runs = self._loaded[where].get(scenario, {}).get(policy, [])
        found = spread(runs, metric if "." in metric else f"steady.{metric}")
        return None if found is None else found.median

    def value(self, check: Check, unit: str) -> float | None:
        """The checked figure in the prose figure's canonical unit."""
        mine = self.median(check.root, check.scenario, check.policy, check.metric)
        if check.versus is None:
            if mine is None:
                return None
            return mine * 1000 if unit == "ms" else mine * 100 if unit == "%" else mine
        other = self.median(check.root, check.scenario, check.versus, check.metric)
        if unit == "x":
            return None if mine is None or not other else mine / other
        if unit == "ms":  # a difference: "+68 ms"
            return None if mine is None or other is None else (mine - other) * 1000
        return change_pct(mine, other)


def verify(check: Check, figure: Figure, summaries: Summaries) -> str | None:
    value = summaries.value(check, figure.unit)
    if value is None:
        return f"is checked against {check} but the summaries have no such figure"
    if abs((value if figure.signed else abs(value)) - figure.value) <= figure.half_step + 1e-9:
        return None
    versus = f" vs {check.versus}" if check.versus else ""
    what = f"{check.root} {check.scenario} {check.policy}{versus} {check.metric}"
    return f"disagrees with the summaries: {what} gives {value:.4g} {figure.unit}"
