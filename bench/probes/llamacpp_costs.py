"""What one llama-server costs per token, measured, and the modelsim step-time settings that match.

The real-engine benchmark (docs/benchmarks/llamacpp.md) compares each llama.cpp scenario with
a modelsim twin; this probe is where the twin's numbers come from. It starts one llama-server
(`--threads N`, the benchmark's slots and context) on the tiny model, sends requests one or two
at a time and reads the engine's own `timings` (prompt_ms / prompt_n, predicted_per_token_ms):

- prefill: uncached prompts of several lengths (fresh text each time), ms per prompt token;
- decode at batch 1, after a short and after a long prompt: ms per output token;
- decode at batch 2: two requests generating together, ms per output token of each;
- a prompt answered from the slot's cache: the fixed cost of a step.

It prints the measurements and the modelsim overrides as JSON: `c_p_ms_per_token` = the prefill
cost per token at the scenario's typical prompt length (`--typical-prompt`: it grows with the
length, attention being quadratic), `w_ms` = one batch-1 decode step after a short prompt,
`k_kv_ms_per_1k` = its growth with context, `t0_ms` 0 (a step's fixed cost is inside those):
`python -m bench.probes.llamacpp_costs --threads 1 [--typical-prompt 1500] [--out FILE]`.
Batch-2 decode is measured too: modelsim's roofline charges a decode step once for the batch,
where on one CPU thread each sequence costs about a batch-1 step (docs/benchmarks/llamacpp.md).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import tempfile
from pathlib import Path
from typing import Any

import httpx

from devstack.llamacpp.model import MODEL_NAME
from devstack.llamacpp.server import ServerSpec, engine_version, missing_engine, start_llama_servers
from modelsim.pseudo_text import TextSource

PROMPT_TOKENS = (250, 1000, 1500, 2000)
REPEATS = 3
DECODE_TOKENS = 96


async def _ask(client: httpx.AsyncClient, prompt: str, max_tokens: int) -> dict[str, Any]:
    body = {
        "model": MODEL_NAME,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "ignore_eos": True,
    }
    reply = await client.post("/v1/chat/completions", json=body)
    reply.raise_for_status()
    timings: dict[str, Any] = reply.json()["timings"]
    return timings


async def measure(base_url: str, seed: int = 0) -> dict[str, Any]:
    """The engine's own timings for the cases of the module docstring (medians of REPEATS)."""
    rng, text = random.Random(seed), TextSource(seed)
    out: dict[str, Any] = {"prefill_ms_per_token": {}, "prompt_tokens": {}}
    async with httpx.AsyncClient(base_url=base_url, timeout=120) as client:
        await _ask(client, text.text(50, rng), 4)  # warm-up
        for n in PROMPT_TOKENS:
            runs = [await _ask(client, text.text(n, rng), 1) for _ in range(REPEATS)]
            out["prefill_ms_per_token"][n] = statistics.median(r["prompt_ms"] / r["prompt_n"] for r in runs)
            out["prompt_tokens"][n] = statistics.median(r["prompt_n"] for r in runs)
        short, long_ = text.text(50, rng), text.text(PROMPT_TOKENS[-1], rng)
        decode: dict[str, float] = {}
        for name, prompt in (("short", short), ("long", long_)):
            runs = [await _ask(client, prompt, DECODE_TOKENS) for _ in range(REPEATS)]
            decode[name] = statistics.median(r["predicted_per_token_ms"] for r in runs)
            if name == "long":  # the same prompt again: all but one token from the slot's cache
                out["cached_prompt"] = {"cache_n": runs[-1]["cache_n"], "prompt_ms": runs[-1]["prompt_ms"]}
        pairs = []
        for _ in range(REPEATS):
            a, b = await asyncio.gather(
                _ask(client, text.text(50, rng), DECODE_TOKENS),
                _ask(client, text.text(50, rng), DECODE_TOKENS),
            )
            pairs.append((a["predicted_per_token_ms"] + b["predicted_per_token_ms"]) / 2)
        decode["batch2_short"] = statistics.median(pairs)
        out["decode_ms_per_token"] = decode
    return out


def modelsim_overrides(m: dict[str, Any], typical_prompt: int) -> dict[str, float]:
    """The roofline step model (modelsim/profiles.py) fitted to the measurements: decode steps are
    memory-bound there (w + k_kv x context), prefill compute-bound (c_p x tokens)."""
    prefill = m["prefill_ms_per_token"]
    decode = m["decode_ms_per_token"]
    long_tokens = float(m["prompt_tokens"][PROMPT_TOKENS[-1]])
    nearest = min(prefill, key=lambda n: abs(n - typical_prompt))
    return {
        "t0_ms": 0.0,
        "w_ms": round(decode["short"], 3),
        "k_kv_ms_per_1k": round(max(decode["long"] - decode["short"], 0.0) / (long_tokens / 1000), 4),
        "c_p_ms_per_token": round(prefill[nearest], 4),
    }


async def _main(args: argparse.Namespace) -> int:
    why = missing_engine()
    if why:
        print(why)
        return 2
    spec = ServerSpec(threads=args.threads, parallel=args.parallel, ctx_per_slot=args.ctx_per_slot)
    with tempfile.TemporaryDirectory(prefix="llama-costs-") as tmp:
        procs, pods = await asyncio.to_thread(start_llama_servers, Path(tmp), [spec])
        try:
            measured = await measure(f"http://{pods[0]['address']}")
        finally:
            for proc in procs.values():
                proc.stop()
    result = {
        "engine": engine_version(),
        "server": {"threads": spec.threads, "parallel": spec.parallel, "ctx_per_slot": spec.ctx_per_slot},
        "measured": measured,
        "typical_prompt_tokens": args.typical_prompt,
        "modelsim_overrides": modelsim_overrides(measured, args.typical_prompt),
    }
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        await asyncio.to_thread(Path(args.out).write_text, text + "\n")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--parallel", type=int, default=2)
    parser.add_argument("--ctx-per-slot", type=int, default=4096)
    parser.add_argument("--typical-prompt", type=int, default=1500, help="prompt tokens c_p is taken at")
    parser.add_argument("--out", help="also write the JSON here")
    return asyncio.run(_main(parser.parse_args()))


if __name__ == "__main__":
    raise SystemExit(main())
