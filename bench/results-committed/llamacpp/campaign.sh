#!/bin/sh
# The real-engine campaign of docs/benchmarks/llamacpp.md (issue #41), as it ran: quick mode,
# reporting seeds 1-3, the four policies on the llama-server fleet and on its modelsim twin
# (--fleet-tokenizer: the twin's pods count the engine's tokens). Needs `make llama-server` and
# the `bench` extra (sglang-router, vllm-router). It ran as a whole under the development machine's
# shared CPU lock; summaries land in bench/results-committed/llamacpp/summaries.
set -e
POLICIES="--policy round-robin --policy epp-default --policy sglang-cache_aware --policy vllm-cache_aware"
OUT="--summaries bench/results-committed/llamacpp/summaries --no-progress"
for seed in 1 2 3; do
  for scenario in llama-sessions llama-sessions-hetero; do
    python -m bench run --scenario bench/scenarios/$scenario.yaml $POLICIES --seed $seed $OUT
    python -m bench run --scenario bench/scenarios/$scenario-sim.yaml $POLICIES --seed $seed --fleet-tokenizer $OUT
  done
done
