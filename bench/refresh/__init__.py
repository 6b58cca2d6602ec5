"""`python -m bench refresh`: re-run every committed row a change made stale, then regenerate the pages.

    python -m bench refresh --plan            # what is stale, why, and its core-hours; runs nothing
    python -m bench refresh [--virtual-only] [--alone] [--only TEXT] [--restart] [--no-pages]

bench/refresh/plan.py says what is stale (the summaries against the live default and scenario
files), bench/refresh/execute.py runs it (serially, progress and ETA, resumable).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from bench.refresh.execute import JOURNAL, execute
from bench.refresh.plan import LiveDefault, build_plan, render_plan


def add_parser(sub: Any) -> None:
    ref = sub.add_parser("refresh", help="re-run the committed rows that are not of the shipped default")
    ref.add_argument(
        "--plan", action="store_true", help="print what is stale and its core-hours; run nothing"
    )
    ref.add_argument(
        "--virtual-only", action="store_true", help="the virtual-time rows alone (no real-time run)"
    )
    ref.add_argument(
        "--alone", action="store_true", help="no companions: a real-time epp-default row without its peers"
    )
    ref.add_argument("--only", action="append", default=[], help="runs whose id holds this text; repeatable")
    ref.add_argument("--restart", action="store_true", help="drop an interrupted refresh's journal")
    ref.add_argument("--no-pages", action="store_true", help="do not regenerate the pages at the end")
    ref.add_argument("--root", default=".", help="the repository")


def cmd_refresh(args: argparse.Namespace) -> int:
    repo = Path(args.root).resolve()
    live = LiveDefault.now()
    plan = build_plan(repo, live, virtual_only=args.virtual_only, alone=args.alone)
    if args.only:
        plan.units = [u for u in plan.units if any(text in u.id for text in args.only)]
    print(render_plan(plan, live))
    if args.plan:
        return 0
    cannot = [u for u in plan.units if u.command is None]
    if cannot:
        print(f"{len(cannot)} run(s) cannot be re-run from their recorded command (above); the rest go on")
    if args.restart:
        (repo / JOURNAL).unlink(missing_ok=True)
    return execute(plan, repo, live, regenerate=not args.no_pages)
