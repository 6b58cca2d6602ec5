"""An outside load generator against the same gateway and fleet as ours: inference-perf vs bench run.

`bench serve` brings up one scenario's simulated fleet and one policy's router (the same ones
`bench run` would start); then our load generator (`bench run --policy url`, one seed of the
scenario's trace) and inference-perf (its own Poisson arrivals and synthetic prompts at the
scenario's shape, from a config such as bench/inference-perf/uniform.yaml, its prompts cut
from a corpus of the bench's own pseudo-English) take turns against it. Both are read the same way, by bench.harness.stats from their per-request records: TTFT P50 / P95
(send to first streamed token) over the steady window and the sustained output tokens/s.

inference-perf needs Python >= 3.12: it lives in its own environment (`make inference-perf`
creates .venv-inference-perf); this module only starts it as a command.

    python -m bench.probes.outside_loadgen --inference-perf .venv-inference-perf/bin/inference-perf \\
        [--scenario bench/scenarios/uniform.yaml] [--policy epp-default] [--out /tmp/outside]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import resource
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench.harness.loadgen import RequestResult
from bench.harness.stats import phase_stats, steady_window
from bench.reports.report import load_run
from modelsim.pseudo_text import TextSource

REPO = Path(__file__).resolve().parents[2]
TOKENIZER = REPO / "modelsim" / "tokenizer_files" / "sim-llama3-12k"
READY_TIMEOUT_S = 120.0
# inference-perf cuts each prompt from a corpus (Shakespeare by default). The shipped tokenizer
# was trained on the bench's pseudo-English, where it counts ~chars / 4 tokens like the pods do;
# on Shakespeare a 230-token prompt (its count) was ~140 tokens to the pods.
CORPUS_TOKENS = 60_000


@dataclass(frozen=True)
class Figures:
    """One load generator's run, read by bench.harness.stats (the steady window of the summaries)."""

    tool: str
    requests: int
    ok: int
    ttft_p50_s: float | None
    ttft_p95_s: float | None
    output_tok_s: float  # sustained: tokens emitted in the steady window / its length
    steady_requests: int
    arrivals_per_s: float  # steady requests / the window's length: the offered rate
    mean_output_tokens: float  # of the steady window's successful requests (server-counted)
    cpu_ms_per_request: float | None = None  # the load generator's own CPU, start-up included


def figures(tool: str, results: list[RequestResult], cpu_s: float | None = None) -> Figures:
    """Steady window = arrivals after the first 10 % of the run, as every summary has it."""
    stats = phase_stats(results)
    steady = stats["steady"]
    window = steady_window(results)
    arrived = [r for r in results if r.scheduled_s >= window.start_s and r.ok]
    return Figures(
        tool, len(results), sum(r.ok for r in results), steady["ttft_p50"], steady["ttft_p95"],
        steady["output_tok_s"], steady["requests"],
        steady["requests"] / window.length_s if window.length_s > 0 else 0.0,
        sum(r.output_tokens for r in arrived) / len(arrived) if arrived else 0.0,
        None if cpu_s is None or not results else cpu_s / len(results) * 1000,
    )  # fmt: skip


def inference_perf_results(per_request_file: Path) -> list[RequestResult]:
    """inference-perf's per_request_lifecycle_metrics.json as our RequestResults: start_time,
    end_time and each output token's arrival (`info.response_metrics.output_token_times`),
    times relative to its first send (it schedules no other way we can see, so a request is
    taken as sent when scheduled)."""
    records: list[dict[str, Any]] = json.loads(per_request_file.read_text())
    t0 = min((r["start_time"] for r in records), default=0.0)
    out = []
    for i, r in enumerate(sorted(records, key=lambda r: r["start_time"])):
        metrics = (r.get("info") or {}).get("response_metrics") or {}
        times = metrics.get("output_token_times") or []
        sent = r["start_time"] - t0
        out.append(
            RequestResult(
                index=i, tag="inference-perf", scheduled_s=sent, sent_s=sent,
                ttft_s=times[0] - r["start_time"] if times else None,
                e2e_s=r["end_time"] - r["start_time"],
                itl_s=[b - a for a, b in itertools.pairwise(times)],
                output_tokens=int(metrics.get("output_tokens") or 0), content_chunks=len(times),
                status=0 if r.get("error") else 200, error=str(r["error"]) if r.get("error") else None,
            )
        )  # fmt: skip
    return out


