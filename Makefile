# The verbs a user types. Each is documented in README.md.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
PYTEST_ARGS ?=

.PHONY: setup test lint

## setup: create .venv with torch, sglang (no-deps + light imports), dev tools, kdtree packages
setup: $(VENV)/.setup-done
$(VENV)/.setup-done: scripts/setup_venv.sh requirements/*.txt kernel/pyproject.toml services/inference/pyproject.toml services/parity/pyproject.toml
	VENV=$(VENV) scripts/setup_venv.sh

## lint: ruff over the whole tree
lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

## test: lint, then every CPU test (GPU tests in tests/gpu skip without CUDA)
test: lint
	$(PY) -m pytest $(PYTEST_ARGS)
