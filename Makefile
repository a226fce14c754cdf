# triton-batching: the interface. `make help` lists the targets.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
SPEC ?= models.yaml
REPO ?= model_repository
PERF ?= default
SOAK_S ?= 600

.DEFAULT_GOAL := help
.PHONY: help setup repo serve stop status perf perf-analyzer test test-unit lint format gpu-check clean soak

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-14s %s\n", $$1, $$2}'

setup: $(STAMP) ## create .venv and install everything (torch CPU, tritonclient, onnx, nvidia-pytriton, ...)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check -e '.[dev]'
	touch $@

repo: setup ## export the models of $(SPEC) into $(REPO) (ONNX + config.pbtxt, checked against torch)
	$(BIN)/python -m exporters build --spec $(SPEC) --repository $(REPO)

serve: repo ## start tritonserver on $(REPO) in the background (127.0.0.1:8000 http, :8001 grpc)
	$(BIN)/python -m server start --repository $(REPO)

stop: ## stop the server started by `make serve`
	@if [ -x $(BIN)/python ]; then $(BIN)/python -m server stop; else echo "nothing to stop"; fi

status: setup ## show whether the `make serve` server is up, and its models
	$(BIN)/python -m server status

perf: setup ## the batching study on the embedded server; report in reports/<timestamp>/ (PERF=quick: about 2 min)
	$(BIN)/python -m perf run --profile $(PERF) $(PERF_ARGS)

soak: repo ## 10 min of mixed load with random faults (stub kills, bad input, updates); SOAK_S=60 for a short one
	$(BIN)/python -m server.soak --repository $(REPO) --duration $(SOAK_S)

perf-analyzer: setup ## cross-check one model with NVIDIA perf_analyzer, where it is installed
	$(BIN)/python -m perf analyzer

test: setup ## unit + integration tests (starts real tritonservers on free ports)
	$(BIN)/python -m pytest -q

test-unit: setup ## unit tests only (no server)
	$(BIN)/python -m pytest -q -m "not integration"

lint: setup ## ruff check + format check
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: setup ## apply ruff fixes and formatting
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

gpu-check: setup ## on a GPU host: GPU tests and a short GPU benchmark, table last
	bash scripts/gpu_check.sh

clean: ## remove the built repository, reports and the virtual environment
	rm -rf $(REPO)/*/ $(REPO)/.built-by-triton-batching reports .run $(VENV)
