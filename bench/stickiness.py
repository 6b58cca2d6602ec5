"""How often each policy kept a prompt group (or a session) on the pod that served its previous
request, read from raw run results (`bench/results/...`, git-ignored), for runs summarized
before their summaries recorded it (`stats.steady.group_stickiness` since issue #11).

    python -m bench.stickiness bench/results/quick/family-tenant-prefix-kv

prints one line per policy and seed: group and session stickiness over the whole run, and
the number of group moves (a group's request on another pod than its previous one).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

from bench.loadgen import RequestResult
from bench.stats import group_stickiness, session_stickiness


def _moves(results: Sequence[RequestResult]) -> int:
    last: dict[str, str] = {}
    moves = 0
    for r in sorted(results, key=lambda r: r.sent_s):
        if not r.tag.startswith("group-") or not r.ok or not r.pod:
            continue
        moves += r.tag in last and last[r.tag] != r.pod
        last[r.tag] = r.pod
    return moves


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value * 100:.1f} %"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.stickiness", description=__doc__.split("\n\n")[0])
    parser.add_argument("scenario_dir", type=Path, help="bench/results/<mode>/<scenario>")
    args = parser.parse_args(argv)
    for path in sorted(args.scenario_dir.glob("*/seed-*.json")):
        raw = json.loads(path.read_text())
        results = [RequestResult(**r) for r in raw["results"]]
        print(
            f"{path.parent.name} {path.stem}: group stickiness {_fmt(group_stickiness(results))}, "
            f"group moves {_moves(results)}, session stickiness {_fmt(session_stickiness(results))}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
