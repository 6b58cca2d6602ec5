# Everything runs from a project-local virtual environment that the targets create or refresh.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: run test lint proto bench bench-full soak clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev,bench]'
	touch $(STAMP)

venv: $(STAMP)

run: $(STAMP)
	PATH=$(CURDIR)/$(BIN):$$PATH $(BIN)/python -m gateway.run $(ARGS)

test: $(STAMP)
	PATH=$(CURDIR)/$(BIN):$$PATH $(BIN)/python -m pytest -n 2 -q $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

proto: $(STAMP)
	$(BIN)/python -m grpc_tools.protoc -Iproto --python_out=gateway/api --grpc_python_out=gateway/api --pyi_out=gateway/api proto/gateway/v1/*.proto

soak: $(STAMP)
	PATH=$(CURDIR)/$(BIN):$$PATH $(BIN)/python -m bench.soak --minutes $(or $(MINUTES),30) $(ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache build *.egg-info