def render(rows: Sequence[Figures], shape: str) -> str:
    def ms(v: float | None) -> str:
        return "n/a" if v is None else f"{v * 1000:,.1f} ms"

    lines = [
        f"Same gateway and fleet, one after the other ({shape}); both read by bench.harness.stats:",
        "steady window = arrivals after the first 10 % of each run's arrival span.",
        "",
        "| load generator | requests (ok) | steady: arrivals/s | mean output tokens | TTFT P50 | TTFT P95 "
        "| sustained output tok/s | offered (arrivals/s x mean output) | client CPU per request |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for f in rows:
        offered = f.arrivals_per_s * f.mean_output_tokens
        lines.append(
            f"| {f.tool} | {f.requests} ({f.ok}) | {f.arrivals_per_s:.1f} | {f.mean_output_tokens:.0f} "
            f"| {ms(f.ttft_p50_s)} | {ms(f.ttft_p95_s)} | {f.output_tok_s:,.0f} | {offered:,.0f} "
            f"| {'n/a' if f.cpu_ms_per_request is None else f'{f.cpu_ms_per_request:.1f} ms'} |"
        )
    if len(rows) == 2:
        a, b = rows

        def pct(x: float | None, y: float | None) -> str:
            return "n/a" if x is None or y is None or y == 0 else f"{(x / y - 1) * 100:+.1f} %"

        lines += [
            "",
            f"{b.tool} vs {a.tool}: TTFT P50 {pct(b.ttft_p50_s, a.ttft_p50_s)}, TTFT P95 "
            f"{pct(b.ttft_p95_s, a.ttft_p95_s)}, output tok/s {pct(b.output_tok_s, a.output_tok_s)}.",
        ]
    return "\n".join(lines) + "\n"


def _wait_ready(path: Path, proc: subprocess.Popen[bytes]) -> dict[str, Any]:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while not (path.exists() and path.read_text().strip()):
        if proc.poll() is not None:
            raise SystemExit(f"bench serve exited with {proc.returncode} before it was ready")
        if time.monotonic() > deadline:
            raise SystemExit(f"bench serve not ready after {READY_TIMEOUT_S:.0f} s")
        time.sleep(0.2)
    info: dict[str, Any] = json.loads(path.read_text())
    return info


def run(args: argparse.Namespace) -> int:
    tool = Path(args.inference_perf)
    if not tool.exists():
        print(f"no inference-perf at {tool}: run `make inference-perf` (or pip install inference-perf "
              "in a Python >= 3.12 environment) and pass --inference-perf", file=sys.stderr)  # fmt: skip
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    corpus = out / "corpus.txt"  # prompts of our pseudo-English, which the shipped tokenizer fits
    corpus.write_text(TextSource(0).text(CORPUS_TOKENS, random.Random(0)) + "\n")
    ready = out / "serve.json"
    ready.unlink(missing_ok=True)
    py = sys.executable
    serve = subprocess.Popen(
        [py, "-m", "bench", "serve", "--scenario", args.scenario, "--policy", args.policy,
         "--ready-file", str(ready)],
        stdout=(out / "serve.log").open("wb"), stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        info = _wait_ready(ready, serve)
        ours_cmd = [
            py, "-m", "bench", "run", "--scenario", args.scenario, "--policy", "url",
            "--target-opt", f"url={info['base_url']}", "--worker-urls", *info["worker_urls"],
            "--seed", str(args.seed), "--results", str(out / "ours-results"),
            "--summaries", str(out / "ours-summaries"), "--no-progress",
        ]  # fmt: skip
        if info.get("ca_file"):
            ours_cmd += ["--ca-file", info["ca_file"]]
        theirs_cmd = [
            str(tool), "-c", args.config, "--server.base_url", info["base_url"],
            "--server.model_name", str(info["model"]),
            "--tokenizer.pretrained_model_name_or_path", str(TOKENIZER),
            "--data.corpus_file_path", str(corpus),
            "--storage.local_storage.path", str(out / "inference-perf"),
        ]  # fmt: skip
        env = {**os.environ, "HF_HUB_OFFLINE": "1"}  # the tokenizer is a local path: nothing to fetch
        if info.get("ca_file"):
            env["SSL_CERT_FILE"] = info["ca_file"]  # inference-perf verifies TLS with the default store
        turns = [("ours", ours_cmd, None), ("inference-perf", theirs_cmd, env)]
        cpu: dict[str, float] = {}  # each load generator's own CPU seconds (user + system)
        for name, cmd, cmd_env in reversed(turns) if args.theirs_first else turns:
            print("$ " + " ".join(cmd), flush=True)
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            with (out / f"{name}.log").open("wb") as log:
                code = subprocess.run(
                    cmd, stdout=log, stderr=subprocess.STDOUT, env=cmd_env, check=False
                ).returncode
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpu[name] = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
            (out / "cpu.json").write_text(json.dumps(cpu) + "\n")
            if code != 0:
                print(f"{name} exited with {code}; its output: {out / f'{name}.log'}", file=sys.stderr)
                return 1
    finally:
        serve.send_signal(signal.SIGTERM)
        try:
            serve.wait(timeout=60)
        except subprocess.TimeoutExpired:
            serve.kill()
    return compare(out, args)


def compare(out: Path, args: argparse.Namespace) -> int:
    """Both tools' figures from their outputs under `out` (also without rerunning: --analyze)."""
    raw = next((out / "ours-results").rglob("seed-*.json"), None)
    per_request = next((out / "inference-perf").rglob("per_request_lifecycle_metrics.json"), None)
    if raw is None or per_request is None:
        print(f"no outputs of both tools under {out}", file=sys.stderr)
        return 2
    cpu_file = out / "cpu.json"
    cpu = json.loads(cpu_file.read_text()) if cpu_file.exists() else {}
    rows = [
        figures("bench run (ours)", load_run(raw).results, cpu.get("ours")),
        figures("inference-perf", inference_perf_results(per_request), cpu.get("inference-perf")),
    ]
    shape = (
        f"{Path(args.scenario).stem}, policy {args.policy}, seed {args.seed}; inference-perf: {args.config}"
    )
    text = render(rows, shape)
    (out / "comparison.json").write_text(json.dumps([asdict(r) for r in rows], indent=1) + "\n")
    (out / "comparison.md").write_text(text)
    print(text)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.probes.outside_loadgen", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--inference-perf", default=".venv-inference-perf/bin/inference-perf")
    parser.add_argument("--scenario", default="bench/scenarios/uniform.yaml")
    parser.add_argument(
        "--config", default="bench/inference-perf/uniform.yaml", help="inference-perf's config"
    )
    parser.add_argument("--policy", default="epp-default")
    parser.add_argument("--seed", type=int, default=1, help="our trace's seed")
    parser.add_argument("--theirs-first", action="store_true", help="inference-perf's turn first")
    parser.add_argument(
        "--out", default="bench/results/outside", help="logs, both tools' outputs, comparison"
    )
    parser.add_argument("--analyze", action="store_true", help="only read the outputs already under --out")
    args = parser.parse_args(argv)
    return compare(Path(args.out), args) if args.analyze else run(args)


if __name__ == "__main__":
    sys.exit(main())
