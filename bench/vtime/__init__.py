"""Routing quality in virtual time: the EPP's own code against modelsim's engines, no sleeps.

A discrete-event loop (`bench.vtime.loop`) steps one `modelsim.engine.Engine` per pod (inside
the simulator's own `Pod`, so pages, probes and request validation are the server's code) and
asks a router for every arrival: round-robin, the EPP as built by `epp.app.EppApp` (pool,
scraper, scheduler, processor; fed the pods' rendered metric pages at its scrape cadence), or
an oracle reading the engines' exact state. One clock serves engines and EPP. Runs are
summarised in the real-time runs' schema (bench/harness/summary.py), marked virtual, under
bench/summaries-virtual/; `python -m bench sim` runs them, `python -m bench sim-report`
renders docs/benchmarks/virtual-time.md.
"""
