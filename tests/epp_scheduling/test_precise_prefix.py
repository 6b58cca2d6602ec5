"""The precise-prefix-cache scorer: the pods' own KV events where complete, the approximate
prefix index per pod elsewhere."""

from __future__ import annotations

import dataclasses
import random

from epp.datalayer.kv_index import KVIndex
from epp.datalayer.prefix_index import PrefixIndex
from epp.scheduling.registry import SCORERS
from epp.scheduling.scorers import ScoringContext, precise_prefix_cache, prefix_cache
from epp.scheduling.ttft_prediction import predict_ttft, predicted_ttft
from epp.scheduling.weighted import WeightedScheduler
from gateway.profiles import profile
from modelsim.kv_events import block_stored
from modelsim.kvcache import chain_hashes
from tests.epp_scheduling.factories import req, snap, state

BS = 16


def _store(index: KVIndex, pod: str, tokens: list[int], adapter: str | None = None) -> None:
    """The BlockStored a vLLM-like engine (modelsim) publishes after prefilling ``tokens``."""
    n = len(tokens) // BS
    ev = block_stored(chain_hashes(tokens[: n * BS], BS, adapter or ""), None, tokens[: n * BS], BS, adapter)
    index.apply_stored(pod, ev["block_hashes"], None, ev["token_ids"], BS, ev["lora_name"])


def _index(*pods: str, precise: bool = True) -> KVIndex:
    index = KVIndex()
    for pod in pods:
        index.add_pod(pod, "m")
        index.set_precise(pod, precise)
    return index


TOKENS = list(range(1000, 1000 + 40 * BS))  # 40 blocks


def _request(tokens: list[int] = TOKENS, adapter: str | None = None):
    return dataclasses.replace(req("p" * 4000, adapter=adapter), token_ids=tuple(tokens))


def test_scores_leading_blocks_each_pod_reported() -> None:
    index = _index("a", "b", "c")
    _store(index, "a", TOKENS)  # all 40 blocks
    _store(index, "b", TOKENS[: 10 * BS] + [7] * (30 * BS))  # 10 leading blocks, then others
    pods = [state("a"), state("b"), state("c")]
    ctx = ScoringContext(kv_index=index)
    assert precise_prefix_cache(_request(), pods, ctx) == [1.0, 10 / 40, 0.0]
    # short prompts are divided by prefixMinBlocks (16), as prefix-cache does
    short = _request(TOKENS[: 4 * BS])
    assert precise_prefix_cache(short, pods, ctx) == [4 / 16, 4 / 16, 0.0]
    # an adapter's blocks are keyed apart from the base model's
    assert precise_prefix_cache(_request(adapter="sql"), pods, ctx) == [0.0, 0.0, 0.0]
    _store(index, "c", TOKENS, adapter="sql")
    assert precise_prefix_cache(_request(adapter="sql"), pods, ctx) == [0.0, 0.0, 1.0]


def test_removed_blocks_stop_scoring_where_the_approximate_index_still_would() -> None:
    index = _index("a")
    _store(index, "a", TOKENS)
    approx = PrefixIndex()
    request = _request()
    hashes = approx.hashes("m", request.prompt)
    approx.add("a", hashes)
    ctx = ScoringContext(kv_index=index, prefix_index=approx, prefix_hashes=hashes)
    assert precise_prefix_cache(request, [state("a")], ctx) == [1.0]
    engine_hashes = chain_hashes(TOKENS, BS)
    index.apply_removed("a", engine_hashes[20:21])  # the engine evicted block 20
    assert precise_prefix_cache(request, [state("a")], ctx) == [20 / 40]
    assert prefix_cache(request, [state("a")], ctx) == [1.0]  # routing history does not know


def test_falls_back_per_pod_to_the_approximate_score() -> None:
    index = _index("precise")
    index.add_pod("resyncing", "m")  # events, but the stream is not complete (precise False)
    index.add_pod("other-model", "n")
    index.set_precise("other-model", True)
    for pod in ("precise", "resyncing", "other-model"):
        _store(index, pod, TOKENS)
    approx = PrefixIndex()
    request = _request()
    hashes = approx.hashes("m", request.prompt)
    for pod in ("resyncing", "no-events", "other-model"):
        approx.add(pod, hashes[:10])
    pods = [state(a) for a in ("precise", "resyncing", "no-events", "other-model")]
    ctx = ScoringContext(kv_index=index, prefix_index=approx, prefix_hashes=hashes)
    fallback = prefix_cache(request, pods, ctx)
    assert fallback == [0.0, 10 / 62, 10 / 62, 10 / 62]
    assert precise_prefix_cache(request, pods, ctx) == [1.0, *fallback[1:]]
    assert index.not_precise_reason("precise", "m") is None
    assert "not complete" in (index.not_precise_reason("resyncing", "m") or "")
    assert "no KV events" in (index.not_precise_reason("no-events", "m") or "")
    assert "'n'" in (index.not_precise_reason("other-model", "m") or "")
    # no token ids (no tokenizer) or no index: the approximate score everywhere
    no_ids = dataclasses.replace(request, token_ids=None)
    assert precise_prefix_cache(no_ids, pods, ctx) == fallback
    assert precise_prefix_cache(request, pods, dataclasses.replace(ctx, kv_index=None)) == fallback


