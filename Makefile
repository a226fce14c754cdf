# triton-batching: the interface. `make help` lists the targets.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
SPEC ?= models.yaml
REPO ?= model_repository
PERF ?= default
# GPUs per pod of the Kubernetes gpu overlay: the one place is deploy/k8s/gpus/gpus.env.
DEPLOY_GPUS ?= $(shell sed -n 's/^GPUS=//p' deploy/k8s/gpus/gpus.env)
DEPLOY_REPO ?= deploy-repository/gpu
SOAK_S ?= 600
# pytest-xdist workers for `make test`: most tests wait on a server starting or healing, so three keep
# two cores busy.
TEST_WORKERS ?= 3
HTTP_PORT ?= 8000
GRPC_PORT ?= 8001
METRICS_PORT ?= 8002
# make perf/tune/plan/soak: take every server's ports from this base (5 per server) instead of the OS's.
PORT_BASE ?=
PORT_ARGS = $(if $(PORT_BASE),--port-base $(PORT_BASE))
# make tune/plan without MODEL= or P99_MS= stop here naming them, not python's --model or --p99-ms
NEEDS_MODEL_AND_BUDGET = $(if $(and $(MODEL),$(P99_MS)),,$(error make $@ needs MODEL= and P99_MS= (e.g. make $@ MODEL=recommender P99_MS=10)))

.DEFAULT_GOAL := help
PA_STAMP := $(VENV)/perf_analyzer/.attempted
BWRAP_STAMP := $(VENV)/bubblewrap/.attempted

.PHONY: help setup repo serve stop status perf perf-analyzer tune plan test test-unit lint format gpu-carry \
	gpu-check gpu-rehearsal clean \
	deploy-tools deploy-repo deploy-rules soak

help: ## list the targets and the variables they take
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-14s %s\n", $$1, $$2}'
	@echo "variables (make <target> NAME=value):"
	@echo "  SPEC=$(SPEC)  the spec (repo, serve, tune, perf's own models)"
	@echo "  REPO=$(REPO)  the built repository (repo, serve, soak)"
	@echo "  MODELS=       make perf: comma list of zoo families or models of SPEC (default: the profile's)"
	@echo "  PERF=$(PERF)  make perf profile: default, quick, smoke"
	@echo "  MODEL= P99_MS= RATE=  make tune: the model of SPEC, the p99 budget (ms), an optional target rate"
	@echo "  HTTP_PORT=$(HTTP_PORT) GRPC_PORT=$(GRPC_PORT) METRICS_PORT=$(METRICS_PORT)  make serve's ports"
	@echo "  ALLOW_PARTIAL=1  make serve keeps serving when some models fail to load (default: exit 1)"
	@echo "  TRUSTED_SHM=1  make serve lets tritonserver map clients' shared memory (trusted clients only:"
	@echo "                 docs/SERVING.md, Shared memory); default: the fronts copy it"
	@echo "  SERVE_ARGS=    further options of python -m server start: the fronts' shares and times (--help lists them)"
	@echo "  TOPOLOGY= ACCURACY=  make plan: a recorded GPU topology (e.g. dgx1-v100), the accuracy limit"
	@echo "  COMPUTE_PROFILE=     make plan: a GPU's recorded compute (the GPU check's figures JSON)"
	@echo "  SOAK_S=$(SOAK_S) INVARIANT_S=  make soak: seconds of faults; seconds of the invariant fuzz before them"
	@echo "                 (default SOAK_S/2; docs/SERVING.md, The invariant fuzz)"
	@echo "  PORT_BASE=     make perf/tune/plan/soak: every server's ports from this base (HTTP, gRPC, metrics,"
	@echo "                 Triton's own two behind the fronts: 5 per server) instead of free ports the OS picks"
	@echo "  PERF_ARGS= TUNE_ARGS= PLAN_ARGS=  further options of python -m perf run / tune / plan (--help lists them)"
	@echo "  TEST_WORKERS=$(TEST_WORKERS)  make test: pytest-xdist workers"

setup: $(STAMP) $(PA_STAMP) $(BWRAP_STAMP) ## create .venv and install everything (torch CPU, tritonclient, onnx, nvidia-pytriton, perf_analyzer, bubblewrap, ...)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check --no-compile -e '.[dev,reference]'
	@# Bytecode for the whole environment, on both cores: each Python-backend stub and each `python -m`
	@# imports torch, which costs 1.4 s more CPU from source, and PYTHONDONTWRITEBYTECODE=1 (set on
	@# some machines) stops Python from ever caching it. Files that only a newer Python compiles (a
	@# torch test helper) are skipped, as pip's own compile step skips them.
	$(BIN)/python -m compileall -qq -j 0 $(VENV)/lib || true
	touch $@

# perf_analyzer 2.41.0 from the tritonclient wheel + libb64 + libcudart into .venv/perf_analyzer (never fails setup)
$(PA_STAMP): $(STAMP)
	$(BIN)/python -m perf.perf_analyzer_install
	touch $@

# bubblewrap (bwrap, Debian's package) into .venv/bubblewrap: the sandbox outside archives are opened in
# (exporters/sandbox/). Never fails setup: a build that needs it says how to install it.
$(BWRAP_STAMP): $(STAMP)
	@bash deploy/install-tools.sh $(VENV) bubblewrap
	@mkdir -p $(@D) && touch $@

