"""Probes: checks and one-off studies beside the fleet benchmark, each its own command.

They answer a question about the benchmark's own footing rather than rank routing policies:
does a scenario load its fleet as designed (`engine_check`, modelsim's engines in virtual time;
`token_parity`, prompt tokens per tokenizer), does modelsim agree with an independent simulator
(`xsim_crosscheck`), does an outside load generator read the same gateway alike
(`outside_loadgen`, inference-perf), what the EPP believes next to each pod's true state
(`flow_probe`), does the gateway leak over a long run (`soak`, `make soak`), and how
disaggregated prefill/decode compares with aggregated serving on the same GPUs (`pd_sim`).
Run as `python -m bench.probes.<name>`.
"""
