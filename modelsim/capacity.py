"""How many pods and requests per second one fleet process serves while timing stays accurate.

Starts ``python -m modelsim fleet`` in a child process (so the load generator does not share its
CPU), sends Poisson-arriving streaming chat requests round-robin over the pods, and compares the
latencies the client observes (wall x time_scale) with the engine's own simulated TTFT and
inter-token latency. When the process keeps up they agree; the gap is the simulator's error.

    python -m modelsim capacity --pods 1 4 16 --rates 20 60 120 --duration 6
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp

PROMPT_WORDS = 180  # ~250 tokens with the simulator's tokeniser
MAX_TOKENS = 64


@dataclass
class Observed:
    ttft_s: float
    tpot_s: float | None


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _one(session: aiohttp.ClientSession, url: str, prompt: str, scale: float) -> Observed | None:
    body = {"model": "llama", "messages": [{"role": "user", "content": prompt}], "max_tokens": MAX_TOKENS,
            "stream": True}  # fmt: skip
    t0 = time.perf_counter()
    first = last = None
    n = 0
    async with session.post(url + "/v1/chat/completions", json=body) as resp:
        if resp.status != 200:
            return None
        async for line in resp.content:
            if not line.startswith(b"data: {") or b'"content":"' not in line or b'"content":""' in line:
                continue
            now = time.perf_counter()
            first = first or now
            last = now
            n += 1
    if first is None or last is None:
        return None
    tpot = (last - first) / (n - 1) * scale if n > 1 else None
    return Observed((first - t0) * scale, tpot)


async def _state(session: aiohttp.ClientSession, urls: list[str]) -> list[dict]:
    out = []
    for u in urls:
        async with session.get(u + "/sim/state") as r:
            out.append(await r.json())
    return out


async def measure(pods: int, rate: float, duration: float, scale: float) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        spec, ready = Path(tmp) / "fleet.yaml", Path(tmp) / "ready.json"
        spec.write_text(
            json.dumps({"time_scale": scale, "pods": [{"name": "p", "model": "llama", "replicas": pods}]})
        )
        cmd = [sys.executable, "-m", "modelsim", "fleet", "--spec", str(spec), "--ready-file", str(ready)]
        proc = await asyncio.create_subprocess_exec(
            *cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        try:
            deadline = time.monotonic() + 30
            while not ready.exists():
                if proc.returncode is not None or time.monotonic() > deadline:
                    raise RuntimeError("fleet did not start")
                await asyncio.sleep(0.05)
            urls = ["http://" + p["address"] for p in json.loads(ready.read_text())["pods"]]
            return await _drive(proc.pid, urls, rate, duration, scale)
        finally:
            if proc.returncode is None:
                proc.terminate()
                try:
                    await asyncio.wait_for(proc.wait(), 10)
                except TimeoutError:
                    proc.kill()
                    await proc.wait()


async def _drive(pid: int, urls: list[str], rate: float, duration: float, scale: float) -> dict:
    rng = random.Random(7)
    words = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "theta", "kappa", "lambda", "sigma"]
    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=120)) as session:
        before = await _state(session, urls)
        cpu0, t0 = _cpu_seconds(pid), time.perf_counter()
        tasks = []
        i = 0
        while time.perf_counter() - t0 < duration:
            prompt = " ".join(rng.choice(words) for _ in range(PROMPT_WORDS))
            tasks.append(asyncio.create_task(_one(session, urls[i % len(urls)], prompt, scale)))
            i += 1
            await asyncio.sleep(rng.expovariate(rate))
        results = await asyncio.gather(*tasks, return_exceptions=True)
        elapsed = time.perf_counter() - t0
        cpu = (_cpu_seconds(pid) - cpu0) / elapsed
        after = await _state(session, urls)
    ok = [r for r in results if isinstance(r, Observed)]

    def delta(key: str) -> float:
        return sum(a[key] - b[key] for a, b in zip(after, before, strict=True))

    sim_ttft = delta("ttft_sum_s") / max(1.0, delta("ttft_count"))
    sim_itl = delta("itl_sum_s") / max(1.0, delta("itl_count"))
    obs_ttft = statistics.fmean(r.ttft_s for r in ok) if ok else float("nan")
    tpots = [r.tpot_s for r in ok if r.tpot_s is not None]
    obs_tpot = statistics.fmean(tpots) if tpots else float("nan")
    return {
        "pods": len(urls),
        "rate": rate,
        "sent": len(tasks),
        "ok": len(ok),
        "tokens_per_s_wall": delta("generation_tokens") / elapsed,
        "fleet_cpu": cpu,
        "sim_ttft_ms": sim_ttft * 1000,
        "obs_ttft_ms": obs_ttft * 1000,
        "sim_tpot_ms": sim_itl * 1000,
        "obs_tpot_ms": obs_tpot * 1000,
        "tpot_err_pct": (obs_tpot / sim_itl - 1) * 100 if sim_itl else float("nan"),
        "mean_lag_ms": delta("lag_sum_wall_s") / max(1.0, delta("steps")) * 1000,
        "max_lag_ms": max(a["max_lag_wall_s"] for a in after) * 1000,
    }


async def run_capacity(pods: list[int], rates: list[float], duration: float, scale: float) -> int:
    cols = ("pods", "rate", "sent", "ok", "tokens_per_s_wall", "fleet_cpu", "sim_ttft_ms", "obs_ttft_ms",
            "sim_tpot_ms", "obs_tpot_ms", "tpot_err_pct", "mean_lag_ms", "max_lag_ms")  # fmt: skip
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for n in pods:
        for r in rates:
            row = await measure(n, r, duration, scale)
            print(
                "| "
                + " | ".join(f"{row[c]:.3g}" if isinstance(row[c], float) else str(row[c]) for c in cols)
                + " |"
            )
            sys.stdout.flush()
    return 0
