"""docs/benchmarks/llamacpp.md's generated tables: the real-engine campaign and its modelsim twins.

`python -m bench.reports.llamacpp` reads the run summaries of the llama.cpp scenarios
(bench/results-committed/llamacpp/summaries: `llama-*` on llama-server processes, `llama-*-sim`
their modelsim twins at the engine's measured per-token costs) and rewrites, between their
markers, one table per scenario (TTFT P50/P95, throughput, the engines' own prompt-cache
figures per policy, the engine version every summary records) and the twin comparison (the
change of each median from the real engines to the twin, flagged beyond `FLAG_PCT`).
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from bench.harness.stats import Spread, change_pct
from bench.harness.summary import REPORTING_SEEDS, load_summaries
from bench.reports.report import BASELINE, cell, provenance, spread, stat, write_section

SUMMARIES = "bench/results-committed/llamacpp/summaries"
DOC = "docs/benchmarks/llamacpp.md"
TWIN_SUFFIX = "-sim"
FLAG_PCT = 15.0
TITLE = "# Benchmarks: real engines (llama.cpp's llama-server)"
Runs = Sequence[Mapping[str, Any]]


def _counter(run: Mapping[str, Any], key: str) -> float | None:
    counters = run["run"].get("engine_counters") or {}
    value = counters.get(key)
    return None if value is None else float(value)


def _hit_share(runs: Runs) -> Spread | None:
    return Spread.of(_counter(r, "prompt_cache_hit_share") for r in runs)


def _share(s: Spread | None) -> str:
    if s is None:
        return "n/a"
    text = f"{s.median * 100:.0f} %"
    return text if s.n == 1 else text + f" [{s.lo * 100:.0f}-{s.hi * 100:.0f}]"


def _tokens(s: Spread | None) -> str:
    if s is None:
        return "n/a"
    text = f"{s.median:,.0f}"
    return text if s.n == 1 else text + f" [{s.lo:,.0f}-{s.hi:,.0f}]"


def _load_split(runs: Runs) -> str:
    """Each engine's share of the output tokens (in the fleet's pod order), medians over seeds:
    where the router sent the work (the engines send no pod header to attribute requests by);
    on simulated pods, their share of the steady window's requests (by pod name)."""
    shares: list[list[float]] = []
    for r in runs:
        pods = list(((r["run"].get("engine_counters") or {}).get("pods") or {}).values())
        out = [float(p.get("tokens_predicted_total", 0.0)) for p in pods]
        if not sum(out):  # simulated pods: their share of the steady window's requests
            share = stat(r, "steady.pod_share") or {}
            out = [float(share[name]) for name in sorted(share)]
        if out and sum(out) > 0:
            shares.append([v / sum(out) for v in out])
    if not shares or len({len(s) for s in shares}) != 1:
        return "n/a"
    medians = [Spread.of(s[i] for s in shares) for i in range(len(shares[0]))]
    return " / ".join(f"{m.median * 100:.0f} %" for m in medians if m is not None)


def _paid(runs: Runs) -> str:
    """What the engines paid per token during the run (their own seconds counters, all engines):
    prefill ms per computed prompt token / ms per generated token; n/a where not recorded."""

    def per_token(seconds: str, tokens: str) -> Spread | None:
        values = []
        for r in runs:
            pods = ((r["run"].get("engine_counters") or {}).get("pods") or {}).values()
            secs, toks = sum(p.get(seconds, 0.0) for p in pods), sum(p.get(tokens, 0.0) for p in pods)
            if any(seconds in p for p in pods) and toks:
                values.append(secs / toks * 1000)
        return Spread.of(values)

    prefill = per_token("prompt_seconds_total", "prompt_tokens_total")
    decode = per_token("tokens_predicted_seconds_total", "tokens_predicted_total")
    if prefill is None or decode is None:
        return "n/a"
    return f"{prefill.median:.2f} / {decode.median:.2f} ({prefill.n} seed{'s' if prefill.n > 1 else ''})"


def _baseline(policies: Mapping[str, Runs]) -> Runs | None:
    for name in (BASELINE, f"{BASELINE}+tok"):
        if name in policies:
            return policies[name]
    return None


def _ordered(policies: Mapping[str, Runs]) -> list[tuple[str, Runs]]:
    """Round-robin first, then ours, then the peers."""

    def rank(name: str) -> int:
        return 0 if name.startswith(BASELINE) else 1 if name.startswith("epp-") else 2

    return sorted(policies.items(), key=lambda kv: (rank(kv[0]), kv[0]))


