"""The results at a glance: one table and one figure, for the README and the results page.

One row per published row (bench/reports/published.py) and per held-out scenario family: the TTFT P95
change vs round-robin of ours (the shipped default, `epp-default`, only) and the best peer router,
each the change of the medians over the reporting seeds, with the policy's own median [min-max].
Ours reads "stale" with no figure where its runs are of an earlier default (`python -m bench
refresh` re-runs them). The oracle column is the virtual-time exact oracle against virtual-time
round-robin (bench/summaries-virtual): it reads every pod's exact state at no cost, which no
real-time router on two shared cores can (its real-time stand-in probes every pod per request,
and on `bursty-qwen3-235b` came out +506 % against round-robin), so it is shown where it means
what it says, labelled as virtual time. Generated from the committed summaries by
`python -m bench report`, like every other table; the figure carries a digest of the numbers
it plots (PNG text chunk `bench-data`), so a test can tell a stale figure without comparing
pixels.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench.harness.stats import Spread
from bench.harness.summary import REPORTING_SEEDS
from bench.reports.published import NOT_RUN, PUBLISHED, Runs, best_peer
from bench.reports.report import BASELINE, _ms, _range, plt, ran_earlier_default, spread
from bench.reports.scorecard import FAMILY_PREFIX, ORACLE, OURS

SECTION = "headline"
DIGEST_KEY = "bench-data"
KEY = "steady.ttft_p95"


@dataclass(frozen=True)
class Figure:
    """One policy's TTFT P95 over seeds, as ratios to round-robin's median P95."""

    policy: str
    median: float
    lo: float
    hi: float
    seconds: Spread

    @property
    def change(self) -> float:
        return (self.median - 1.0) * 100


@dataclass(frozen=True)
class Row:
    scenario: str
    what: str
    baseline: Spread | None
    ours: Figure | None
    peer: Figure | None
    oracle: Figure | None  # virtual time: the exact oracle vs virtual-time round-robin
    earlier_default: bool  # ours ran a default other than today's: shown as stale, no figure


def _figure(policies: Mapping[str, Runs], policy: str | None, base: Spread | None) -> Figure | None:
    runs = policies.get(policy) if policy else None
    s = spread(runs, KEY) if runs else None
    if s is None or base is None or base.median <= 0:
        return None
    b = base.median
    return Figure(str(policy), s.median / b, s.lo / b, s.hi / b, s)


def headline_rows(
    scenarios: Mapping[str, Mapping[str, Runs]], virtual: Mapping[str, Mapping[str, Runs]] | None = None
) -> list[Row]:
    """The published rows in AWS's order, then every family with summaries, by name; the
    oracle from `virtual` (the virtual-time summaries), against virtual-time round-robin."""
    wanted = [(r.scenario, f"AWS: {r.workload}") for r in PUBLISHED]
    wanted += [(name, "held-out family") for name in sorted(scenarios) if name.startswith(FAMILY_PREFIX)]
    rows = []
    for name, what in wanted:
        policies = scenarios.get(name, {})
        base_runs = policies.get(BASELINE)
        base = spread(base_runs, KEY) if base_runs else None
        sim = (virtual or {}).get(name, {})
        sim_base = spread(sim[BASELINE], KEY) if sim.get(BASELINE) else None
        rows.append(
            Row(
                scenario=name,
                what=what,
                baseline=base,
                ours=_figure(policies, OURS, base),
                peer=_figure(policies, best_peer(policies), base),
                oracle=_figure(sim, ORACLE, sim_base),
                earlier_default=ran_earlier_default(OURS, policies.get(OURS, ())),
            )
        )
    return rows


def _cell(fig: Figure | None, name: bool = False) -> str:
    if fig is None:
        return NOT_RUN
    s = fig.seconds
    text = f"{fig.change:+.0f} % ({_ms(s.median)}{_range(s, 's')})"
    return f"{fig.policy} {text}" if name else text


def render_headline(rows: Sequence[Row], link: Callable[[str], str | None], image: str) -> str:
    """The table (each scenario linked to its section via `link`) and the figure below it."""
    seeds = ", ".join(map(str, REPORTING_SEEDS))
    lines = [
        f"| scenario | row | {BASELINE} TTFT P95 | ours (`{OURS}`) | best peer | {ORACLE}, virtual time |",
        "|---|---|---|---|---|---|",
    ]
    for row in rows:
        target = link(row.scenario)
        name = f"[`{row.scenario}`]({target})" if target else f"`{row.scenario}`"
        ours = STALE if row.ours and row.earlier_default else _cell(row.ours)
        base = NOT_RUN if row.baseline is None else _ms(row.baseline.median) + _range(row.baseline, "s")
        lines.append(
            f"| {name} | {row.what} | {base} | {ours} | {_cell(row.peer, name=True)} | {_cell(row.oracle)} |"
        )
    lines += [
        "",
        f"TTFT P95 change vs `{BASELINE}` (change of the medians over the reporting seeds {seeds}),",
        "then the policy's own P95: median [min-max]; steady window, quick mode, simulated fleet on",
        "2 shared cores. Best peer: the sglang-router / vllm-router / least-request policy with",
        "the lowest median. Oracle, virtual time: the exact oracle (every pod's exact state, at no",
        f"cost) vs `{BASELINE}`, both in virtual time (`bench/summaries-virtual`), a bound no real-time",
        "router reaches, not a real-time run. Stale: ours ran an earlier default; `python -m bench",
        "refresh` re-runs it. Generated by `python -m bench report` from `bench/summaries`.",
        "",
        f"![TTFT P95 vs {BASELINE}]({image})",
    ]
    return "\n".join(lines) + "\n"


def digest(rows: Sequence[Row]) -> str:
    """A hash of every number the figure plots (rounded, so float noise does not count)."""

    def clean(value: Any) -> Any:
        if isinstance(value, float):
            return round(value, 9)
        if isinstance(value, dict):
            return {k: clean(v) for k, v in value.items()}
        if isinstance(value, list):
            return [clean(v) for v in value]
        return value

    data = json.dumps([clean(asdict(r)) for r in rows], sort_keys=True)
    return hashlib.sha256(data.encode()).hexdigest()


SERIES = ((0, "ours (epp-default)", "tab:blue", "o"), (1, "best peer", "tab:orange", "s"),
          (2, "oracle, virtual time", "tab:gray", "D"))  # fmt: skip
STALE = "stale"  # ours, where its runs are of an earlier default: no figure
TICKS = (0.01, 0.03, 0.1, 0.3, 1.0, 3.0)


def plot_headline(rows: Sequence[Row], path: str | Path) -> Path:
    """Dots at the medians with min-max bars, per row; log scale, round-robin at 1."""
    fig, ax = plt.subplots(figsize=(8, 0.42 * len(rows) + 1.6))
    labels = [f"{r.scenario}{' *' if r.earlier_default else ''}" for r in rows]
    for index, label, color, marker in SERIES:
        ys: list[float] = []
        xs: list[float] = []
        errs: tuple[list[float], list[float]] = ([], [])
        for y, row in enumerate(rows):
            point = (None if row.earlier_default else row.ours, row.peer, row.oracle)[index]
            if point is None:
                continue
            ys.append(y + (index - 1) * 0.22)
            xs.append(point.median)
            errs[0].append(point.median - point.lo)
            errs[1].append(point.hi - point.median)
        ax.errorbar(xs, ys, xerr=errs, fmt=marker, color=color, label=label, capsize=2, markersize=5)
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.set_xscale("log")
    ax.set_xticks(TICKS)
    ax.set_xticklabels([f"{(t - 1) * 100:+.0f} %" if t != 1 else "0 %" for t in TICKS])
    ax.minorticks_off()
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels(labels)
    ax.invert_yaxis()
    ax.set_xlabel("change vs round-robin, log scale (median, min-max over seeds; left is better)", fontsize=9)
    note = " (* ours stale: ran an earlier default)" if any(r.earlier_default for r in rows) else ""
    ax.set_title(f"TTFT P95 change vs round-robin{note}", fontsize=10)
    ax.grid(True, axis="x", which="major", alpha=0.3)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=3, fontsize=8, frameon=False)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=100, metadata={DIGEST_KEY: digest(rows), "Software": None})
    plt.close(fig)
    return path


def figure_digest(path: str | Path) -> str | None:
    """The digest a figure was drawn from (None for a PNG without one)."""
    from PIL import Image

    with Image.open(path) as image:
        text: dict[str, str] = getattr(image, "text", {})
        return text.get(DIGEST_KEY)
