"""Cross-check modelsim against an independent simulator, xpyd-sim (PyPI), on one configuration.

Both simulators get the same step-cost coefficients and batch limits (`Knobs`, mapped onto each
by `modelsim_fleet_spec` and `xpyd_profile` / `xpyd_command`), one pod each, no prefix caching,
and the same seeded trace of streaming /v1/completions requests whose prompts are token-id
lists (both count them exactly) with `max_tokens` and `ignore_eos` (both generate exactly that
many tokens). One async client (bench.harness.loadgen) replays the trace against each at two load
levels; the summary puts TTFT and E2E percentiles side by side.

xpyd-sim 0.5.0 in scheduling mode streams a request's tokens only when it has finished, so its
TTFT cannot be read from the HTTP stream; `serve-xpyd` runs its app with a hook that stamps each
request's first decoded token (server side, monotonic clock) and serves the stamps on
`GET /crosscheck/timings`. modelsim's TTFT is the client's (first content chunk).

    python -m bench.probes.xsim_crosscheck [--out bench/results-committed/xsim-crosscheck/rerun.json]

xpyd-sim is a bench-only dependency (the `bench` extra); this module imports it only in
`serve-xpyd`, so the trace and knob mapping work without it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import httpx
import yaml

from bench.harness.loadgen import LoadGenConfig, RequestResult, run_trace
from bench.harness.stats import percentile
from bench.harness.summary import git_state, machine_state
from bench.harness.workloads import TraceRequest, poisson_arrivals
from devstack.launch import free_port

MODEL = "xcheck"
QUANTILES = (50, 90, 99)
DEFAULT_OUT = Path("bench/results-committed/xsim-crosscheck/rerun.json")


@dataclass(frozen=True)
class Knobs:
    """One engine configuration in modelsim's terms (step-time roofline + limits).

    A synthetic GPU, not a calibrated profile: steps of ~26 ms keep the simulators' own Python
    overhead small next to the modelled time on a loaded 2-core machine."""

    t0_ms: float = 2.0
    w_ms: float = 24.0
    k_kv_ms_per_1k: float = 0.2
    c_p_ms_per_token: float = 0.08
    max_num_batched_tokens: int = 2048
    max_num_seqs: int = 32
    max_model_len: int = 4096


@dataclass(frozen=True)
class Workload:
    """Prompt and output lengths uniform in [lo, hi]; Poisson arrivals."""

    requests: int
    rate: float
    seed: int
    prompt_tokens: tuple[int, int] = (64, 1024)
    output_tokens: tuple[int, int] = (8, 96)


LEVELS: dict[str, Workload] = {
    "light": Workload(requests=120, rate=4.0, seed=7),
    "near-saturation": Workload(requests=270, rate=9.0, seed=8),
}

# How each knob of one simulator maps onto the other (rendered into docs/modelsim.md).
KNOB_MAPPING: tuple[tuple[str, str, str], ...] = (
    (
        "`t0_ms` (per step)",
        "prefill `coefficients[-1]`; decode `coefficients[0]` (with `w_ms`)",
        "xpyd-sim charges it once per prefill phase and once per decode step",
    ),
    (
        "`w_ms` (weights read per step)",
        "decode `coefficients[0]` = `t0_ms + w_ms`",
        "modelsim: inside max(memory, compute); xpyd-sim: decode steps only, added",
    ),
    (
        "`k_kv_ms_per_1k` x context tokens of the decoding requests / 1000",
        "decode `coefficients[3]` = `k_kv_ms_per_1k / 1000` (x batch x mean context)",
        "same product; xpyd-sim truncates the mean context to an integer",
    ),
    (
        "`c_p_ms_per_token` x (prefill + decode tokens of the step)",
        "prefill `coefficients[0]` = `c_p_ms_per_token` (x prompt tokens of the batch)",
        "xpyd-sim: no compute term for decode tokens (decode coefficients[1] = 0), and no max(): "
        "its prefill of P tokens costs t0 + c_p x P even when modelsim's step would be memory-bound (t0 + w)",
    ),
    (
        "`max_num_batched_tokens` (prefill chunks + decode tokens per step; chunked prefill)",
        "`--max-num-batched-tokens` (whole prompts per prefill batch, FIFO)",
        "xpyd-sim does not chunk: a prompt over the budget never runs, so the trace stays under it",
    ),
    (
        "`max_num_seqs` (running = prefilling + decoding)",
        "`--max-num-seqs` (decode batch, and prefill batch size)",
        "xpyd-sim lets prefilled requests wait for a decode slot without a limit",
    ),
    (
        "`max_model_len`",
        "`--max-model-len`",
        "same check (prompt longer: 400)",
    ),
    (
        "`num_gpu_blocks` (KV capacity; preemption when full)",
        "none",
        "xpyd-sim has no KV capacity; modelsim gets enough blocks that it never preempts",
    ),
    (
        "`enable_prefix_caching: false`",
        "none (no prefix cache)",
        "prompts are random token ids anyway",
    ),
    (
        "output length = `max_tokens`",
        "`ignore_eos: true` in the body (else a random length in [eos_min_ratio x max_tokens, max_tokens])",
        "both generate exactly `max_tokens`",
    ),
    (
        "none",
        "`--mode dual`, `--kv-transfer-delay-ms` (P/D disaggregation), warm-up penalty",
        "dual mode: no KV transfer; warm-up off",
    ),
)


def modelsim_fleet_spec(knobs: Knobs) -> dict[str, Any]:
    """One modelsim pod with `knobs` as its profile; KV never the limit, no prefix cache."""
    blocks = knobs.max_num_seqs * (knobs.max_model_len // 16 + 1) * 2
    profile = {"base": "h100-llama3.1-8b", **asdict(knobs), "num_gpu_blocks": blocks, "block_size": 16}
    return {
        "time_scale": 1.0,
        "profiles": {MODEL: profile},
        "pods": [{"name": MODEL, "model": MODEL, "profile": MODEL, "enable_prefix_caching": False}],
    }


def xpyd_profile(knobs: Knobs) -> dict[str, Any]:
    """xpyd-sim's calibrated-profile form: prefill = polyval(coeffs, batch prompt tokens);
    decode step = c0 + c1*bs + c2*ctx + c3*bs*ctx + c4*bs^2 + c5*ctx^2 (ctx = mean context)."""
    return {
        "prefill": {"coefficients": [knobs.c_p_ms_per_token, knobs.t0_ms]},
        "decode": {
            "coefficients": [knobs.t0_ms + knobs.w_ms, 0.0, 0.0, knobs.k_kv_ms_per_1k / 1000, 0.0, 0.0]
        },
    }


def xpyd_command(knobs: Knobs, port: int, profile_path: str | Path) -> list[str]:
    """The `serve-xpyd` child: xpyd-sim's own server flags for the same configuration."""
    return [
        sys.executable, "-m", "bench.probes.xsim_crosscheck", "serve-xpyd",
        "--port", str(port), "--host", "127.0.0.1", "--model", MODEL, "--mode", "dual",
        "--scheduling", "--profile", str(profile_path),
        "--max-num-batched-tokens", str(knobs.max_num_batched_tokens),
        "--max-num-seqs", str(knobs.max_num_seqs), "--max-model-len", str(knobs.max_model_len),
        "--warmup-requests", "0", "--kv-transfer-delay-ms", "0",
    ]  # fmt: skip