repo: setup ## export the models of $(SPEC) into $(REPO) (ONNX + config.pbtxt, checked against torch)
	$(BIN)/python -m exporters build --spec $(SPEC) --repository $(REPO)

serve: repo ## start tritonserver on $(REPO) in the background, supervised: restarted if it dies (127.0.0.1, HTTP_PORT/GRPC_PORT/METRICS_PORT)
	$(BIN)/python -m server start --repository $(REPO) --spec $(SPEC) --http-port $(HTTP_PORT) \
		--grpc-port $(GRPC_PORT) --metrics-port $(METRICS_PORT) $(if $(ALLOW_PARTIAL),--allow-partial) \
		$(if $(TRUSTED_SHM),--trusted-shared-memory) $(SERVE_ARGS)

stop: ## stop the server started by `make serve`
	@if [ -x $(BIN)/python ]; then $(BIN)/python -m server stop; else echo "nothing to stop"; fi

status: setup ## show whether the `make serve` server is up, and its models
	$(BIN)/python -m server status

perf: setup ## every study (the batching study first) on the embedded server; report in reports/<timestamp>/ (PERF=quick: about 5 min; MODELS=your models of SPEC)
	$(BIN)/python -m perf run --profile $(PERF) --spec $(SPEC) $(if $(MODELS),--models $(MODELS)) $(PORT_ARGS) $(PERF_ARGS)

soak: repo ## the invariant fuzz under load (SOAK_S/2, INVARIANT_S= to change), then SOAK_S (10 min) of random faults (stubs killed or stopped, tritonserver killed, bad input and the fault matrix's attacks, updates); SOAK_S=60 for a short one
	$(BIN)/python -m soak --repository $(REPO) --duration $(SOAK_S) $(if $(INVARIANT_S),--invariant-s $(INVARIANT_S)) $(PORT_ARGS)

perf-analyzer: setup ## install NVIDIA perf_analyzer into .venv (if missing) and cross-check one model with it
	$(BIN)/python -m perf.perf_analyzer_install
	$(BIN)/python -m perf analyzer

tune: setup ## pick batching for a p99 budget: make tune MODEL=recommender P99_MS=10 [RATE=…] [TUNE_ARGS="--engine ours"]
	$(NEEDS_MODEL_AND_BUDGET)
	$(BIN)/python -m perf tune --spec $(SPEC) --model $(MODEL) --p99-ms $(P99_MS) $(if $(RATE),--rate $(RATE)) $(PORT_ARGS) $(TUNE_ARGS)

plan: setup ## choose the serving strategy: make plan MODEL=recommender P99_MS=10 [TOPOLOGY=dgx1-v100] [ACCURACY=1e-3] [COMPUTE_PROFILE=gpu_check.json]
	$(NEEDS_MODEL_AND_BUDGET)
	$(BIN)/python -m perf plan --spec $(SPEC) --model $(MODEL) --p99-ms $(P99_MS) $(if $(TOPOLOGY),--topology $(TOPOLOGY)) $(if $(ACCURACY),--accuracy $(ACCURACY)) $(if $(COMPUTE_PROFILE),--compute-profile $(COMPUTE_PROFILE)) $(PORT_ARGS) $(PLAN_ARGS)

test: setup deploy-tools ## unit + integration tests (starts real tritonservers on free ports; TEST_WORKERS=3)
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadgroup --no-loadscope-reorder

deploy-tools: setup ## prometheus/promtool (Debian package, into .venv) and kubectl where missing
	@bash deploy/install-tools.sh $(VENV) prometheus kubectl

deploy-repo: setup ## repository for the gpu overlay / compose: the spec's models, DEPLOY_GPUS GPUs
	$(BIN)/python -m exporters build --spec $(SPEC) --gpus $(DEPLOY_GPUS) --repository $(DEPLOY_REPO) \
		--models $$($(BIN)/python -c 'import sys; from exporters.resolve import load_spec; \
		print(",".join(m.name for m in load_spec(sys.argv[1]).models))' $(SPEC))

deploy-rules: setup ## rewrite the PrometheusRule and Grafana dashboard from deploy/monitoring/rules
	$(BIN)/python deploy/monitoring/generate.py

test-unit: setup deploy-tools ## unit tests only (no server)
	$(BIN)/python -m pytest -q -m "not integration"

lint: setup ## ruff check + format check
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: setup ## apply ruff fixes and formatting
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

gpu-carry: setup ## build .gpu-carry: the wheels the lent GPU machine lacks (needs PyPI), size against its 64 MiB
	$(BIN)/python -m gpucheck carry

gpu-check: ## ON THE GPU MACHINE (its python3, .gpu-carry carried): the GPU check; files in OUT (docs/GPU.md)
	bash scripts/gpu_check.sh

gpu-rehearsal: setup ## the GPU check's script here on the CPU, tiny grid, only what the GPU machine has (docs/GPU.md)
	$(BIN)/python -m gpucheck rehearse

clean: ## remove the built repository, reports and the virtual environment
	rm -rf $(REPO)/*/ $(REPO)/.built-by-triton-batching reports .run .gpu-carry $(VENV)
