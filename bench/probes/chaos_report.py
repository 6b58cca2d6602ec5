"""The chaos soak's tables (bench/probes/chaos_soak.py) in docs/reliability.md, from a committed output.

`python -m bench.probes.chaos_report --summary bench/results-committed/<date>-chaos-soak/chaos-soak.json
--doc docs/reliability.md` rewrites the block between the markers; tests/bench/test_chaos_report.py
fails when the committed page and the committed output drift apart.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any

BEGIN, END = "<!-- chaos-soak:begin -->", "<!-- chaos-soak:end -->"


def _outcomes(summary: dict[str, Any]) -> list[str]:
    results = sorted(
        {r for counts in summary["by_kind"].values() for r in counts}, key=lambda r: (r != "ok", r)
    )
    lines = [
        "| kind | " + " | ".join(results) + " |",
        "|---|" + "---|" * len(results),
    ]
    totals = dict.fromkeys(results, 0)
    for kind, counts in summary["by_kind"].items():
        lines.append(f"| {kind} | " + " | ".join(f"{counts.get(r, 0):,}" for r in results) + " |")
        for r in results:
            totals[r] += counts.get(r, 0)
    lines.append("| **all** | " + " | ".join(f"**{totals[r]:,}**" for r in results) + " |")
    return lines


def _faults(summary: dict[str, Any]) -> list[str]:
    errors = summary["errors_per_window"]
    lines = [
        "| fault | injected at (s) | window ends (s) | failed requests in its window |",
        "|---|---|---|---|",
    ]
    for f in summary["faults"]:
        lines.append(f"| {f['fault']} | {f['start_s']} | {f['end_s']} | {errors.get(f['fault'], 0)} |")
    return lines


def _end(summary: dict[str, Any]) -> list[str]:
    end = summary["end"]
    store = end["store"]
    replicas = ", ".join(f"{k} {v}" for k, v in end["replicas_inflight"].items())
    pods = ", ".join(f"{k} {v:g}" for k, v in end["pods_running_or_waiting"].items())
    return [
        "| at the end | value |",
        "|---|---|",
        f"| EPP replicas' in-flight (own + peers') | {replicas} |",
        f"| Envoy's active requests to the pool | {end['envoy_active']} |",
        f"| pods' running + waiting requests | {pods} |",
        f"| store: the pool's keys | {len(store['keys'])} ({', '.join(k.split(':', 2)[-1] for k in store['keys'])}) |",
        f"| store: requests its in-flight hashes hold | {store['inflight_requests_held']} |",
    ]


def _resources(summary: dict[str, Any]) -> list[str]:
    lines = [
        "| process (pid) | minutes sampled | RSS first -> last (KiB) | change | open files first -> last |",
        "|---|---|---|---|---|",
    ]
    for key, r in summary["resources"].items():
        first, last = r["first"], r["last"]
        change = (last["rss_kib"] - first["rss_kib"]) / first["rss_kib"] * 100 if first["rss_kib"] else 0.0
        lines.append(
            f"| {key} | {first['minute']}-{last['minute']} | {first['rss_kib']:,} -> {last['rss_kib']:,} "
            f"| {change:+.1f} % | {first['fds']} -> {last['fds']} |"
        )
    return lines


def render(summary: dict[str, Any], source: str) -> str:
    head = (
        f"From `{source}`: {summary['minutes']} minutes, {summary['requests']:,} requests "
        f"({summary['rps_target']:g}/s target, {summary['shed_by_client']:,} shed by the client), "
        f"**{summary['failed']} failed, {len(summary['unaccounted'])} outside every fault window**."
    )
    parts = [
        head,
        "",
        *_outcomes(summary),
        "",
        *_faults(summary),
        "",
        *_end(summary),
        "",
        *_resources(summary),
    ]
    return "\n".join(parts)


def rewrite(doc: str, block: str) -> str:
    pattern = re.compile(re.escape(BEGIN) + ".*?" + re.escape(END), re.S)
    if not pattern.search(doc):
        raise ValueError(f"the page has no {BEGIN} ... {END} block")
    return pattern.sub(lambda _: f"{BEGIN}\n{block}\n{END}", doc)


def main() -> None:
    parser = argparse.ArgumentParser(description="the chaos soak's tables in docs/reliability.md")
    parser.add_argument("--summary", type=Path, required=True)
    parser.add_argument("--doc", type=Path, required=True)
    args = parser.parse_args()
    block = render(json.loads(args.summary.read_text()), args.summary.as_posix())
    args.doc.write_text(rewrite(args.doc.read_text(), block))


if __name__ == "__main__":
    main()