def make_trace(w: Workload, vocab_size: int = 128256) -> list[TraceRequest]:
    """`w.requests` Poisson arrivals; token-id prompts and exact output lengths, all from `w.seed`."""
    rng = random.Random(w.seed)
    times = poisson_arrivals(w.rate, w.requests / w.rate * 3, rng)[: w.requests]
    if len(times) < w.requests:
        raise ValueError(f"the arrival process gave {len(times)} < {w.requests} requests")
    out = []
    for i, at in enumerate(times):
        prompt = [rng.randrange(1, vocab_size) for _ in range(rng.randint(*w.prompt_tokens))]
        body = {
            "model": MODEL,
            "prompt": prompt,
            "max_tokens": rng.randint(*w.output_tokens),
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        out.append(TraceRequest(at_s=at, body=body, tag=f"req-{i}"))
    return out


def quantiles(values: Sequence[float]) -> dict[str, float | None]:
    return {f"p{q}": percentile(values, q) for q in QUANTILES}


def side_stats(
    results: Sequence[RequestResult], ttft_override: Sequence[float] | None = None
) -> dict[str, Any]:
    ok = [r for r in results if r.ok]
    ttft = (
        list(ttft_override) if ttft_override is not None else [r.ttft_s for r in ok if r.ttft_s is not None]
    )
    e2e = [r.e2e_s for r in ok if r.e2e_s is not None]
    return {
        "requests": len(results),
        "ok": len(ok),
        "ttft_s": quantiles(ttft),
        "e2e_s": quantiles(e2e),
        "output_tokens": sum(r.output_tokens for r in ok),
    }


# ---------------------------------------------------------------- running


async def _wait_http(url: str, proc: asyncio.subprocess.Process, deadline_s: float = 60.0) -> None:
    end = time.monotonic() + deadline_s
    async with httpx.AsyncClient(timeout=2.0) as client:
        while time.monotonic() < end:
            if proc.returncode is not None:
                raise RuntimeError(f"server exited with {proc.returncode} before it answered {url}")
            with contextlib.suppress(httpx.HTTPError):
                if (await client.get(url)).status_code == 200:
                    return
            await asyncio.sleep(0.2)
    raise RuntimeError(f"{url} did not answer within {deadline_s:.0f} s")


@contextlib.asynccontextmanager
async def _child(cmd: list[str], health_url: str, log_path: Path) -> AsyncIterator[None]:
    """A server child process, up once `health_url` answers 200; its stderr goes to `log_path`."""
    with log_path.open("wb") as log:
        proc = await asyncio.create_subprocess_exec(*cmd, stdout=asyncio.subprocess.DEVNULL, stderr=log)
        try:
            await _wait_http(health_url, proc)
            yield
        finally:
            if proc.returncode is None:
                proc.terminate()
            try:
                await asyncio.wait_for(proc.wait(), 15)
            except TimeoutError:
                proc.kill()
                await proc.wait()


async def _replay(trace: list[TraceRequest], base_url: str) -> list[RequestResult]:
    config = LoadGenConfig(base_url=base_url, concurrency=512, timeout_s=300.0, max_wall_s=600.0)
    return (await run_trace(trace, config)).results


async def run_modelsim(knobs: Knobs, trace: list[TraceRequest], work: Path) -> dict[str, Any]:
    port = free_port()
    spec_path = work / "modelsim-fleet.yaml"
    spec = modelsim_fleet_spec(knobs)
    spec["pods"][0]["port"] = port
    spec_path.write_text(yaml.safe_dump(spec))
    cmd = [sys.executable, "-m", "modelsim", "fleet", "--spec", str(spec_path), "--host", "127.0.0.1"]
    base = f"http://127.0.0.1:{port}"
    async with _child(cmd, base + "/health", work / "modelsim.log"):
        results = await _replay(trace, base)
        async with httpx.AsyncClient(timeout=10.0) as client:
            state = (await client.get(base + "/sim/state")).json()
    return {**side_stats(results), "sim_state": _lag_fields(state)}


def _lag_fields(state: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in state.items() if "lag" in k or "preempt" in k}


async def run_xpyd(knobs: Knobs, trace: list[TraceRequest], work: Path) -> dict[str, Any]:
    port = free_port()
    profile_path = work / "xpyd-profile.yaml"
    profile_path.write_text(yaml.safe_dump(xpyd_profile(knobs)))
    base = f"http://127.0.0.1:{port}"
    async with _child(xpyd_command(knobs, port, profile_path), base + "/health", work / "xpyd.log"):
        results = await _replay(trace, base)
        async with httpx.AsyncClient(timeout=30.0) as client:
            stamps = (await client.get(base + "/crosscheck/timings")).json()
    server_ttft = [s["first_token_s"] - s["created_s"] for s in stamps if s.get("first_token_s")]
    stats = side_stats(results, server_ttft)
    stats["ttft_source"] = (
        "server-side stamp of the first decoded token (its HTTP stream sends all at the end)"
    )
    stats["http_first_content_s"] = quantiles([r.ttft_s for r in results if r.ok and r.ttft_s is not None])
    return stats


def _versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for name in ("xpyd-sim", "inference-gateway"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


async def crosscheck(knobs: Knobs, levels: dict[str, Workload]) -> dict[str, Any]:
    summary: dict[str, Any] = {
        "what": "modelsim vs xpyd-sim, one pod each, same knobs and trace (bench/probes/xsim_crosscheck.py)",
        "knobs": asdict(knobs),
        "xpyd_profile": xpyd_profile(knobs),
        "knob_mapping": [list(row) for row in KNOB_MAPPING],
        "versions": _versions(),
        "git": git_state(),
        "machine_before": machine_state(),
        "levels": {},
    }
    with tempfile.TemporaryDirectory(prefix="xsim-crosscheck-") as tmp:
        work = Path(tmp)
        for name, w in levels.items():
            trace = make_trace(w)
            started = time.monotonic()
            level: dict[str, Any] = {"workload": asdict(w), "offered": offered(trace, w)}
            level["modelsim"] = await run_modelsim(knobs, trace, work)
            level["xpyd-sim"] = await run_xpyd(knobs, trace, work)
            level["wall_s"] = time.monotonic() - started
            summary["levels"][name] = level
            print(render_table({"levels": {name: level}}), flush=True)
    summary["machine_after"] = machine_state()
    return summary


def offered(trace: Sequence[TraceRequest], w: Workload) -> dict[str, float]:
    span = trace[-1].at_s if trace else 0.0
    prompt = sum(len(r.body["prompt"]) for r in trace) / max(1, len(trace))
    output = sum(r.body["max_tokens"] for r in trace) / max(1, len(trace))
    return {"span_s": span, "mean_prompt_tokens": prompt, "mean_output_tokens": output, "rate": w.rate}


def render_table(summary: dict[str, Any]) -> str:
    """Markdown: one row per load level x simulator, TTFT and E2E p50/p90/p99 in ms."""

    def ms(v: float | None) -> str:
        return "n/a" if v is None else f"{v * 1000:,.0f}"

    head = " | ".join(f"TTFT p{q}" for q in QUANTILES) + " | " + " | ".join(f"E2E p{q}" for q in QUANTILES)
    lines = [f"| load | simulator | ok | {head} |", "|---|---|---|" + "---|" * (2 * len(QUANTILES))]
    for name, level in summary["levels"].items():
        for sim in ("modelsim", "xpyd-sim"):
            s = level[sim]
            cells = [ms(s["ttft_s"][f"p{q}"]) for q in QUANTILES] + [
                ms(s["e2e_s"][f"p{q}"]) for q in QUANTILES
            ]
            label = f"{name} ({level['workload']['rate']:g} req/s)"
            lines.append(f"| {label} | {sim} | {s['ok']}/{s['requests']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n\n(times in ms)"


# ---------------------------------------------------------------- xpyd-sim server with TTFT stamps


def serve_xpyd(argv: Sequence[str]) -> None:
    """xpyd-sim's app under uvicorn, plus GET /crosscheck/timings (first-token stamps)."""
    import uvicorn
    from xpyd_sim.server import ServerConfig, create_app  # type: ignore[import-untyped]

    p = argparse.ArgumentParser(prog="serve-xpyd")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--model", default=MODEL)
    p.add_argument("--mode", default="dual")
    p.add_argument("--profile", required=True)
    p.add_argument("--max-num-batched-tokens", type=int, required=True)
    p.add_argument("--max-num-seqs", type=int, required=True)
    p.add_argument("--max-model-len", type=int, required=True)
    p.add_argument("--warmup-requests", type=int, default=0)
    p.add_argument("--kv-transfer-delay-ms", type=float, default=0.0)
    p.add_argument("--scheduling", action="store_true")
    args = p.parse_args(argv)
    if not args.scheduling:
        raise SystemExit("serve-xpyd needs --scheduling (batching); without it xpyd-sim sleeps per request")
    config = ServerConfig(
        mode=args.mode,
        model_name=args.model,
        kv_transfer_delay_ms=args.kv_transfer_delay_ms,
        max_model_len=args.max_model_len,
        warmup_requests=args.warmup_requests,
        profile=args.profile,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_num_seqs=args.max_num_seqs,
        scheduling_enabled=True,
    )
    app = create_app(config)
    scheduler = config._scheduler
    assert scheduler is not None
    stamps: dict[str, dict[str, float]] = {}
    submit = scheduler.submit

    async def stamped_submit(req: Any) -> None:
        stamps[req.request_id] = {"created_s": req.created_at}
        await submit(req)

    def on_event(event: dict[str, Any]) -> None:
        if event.get("event") == "decode_token" and event.get("token_idx") == 1:
            stamps.setdefault(event["request_id"], {})["first_token_s"] = time.monotonic()

    scheduler.submit = stamped_submit
    scheduler.log_callback = on_event

    @app.get("/crosscheck/timings")
    async def timings() -> list[dict[str, float]]:
        return list(stamps.values())

    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["serve-xpyd"]:
        serve_xpyd(argv[1:])
        return 0
    parser = argparse.ArgumentParser(
        prog="python -m bench.probes.xsim_crosscheck", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--out", default=str(DEFAULT_OUT), help="summary JSON (committed)")
    parser.add_argument("--level", action="append", choices=sorted(LEVELS), help="default: all")
    args = parser.parse_args(argv)
    levels = {k: LEVELS[k] for k in (args.level or LEVELS)}
    summary = asyncio.run(crosscheck(Knobs(), levels))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(summary, indent=1) + "\n")
    print(render_table(summary))
    print(f"-> {args.out} (load average before {summary['machine_before']['loadavg']}, "
          f"after {summary['machine_after']['loadavg']}; pid {os.getpid()})")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
