"""The chaos soak's traffic (bench/probes/chaos_soak.py): a seeded mix of OpenAI chat (plain and
streamed), Anthropic messages (plain and streamed), long bodies and clients that abandon a
stream after its first lines, each request recorded with its wall-clock interval and outcome so
that every failure can be held against the fault windows."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx

# kind -> share of the arrivals
MIX = {
    "chat": 0.35,
    "chat_stream": 0.2,
    "messages": 0.15,
    "messages_stream": 0.1,
    "long_body": 0.1,
    "abandon": 0.1,
}
LONG_BODY_CHARS = 24_000  # ~6,000 tokens: well inside the models' context, far over a typical prompt
ABANDON_AFTER_LINES = 3
OK, ABANDONED = "ok", "abandoned"


@dataclass(frozen=True, slots=True)
class Outcome:
    kind: str
    start: float  # time.monotonic()
    end: float
    result: str  # "ok", "abandoned", "http_<status>", "cut" (a stream without its end), "exc_<Name>"

    @property
    def failed(self) -> bool:
        return self.result not in (OK, ABANDONED)


def _body(kind: str, model: str, rng: random.Random) -> tuple[str, dict[str, Any]]:
    tokens = rng.randint(4, 48)
    text = f"soak {rng.random():.6f} " + ("context " * (LONG_BODY_CHARS // 8) if kind == "long_body" else "")
    if kind.startswith("messages"):
        body: dict[str, Any] = {
            "model": model,
            "max_tokens": tokens,
            "messages": [{"role": "user", "content": text}],
        }
        path = "/v1/messages"
    else:
        body = {"model": model, "max_tokens": tokens, "messages": [{"role": "user", "content": text}]}
        path = "/v1/chat/completions"
    if kind.endswith("stream") or kind == "abandon":
        body["stream"] = True
    if kind == "abandon":
        body["max_tokens"] = 400  # long enough to be mid-answer when the client leaves
    return path, body


async def one_request(client: httpx.AsyncClient, kind: str, model: str, rng: random.Random) -> Outcome:
    path, body = _body(kind, model, rng)
    start = time.monotonic()
    result = OK
    try:
        if not body.get("stream"):
            r = await client.post(path, json=body)
            result = OK if r.status_code == 200 else f"http_{r.status_code}"
        else:
            async with client.stream("POST", path, json=body) as r:
                if r.status_code != 200:
                    await r.aread()
                    result = f"http_{r.status_code}"
                else:
                    result = await _read_stream(r, kind)
    except httpx.HTTPError as exc:
        result = f"exc_{type(exc).__name__}"
    return Outcome(kind, start, time.monotonic(), result)


async def _read_stream(r: httpx.Response, kind: str) -> str:
    lines = 0
    async for line in r.aiter_lines():
        lines += line.startswith("data:")
        if kind == "abandon" and lines >= ABANDON_AFTER_LINES:
            return ABANDONED  # leaving the block closes the connection mid-answer
        if line in ("data: [DONE]", "event: message_stop"):
            return OK
    return "cut"


def pick_kind(rng: random.Random) -> str:
    return rng.choices(list(MIX), weights=list(MIX.values()))[0]


async def drive(
    client: httpx.AsyncClient,
    models: list[str],
    seconds: float,
    rps: float,
    seed: int,
    max_outstanding: int,
    record: Callable[[Outcome], None],
) -> int:
    """Poisson-free steady arrivals at `rps` for `seconds`; an arrival that finds
    `max_outstanding` requests open is shed by the client (counted, returned), so a loaded
    machine lowers the achieved rate instead of queueing in the driver."""
    rng = random.Random(seed)
    tasks: set[asyncio.Task[None]] = set()
    shed = sent = 0
    start = time.monotonic()

    async def run(kind: str, model: str, req_rng: random.Random) -> None:
        record(await one_request(client, kind, model, req_rng))

    while (now := time.monotonic()) - start < seconds:
        while sent < int((now - start) * rps):
            sent += 1
            if len(tasks) >= max_outstanding:
                shed += 1
                continue
            task = asyncio.create_task(run(pick_kind(rng), rng.choice(models), random.Random(rng.random())))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        await asyncio.sleep(0.01)
    if tasks:
        await asyncio.gather(*tasks)
    return shed
