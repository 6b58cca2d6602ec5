"""Microbenchmarks: what one piece of the gateway or of the harness costs, measured on its own.

Each module is its own command (`python -m bench.micro.<name>`) and measures one cost against
stubs rather than a simulated fleet: the load generator's own overhead (`overhead`, also
`python -m bench overhead`), the proxy path (`overhead_gateway`, `replicas_bench`), scraping
(`scrape_bench`, `parse_metrics_bench`, over the realistic pages of `metric_pages` served by
`metrics_stub`), scheduling decisions (`scheduler_bench`, `decision_instructions` under
valgrind), shared state over Redis (`shared_state_bench`), KV events (`kv_events_bench`),
tracing (`tracing_bench`), the simulator's metric pages (`sim_page_bench`) and BBR's stream
leak (`grpc_cancel_leak`). `stub_server` is the trivial streaming pod several of them (and the
tests) run against; `smoke` (`make bench-smoke`) guards two of the figures against regressions.
Their results go to docs/benchmarks/costs.md and the pages that cite them, not to the summaries.
"""