def test_block_size_comes_from_the_pods_events() -> None:
    index = _index("a")
    assert index.precise_block_size("a", "m") is None  # nothing stored yet: size unknown
    assert precise_prefix_cache(_request(), [state("a")], ScoringContext(kv_index=index)) == [0.0]
    tokens32 = TOKENS[: 20 * 32]
    ev = block_stored(chain_hashes(tokens32, 32), None, tokens32, 32, None)
    index.apply_stored("a", ev["block_hashes"], None, ev["token_ids"], 32, None)
    assert index.precise_block_size("a", "m") == 32
    assert precise_prefix_cache(_request(), [state("a")], ScoringContext(kv_index=index)) == [1.0]


def test_scheduler_tokenizes_only_for_profiles_that_read_tokens() -> None:
    assert SCORERS["precise-prefix-cache"].uses_tokens and SCORERS["precise-prefix-cache"].uses_prefix
    assert not SCORERS["prefix-cache"].uses_tokens
    index = _index("a", "b")
    _store(index, "b", TOKENS)
    precise = profile("precise", {"precise-prefix-cache": 3, "queue": 1})
    sched = WeightedScheduler(
        {"default": profile("default", {"queue": 1}), "precise": precise},
        rng=random.Random(0),
        kv_index=index,
    )
    assert not sched.wants_tokens(req())
    request = dataclasses.replace(_request(), objective="precise")
    assert sched.wants_tokens(request)
    decision = sched.pick(request, snap(state("a"), state("b")))
    assert decision.ranked[0] == "b"
    assert decision.scores["b"]["precise-prefix-cache"] == 1.0
    assert decision.scores["a"]["precise-prefix-cache"] == 0.0


def test_predicted_ttft_counts_the_blocks_a_pods_kv_events_report_as_held() -> None:
    """predicted-ttft reads the same matches: 30 of 40 blocks held leaves 160 of 640 tokens."""
    index = _index("a", "b")
    _store(index, "a", TOKENS[: 30 * BS])
    request = dataclasses.replace(_request(), prompt_tokens=len(TOKENS))
    pods = [dataclasses.replace(state(p, tpot=1e-4), prefill_tps=10_000.0) for p in ("a", "b")]
    assert predicted_ttft(request, pods, ScoringContext(kv_index=index)) == [1.0, 160 / 640]


def _store_host(index: KVIndex, pod: str, tokens: list[int]) -> None:
    """The same blocks reported in host memory (vLLM's CPU offload: medium "CPU")."""
    n = len(tokens) // BS
    ev = block_stored(chain_hashes(tokens[: n * BS], BS, ""), None, tokens[: n * BS], BS, None)
    index.apply_stored(pod, ev["block_hashes"], None, ev["token_ids"], BS, None, host=True)


def test_a_prefix_in_host_memory_is_loaded_back_not_recomputed() -> None:
    """Pod `a` offloaded the whole 640-token prefix to host memory (none of it on its GPU), `b`
    holds nothing. Both prefill at 10k tokens/s; `a` loads the 640 tokens back at a tenth of
    their prefill (6.4 ms against 64 ms). Fails when the host tier is not read."""
    index = _index("a", "b")
    _store_host(index, "a", TOKENS)
    assert index.lookup(TOKENS, "m") == {"a": 0}  # `b` stored nothing: no block size yet
    assert index.lookup_held(TOKENS, "m") == {"a": 40}
    request = dataclasses.replace(_request(), prompt_tokens=len(TOKENS))
    pods = [dataclasses.replace(state(p, tpot=1e-4), prefill_tps=10_000.0) for p in ("a", "b")]
    scores = predicted_ttft(request, pods, ScoringContext(kv_index=index))
    assert scores[0] == 1.0
    assert abs(scores[1] - 0.1) < 1e-9  # 64 ms on `b` against 6.4 on `a`


def test_a_prefix_on_the_gpu_is_not_counted_twice_for_its_host_copy() -> None:
    """30 blocks on the GPU and the same 30 plus 10 more in host memory: only the 10 beyond the
    GPU's are loaded back (160 tokens at a tenth: 16 ms-equivalent -> 16 tokens of prefill)."""
    index = _index("a")
    _store(index, "a", TOKENS[: 30 * BS])
    _store_host(index, "a", TOKENS)
    request = dataclasses.replace(_request(), prompt_tokens=len(TOKENS))
    pods = [dataclasses.replace(state("a", tpot=1e-9), prefill_tps=10_000.0)]
    (terms,) = predict_ttft(request, pods, ScoringContext(kv_index=index))
    assert terms is not None and abs(terms.prefill_work_s - 16 / 10_000.0) < 1e-12
