"""The policies of a virtual-time run: round-robin, the oracle, and the EPP (bench.vtime.epp).

- `round-robin`: Envoy's ROUND_ROBIN over every pod of the fleet (the baseline's STATIC
  cluster lists all of them, whatever model they serve), in turn.
- `oracle`: at each landing, every serving pod's `Pod.probe` (what /sim/probe answers:
  the engine's own `predict_ttft` over its exact queue, batch and prefix cache); the lowest
  predicted TTFT wins, ties by `bench.harness.oracle.best_probe` (smaller batch, then seeded random).
  The pick is queued on the engine before the next event, so no two requests see one state:
  the real-time oracle's herd (probes racing each other) cannot happen. It is greedy per
  request: it does not see what its pick costs the requests after it.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from bench.harness.oracle import Probe, best_probe
from bench.harness.workloads import TraceRequest
from bench.vtime.loop import Events, Routed
from bench.vtime.pods import SimPod
from modelsim.openai_api import ApiError, prompt_ids_of, resolve_model
from modelsim.tokenizer import ApproxTokenizer, PromptTokenizer


def _tokenizer_key(tokenizer: PromptTokenizer) -> object:
    """Pods whose tokenizers give the same ids share one tokenization: every pod has its own
    ApproxTokenizer object, and they agree when their vocabularies do."""
    if isinstance(tokenizer, ApproxTokenizer):
        return ("approx", tokenizer.vocab_size)
    return id(tokenizer)


class RoundRobin:
    name = "round-robin"

    def __init__(self, seed: int) -> None:
        self._seed = seed
        self._pods: Sequence[SimPod] = ()
        self._turn = 0

    def start(self, events: Events, pods: Sequence[SimPod]) -> None:
        self._pods = pods
        self._turn = random.Random(self._seed).randrange(len(pods))  # Envoy starts at a random host

    def route(self, index: int, req: TraceRequest, body: bytes) -> Routed:
        pod = self._pods[self._turn % len(self._pods)]
        self._turn += 1
        return Routed(pod)

    def config(self) -> dict[str, object]:
        return {"kind": "virtual", "lb_policy": "ROUND_ROBIN", "hosts": "every pod of the fleet"}


class Oracle:
    name = "oracle"

    def __init__(self, seed: int) -> None:
        self._rng = random.Random(seed)
        self._pods: Sequence[SimPod] = ()

    def start(self, events: Events, pods: Sequence[SimPod]) -> None:
        self._pods = pods

    def route(self, index: int, req: TraceRequest, body: bytes) -> Routed:
        probes: list[Probe] = []
        by_address: dict[str, SimPod] = {}
        ids_by_tokenizer: dict[object, list[int]] = {}
        hashes: dict[tuple[object, int, str | None], list[int]] = {}  # one hashing per block size
        kind = "chat" if "messages" in req.body else "completion"
        for pod in self._pods:
            c = pod.pod.config
            try:
                _, adapter = resolve_model(req.body, c.model, c.adapters)
                key = _tokenizer_key(pod.pod.tokenizer)
                ids = ids_by_tokenizer.get(key)
                if ids is None:
                    ids = ids_by_tokenizer[key] = prompt_ids_of(req.body, kind, pod.pod.tokenizer)
            except ApiError:
                continue  # not this pod's model: not a candidate (as /sim/probe-fleet skips it)
            engine = pod.pod.engine
            key_h = (key, engine.block_size, adapter)
            prefix = hashes.get(key_h)
            if prefix is None:
                prefix = hashes[key_h] = engine.prefix_hashes(ids, adapter)
            probe = pod.pod.probe(ids, adapter, prefix)
            probes.append(Probe(pod.address, probe["predicted_ttft_s"], probe["running"]))
            by_address[pod.address] = pod
        best = best_probe(probes, self._rng)
        if best is None:
            return Routed(None, 404, f"no pod serves model {req.body.get('model')!r}")
        return Routed(by_address[best.address])

    def config(self) -> dict[str, object]:
        return {
            "kind": "virtual",
            "picker": "lowest Pod.probe predicted_ttft_s over the serving pods (ties: smaller batch, then random)",
            "state": "exact engine state at the landing instant; the pick is queued before the next event",
        }
