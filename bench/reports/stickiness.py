"""How often each policy kept a prompt group (or a session) on the pod that served its previous
request, read from raw run results (`bench/results/...`, git-ignored), for runs summarized
before their summaries recorded it (`stats.steady.group_stickiness` since issue #11).

    python -m bench.reports.stickiness bench/results/quick/family-tenant-prefix-kv

prints one line per policy and seed: group and session stickiness over the whole run, and
the number of group moves (a group's request on another pod than its previous one);
`--by tag` counts moves and pods per whole tag instead (e.g. the LoRA adapter of the lora
workloads).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

from bench.harness.loadgen import RequestResult
from bench.harness.stats import group_stickiness, session_stickiness


def _moves(results: Sequence[RequestResult], every_tag: bool) -> tuple[int, float]:
    """(moves, mean pods per tag) over the groups' tags, or over every tag."""
    last: dict[str, str] = {}
    pods: dict[str, set[str]] = {}
    moves = 0
    for r in sorted(results, key=lambda r: r.sent_s):
        if not (every_tag or r.tag.startswith("group-")) or not r.ok or not r.pod:
            continue
        moves += r.tag in last and last[r.tag] != r.pod
        last[r.tag] = r.pod
        pods.setdefault(r.tag, set()).add(r.pod)
    return moves, (sum(map(len, pods.values())) / len(pods) if pods else 0.0)


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value * 100:.1f} %"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.reports.stickiness", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("scenario_dir", type=Path, help="bench/results/<mode>/<scenario>")
    parser.add_argument("--by", choices=("group", "tag"), default="group", help="what a move is counted for")
    args = parser.parse_args(argv)
    for path in sorted(args.scenario_dir.glob("*/seed-*.json")):
        raw = json.loads(path.read_text())
        results = [RequestResult(**r) for r in raw["results"]]
        moves, pods = _moves(results, args.by == "tag")
        print(
            f"{path.parent.name} {path.stem}: group stickiness {_fmt(group_stickiness(results))}, "
            f"{args.by} moves {moves}, pods per {args.by} {pods:.2f}, "
            f"session stickiness {_fmt(session_stickiness(results))}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
