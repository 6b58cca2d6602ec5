"""`make check-engines`: the engines' own released code against the gateway's reading of it.

Optional (not part of `make test`): it installs the vllm and sglang wheels without their
dependencies into their own environment (.venv-engines) and

- runs vLLM's own `ZmqEventPublisher` and event classes (vllm/distributed/kv_events.py)
  against a live EPP's KV-event subscriber (kv_events.py here);
- reads the metric names and label sets the dialects of epp/datalayer/metric_dialects.py rely on from the
  engines' own metric definitions (vLLM, SGLang: their installed source, as AST; TensorRT-LLM:
  its source as read, cited) and parses a page of exactly those series with the EPP's parser
  (metric_sources.py).

`python -m devstack.engine_check --engines-venv .venv-engines --out docs/engine-check.md`
writes the report; the exit status is 1 when any check fails.
"""