def render_scenario(name: str, policies: Mapping[str, Runs]) -> str:
    """One scenario: setup, the table (changes vs round-robin), the engine, provenance."""
    first = next(iter(policies.values()))[0]
    sc = first["scenario"]
    a = sc["arrivals"]
    lines = [f"### {name}", "", str(sc.get("description", "")), ""]
    lines.append(
        f"Setup: arrivals {a.get('pattern')} at {a.get('rate')} req/s; {sc['duration_s']:g} s ({sc['mode']} mode); "
        f"steady window = arrivals after the first {first['stats']['window']['warmup_fraction'] * 100:.0f} % of the trace; "
        f"scenario file `{sc.get('file')}`."
    )
    lines += [
        "",
        "| policy | seeds | requests (steady) | TTFT P50 | TTFT P95 | sustained tok/s | errors "
        "| prompt-cache hit share (engine) | prompt tokens computed (engine) | output tokens per engine "
        "| ms per prompt / output token (engine) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    base = _baseline(policies)
    for policy, runs in _ordered(policies):
        ref = None if base is None or base is runs else base
        cells = [
            cell(spread(runs, key), unit, spread(ref, key) if ref is not None else None)
            for key, unit in (
                ("steady.ttft_p50", "s"),
                ("steady.ttft_p95", "s"),
                ("steady.output_tok_s", "tok/s"),
            )
        ]
        errors = sum(sum((stat(r, "steady.error_kinds") or {}).values()) for r in runs)
        requests = spread(runs, "steady.requests")
        lines.append(
            f"| {policy} | {', '.join(str(r['seed']) for r in runs)} | {requests.median if requests else 0:,.0f} | "
            + " | ".join(cells)
            + f" | {errors} | {_share(_hit_share(runs))} "
            f"| {_tokens(Spread.of(_counter(r, 'prompt_tokens_computed') for r in runs))} | {_load_split(runs)} | {_paid(runs)} |"
        )
    lines += [
        "",
        "Median over the seeds, [min-max] over them; changes in parentheses compare medians with "
        "round-robin. Prompt-cache figures: "
        + (
            "llama-server's own counters, read after each run from every process's `/metrics` "
            "(`llamacpp:prompt_tokens_cached_total` over it plus `llamacpp:prompt_tokens_total`; the "
            "whole run: warm-up and drain included, the processes start fresh per policy and seed)."
            if "engine" in first["run"]
            else "the simulated pods' `vllm:prefix_cache_hits` over `vllm:prefix_cache_queries` (tokens), "
            "read after each run (whole run)."
        )
        + " Output tokens per engine: each engine's share of the tokens generated, in the fleet's order"
        " (simulated pods: their share of the steady window's requests)."
        " ms per token: what the engines paid during the run, from their own counters"
        " (`prompt_seconds_total` / `prompt_tokens_total`, `tokens_predicted_seconds_total` /"
        " `tokens_predicted_total`, all engines; medians over the seeds that recorded them).",
    ]
    engines = sorted(
        {str(r["run"]["engine"]["version"]) for rs in policies.values() for r in rs if "engine" in r["run"]}
    )
    if engines:
        lines += ["", "Engine (recorded in every summary): " + "; ".join(engines) + "."]
    lines += ["", provenance(policies)]
    return "\n".join(lines) + "\n"


def _diff(real: Spread | None, twin: Spread | None) -> str:
    if real is None or twin is None:
        return "n/a"
    pct = change_pct(twin.median, real.median)
    if pct is None:
        return "n/a"
    text = f"{pct:+.0f} %"
    return f"**{text}**" if abs(pct) > FLAG_PCT else text


def render_comparison(data: Mapping[str, Mapping[str, Runs]]) -> str:
    """Each real scenario's medians next to its twin's: the twin's change from the real run."""
    lines = [
        "| scenario | policy | TTFT P50 real / twin | change | TTFT P95 real / twin | change "
        "| tok/s real / twin | change | prompt-cache hit share real / twin |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name in sorted(data):
        twin = data.get(name + TWIN_SUFFIX)
        if name.endswith(TWIN_SUFFIX) or twin is None:
            continue
        for policy, runs in _ordered(data[name]):
            other = twin.get(policy)
            if other is None:
                continue
            row = [name, policy]
            for key, unit in (
                ("steady.ttft_p50", "s"),
                ("steady.ttft_p95", "s"),
                ("steady.output_tok_s", "tok/s"),
            ):
                real, sim = spread(runs, key), spread(other, key)
                row += [f"{cell(real, unit)} / {cell(sim, unit)}", _diff(real, sim)]
            row.append(f"{_share(_hit_share(runs))} / {_share(_hit_share(other))}")
            lines.append("| " + " | ".join(row) + " |")
    lines += [
        "",
        f"Medians over the seeds both ran, [min-max]; change = twin vs real engine, bold beyond {FLAG_PCT:g} %.",
    ]
    return "\n".join(lines) + "\n"


def write_doc(summaries: str | Path, doc: str | Path, mode: str = "quick") -> list[str]:
    """Rewrite every generated section of `doc`; returns the section keys written."""
    data = load_summaries(summaries, mode, REPORTING_SEEDS)
    keys = []
    for name in sorted(data):
        key = f"llamacpp-{name}"
        write_section(doc, key, render_scenario(name, data[name]), title=TITLE)
        keys.append(key)
    write_section(doc, "llamacpp-comparison", render_comparison(data), title=TITLE)
    return [*keys, "llamacpp-comparison"]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--summaries", default=SUMMARIES)
    parser.add_argument("--doc", default=DOC)
    parser.add_argument("--mode", default="quick")
    args = parser.parse_args(argv)
    for key in write_doc(args.summaries, args.doc, args.mode):
        print(f"{args.doc}: {key}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
