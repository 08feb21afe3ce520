# The verbs a user types. Each is documented in README.md.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
PYTEST_ARGS ?=
# The GPU architectures the kernel is built for: the one list, kernel/kdtree_verify/cuda_archs.txt
# (KDTREE_CUDA_ARCHS overrides it). make hands it to every build: the images' KDTREE_CUDA_ARCHS
# build argument (through compose's environment and promote's --build-arg) and `make sass`;
# `make kernel`'s build reads the same file.
CUDA_ARCHS := $(strip $(or $(KDTREE_CUDA_ARCHS),$(file <kernel/kdtree_verify/cuda_archs.txt)))

.PHONY: help setup test lint config-table

## help: list the make targets
help:
	@grep -E '^## ' $(MAKEFILE_LIST) | sed 's/^## /  /'

## setup: create .venv with torch, sglang (no-deps + light imports), dev tools, kdtree packages
setup: $(VENV)/.setup-done
$(VENV)/.setup-done: scripts/setup_venv.sh requirements/*.txt lib/settings/pyproject.toml kernel/pyproject.toml services/inference/pyproject.toml services/parity/pyproject.toml bench/pyproject.toml
	VENV=$(VENV) scripts/setup_venv.sh

## lint: every static check of .pre-commit-config.yaml over the tree (ruff, clang-format, shellcheck, hadolint, the compose and workflow schemas, actionlint)
lint: setup
	PATH="$(abspath $(VENV))/bin:$$PATH" $(VENV)/bin/pre-commit run --all-files --show-diff-on-failure

## config-table: regenerate the configuration tables (README.md, docs/parity.md) from the models' field descriptions
config-table: setup
	$(PY) scripts/config_table.py

## test: lint, then every CPU test (GPU tests in tests/gpu skip without CUDA)
test: lint
	$(PY) -m pytest $(PYTEST_ARGS)

# ---- embedded reference engine (docs/engine.md)
DEMO_ARGS ?=

.PHONY: demo margins

## demo: start a baseline (KDTREE_VERIFY=off) and a candidate (on) engine on loopback, compare them token by token
demo: setup
	$(PY) -m kdtree_inference.engine.demo $(DEMO_ARGS)

## margins: print the reference model's greedy top-1/top-2 logit margin distribution
margins: setup
	$(PY) -m kdtree_inference.engine.margins

# ---- containers and promotion (docs/operations.md). Docker with the compose plugin and the
# NVIDIA Container Toolkit on a GPU host (the demo profile needs neither GPU nor toolkit);
# promotion runs from the venv (`make setup`), where kdtree-parity and its pydantic are installed.
COMPOSE ?= docker compose
PROMOTE := KDTREE_CUDA_ARCHS="$(CUDA_ARCHS)" $(PY) -m kdtree_parity.promote
PROMOTE_ARGS ?=
REPORTS_DIR ?= $(or $(KDTREE_REPORTS_DIR),$(CURDIR)/runs/reports)
# The sidecar writes reports into REPORTS_DIR as the invoking user.
GATE_ENV = KDTREE_REPORTS_DIR=$(REPORTS_DIR) KDTREE_PARITY_USER=$$(id -u):$$(id -g) $(BUILD_ENV)
# What compose passes to the images it builds.
BUILD_ENV = KDTREE_CUDA_ARCHS="$(CUDA_ARCHS)"

.PHONY: up down serve promote rollback demo-up

## demo-up: the demo profile in Docker (CPU, no GPU): two reference engines, the sidecar once; report in REPORTS_DIR/demo, exit = verdict
demo-up:
	mkdir -p $(REPORTS_DIR)
	$(GATE_ENV) $(COMPOSE) --profile demo up --exit-code-from demo-parity

## up: build and start the gate in Docker: baseline (KDTREE_VERIFY=off), candidate (on), parity run
up:
	mkdir -p $(REPORTS_DIR)
	$(GATE_ENV) $(COMPOSE) up --build --detach
	@echo "gate running: 'docker compose logs -f parity'; report in $(REPORTS_DIR)/latest"

## down: stop and remove every kdtree container (gate, serve and demo profiles)
down:
	$(COMPOSE) --profile gate --profile serve --profile demo down --remove-orphans

## serve: build kdtree/inference:latest, start one SGLang server in Docker (KDTREE_VERIFY=on)
serve:
	$(BUILD_ENV) $(COMPOSE) build inference-candidate
	$(COMPOSE) --profile serve up --detach

## promote: build the candidate (tag = git revision), gate it, tag `stable` and record only on a pass
promote:
	$(PROMOTE) promote $(PROMOTE_ARGS)

## rollback: point `stable` back at the previously promoted digest (from promotions/) and record it
rollback:
	$(PROMOTE) rollback $(PROMOTE_ARGS)

# ---- parity sidecar (docs/parity.md). Targets, corpus, policy and output come
# from KDTREE_PARITY_* (see the Configuration table); PARITY_ARGS adds or overrides flags.
PARITY_ARGS ?=

.PHONY: parity

## parity: one sidecar run against a running baseline/candidate pair (URLs from KDTREE_PARITY_*_URL); exit 0 pass, 1 fail, 2 undecided
parity: setup
	$(VENV)/bin/kdtree-parity run $(PARITY_ARGS)

# ---- the CUDA kernel (docs/kernel.md). Archs: CUDA_ARCHS above; the build goes to
# KDTREE_BUILD_DIR (default kernel/build/torch<version>).
BENCH_OUT ?= bench/results/local.json

.PHONY: kernel ptxas sass bench

## kernel: build the CUDA extension for KDTREE_CUDA_ARCHS (needs nvcc; KDTREE_BUILD_WITHOUT_GPU=1 where there is no GPU)
kernel: setup
	$(PY) -m kdtree_verify._build

## ptxas: compile the kernel for each arch with ptxas -v, check spills/smem, refresh bench/results/ptxas_summary.json
ptxas: setup
	$(PY) -m kdtree_verify._ptxas --out bench/results/ptxas_summary.json

## sass: instruction mix of the attention kernel's main loop per arch (no GPU needed)
sass: setup
	$(PY) -m kdtree_verify._sass --archs "$(CUDA_ARCHS)"

## bench: kernel benchmark on the local GPU vs SGLang's Triton kernels (writes BENCH_OUT; see bench/README.md)
bench: setup
	$(PY) -m kdtree_bench.kernel.kernel_bench --out $(BENCH_OUT)

# ---- the SGLang backend (docs/sglang.md).
.PHONY: bench-layer serve-local

## bench-layer: backend overhead around the kernel at B=1, prefix 32k (GPU; writes bench/results/layer_<gpu>.json + .log)
bench-layer: setup
	$(PY) -m kdtree_bench.kernel.layer_bench

## serve-local: SGLang in this venv with the kdtree verify backend (KDTREE_VERIFY=off|validate|on); SERVE_ARGS go to SGLang unchanged
serve-local: setup
	$(VENV)/bin/kdtree-serve $(SERVE_ARGS)
