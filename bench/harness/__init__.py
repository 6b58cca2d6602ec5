"""The fleet harness: what `python -m bench run` (and `bench serve`) runs to benchmark a routing policy.

A scenario file (`scenario`) names a simulated fleet and a seeded trace (`workloads`); `fleet`
brings the fleet up through modelsim, `targets` starts the policy under test in front of it
(our gateway and the Envoy baselines from `gateway_policies` and `baseline_envoy`, the flow
policies of `flow_policies`, the peer routers of `peers`, the `oracle`), `pinning` optionally
gives the router a CPU of its own, and `loadgen` replays the trace open-loop against it.
`stationarity` checks the offered load does not drift, `stats` reduces the per-request results
and `summary` writes the committed run summaries every figure of docs/benchmarks* comes from;
`serve` keeps one fleet and router up for another load generator.
"""
