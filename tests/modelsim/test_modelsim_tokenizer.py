"""The real tokenizer path end to end: modelsim tokenizes with the shipped tokenizer files and
publishes KV events for those ids; the EPP tokenizes the same conversation with the same
files (through its piece cache), finds the blocks in its precise index, and routes a
growing conversation by them, falling back per pod where a pod has no event stream."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
import yaml

from epp.app import EppApp
from epp.datalayer.tokenizer import load_tokenizer
from epp.requestcontrol.processor import EppProcessor
from extproc.headers import DESTINATION_HEADER
from extproc.stream import RequestRoute
from modelsim.build_tokenizer import OUT as SHIPPED
from modelsim.fleet import Fleet, FleetSpec, SpecError, run_fleet
from tests.waiting import until

KV = {
    "enable_kv_cache_events": True,
    "publisher": "zmq",
    "endpoint": "tcp://127.0.0.1:0",
    "replay_endpoint": "tcp://127.0.0.1:0",
}
BS = 16  # modelsim's default KV block size
DOC = (Path(__file__).resolve().parents[2] / "docs" / "architecture.md").read_text()
TURN1 = [
    {"role": "system", "content": "You are the routing assistant. " + DOC[:1500]},
    {"role": "user", "content": "Which pod holds my prefix?"},
]


@pytest.fixture
async def fleet() -> AsyncIterator[Fleet]:
    spec = FleetSpec.from_dict(
        {
            "time_scale": 50.0,
            "pods": [
                {"name": "a", "model": "llama", "tokenizer": "sim-llama3-12k", "kv_events": KV},
                {
                    "name": "b",
                    "model": "llama",
                    "tokenizer": str(SHIPPED),
                    "kv_events": {**KV},
                },
                {"name": "c", "model": "llama", "tokenizer": "sim-llama3-12k"},  # no events
            ],
        }
    )
    async with run_fleet(spec) as f:
        yield f


def test_fleet_spec_tokenizer_errors(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="tokenizer"):
        FleetSpec.from_dict({"pods": [{"model": "m", "tokenizer": str(tmp_path)}]})
    with pytest.raises(SpecError, match="'tokenizer' must be"):
        FleetSpec.from_dict({"pods": [{"model": "m", "tokenizer": 5}]})
    spec = FleetSpec.from_dict({"pods": [{"model": "m", "tokenizer": "sim-llama3-12k"}]})
    assert spec.pod_config(spec.pods[0]).profile.vocab_size == 12288  # ids stay in the vocabulary


async def _chat(client: httpx.AsyncClient, messages: list[dict]) -> str:
    r = await client.post(
        "/v1/chat/completions", json={"model": "llama", "messages": messages, "max_tokens": 8}
    )
    r.raise_for_status()
    return r.json()["choices"][0]["message"]["content"]


async def _route(app: EppApp, messages: list[dict], proc: EppProcessor | None = None) -> str:
    """The pod the EPP picks for this chat request (its in-flight slot returned at once)."""
    proc = proc or EppProcessor(app.ctx)
    body = json.dumps({"model": "llama", "messages": messages, "max_tokens": 8}).encode()
    route = await proc.on_request({"x-gateway-model-name": "llama"}, body)
    assert isinstance(route, RequestRoute)
    proc.on_close(completed=True)
    return route.set_headers[DESTINATION_HEADER].split(",")[0]


async def test_epp_finds_modelsim_blocks_by_its_own_tokenization(fleet: Fleet, tmp_path: Path) -> None:
    a, b, c = fleet.pod("a"), fleet.pod("b"), fleet.pod("c")
    config = {
        "defaultProfile": "precise",
        "profiles": {"precise": {"weights": {"precise-prefix-cache": 10, "queue": 1}}},
        "pools": [
            {
                "name": "p",
                "models": [{"name": "llama", "tokenizer": str(SHIPPED)}],
                "endpoints": [
                    {"address": p.address, "kvEventsPort": p.kv_events_port, "kvReplayPort": p.kv_replay_port}
                    for p in (a, b)
                ]
                + [{"address": c.address}],
                "kvEvents": {},
            }
        ],
    }
    (tmp_path / "gw.yaml").write_text(yaml.safe_dump(config))
    app = EppApp(tmp_path / "gw.yaml", "p")
    await app.start()
    tok = load_tokenizer(SHIPPED)
    try:
        await until(lambda: len([e for e in app.pool.snapshot().endpoints if e.metrics]) == 3, "scraped")
        # turn 1, tokenized by the EPP as for any request, served by pod a (sent there directly:
        # routing it through the EPP would also teach the approximate index, which c falls back to)
        first, other = a, b
        ids = tok.encode_chat(TURN1)
        assert await app.tokenizers.token_ids("llama", {"messages": TURN1}) == tuple(ids)
        async with httpx.AsyncClient(base_url=first.url, timeout=10) as client:
            r = await client.post("/tokenize", json={"model": "llama", "messages": TURN1})
            assert r.json()["tokens"] == ids  # the engine's ids are the EPP's
            answer = await _chat(client, TURN1)
        async with httpx.AsyncClient(base_url=other.url, timeout=10) as client:  # another conversation
            await _chat(client, [{"role": "user", "content": DOC[3000:4500]}])
        full = len(ids) // BS
        assert full >= 20
        # the EPP keys the engine's BlockStored events from their token ids; its own
        # tokenization of the same conversation finds every full prompt block on that pod
        await until(lambda: app.kv_index.lookup(ids, "llama").get(first.address, 0) >= full, "turn 1 indexed")
        await until(lambda: app.kv_index.precise_block_size(other.address, "llama") == BS, "other indexed")
        assert app.kv_index.lookup(ids, "llama").get(other.address, 0) == 0

        # turn 2 grows the conversation: the EPP tokenizes only the new messages and routes
        # to the pod holding turn 1's blocks
        turn2 = [*TURN1, {"role": "assistant", "content": answer}, {"role": "user", "content": "And now?"}]
        cached = app.tokenizers.get("llama")
        assert cached is not None
        misses = cached.misses
        proc = EppProcessor(app.ctx)
        assert await _route(app, turn2, proc) == first.address
        assert cached.misses - misses == 2  # the assistant's answer and the new question
        assert proc._decision is not None
        scores = proc._decision.scores
        turn2_blocks = len(tok.encode_full(tok.render_chat(turn2))) // BS
        assert scores[first.address]["precise-prefix-cache"] == pytest.approx(full / turn2_blocks)
        assert scores[other.address]["precise-prefix-cache"] == 0.0

        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{app.metrics_port}", timeout=10) as admin:
            debug = (await admin.get("/debug/pool")).json()
        modes = debug["prefix_scoring"]
        assert modes[a.address] == modes[b.address] == {"llama": "precise"}
        assert modes[c.address]["llama"].startswith("approximate: no KV events")
        assert debug["tokenizers"]["models"]["llama"]["loaded"]
        assert debug["tokenizers"]["models"]["llama"]["cache_hits"] > 0
    finally:
        await app.stop()
