# Quickstart: `make train` (default run, CPU) and `make test`. Both create .venv when missing.
SHELL := /bin/bash
VENV  := .venv
PY    := $(VENV)/bin/python
STAMP := $(VENV)/.vagen-installed
export WANDB_MODE ?= offline
export DS_ACCELERATOR ?= cpu
export VLLM_ENABLE_V1_MULTIPROCESSING ?= 0
export TOKENIZERS_PARALLELISM ?= false

.PHONY: setup test test-all lint bench train gpu-wheels

setup: $(STAMP)

$(STAMP): pyproject.toml constraints.txt scripts/setup_env.sh
	bash scripts/setup_env.sh
	touch $(STAMP)

test: setup
	$(PY) -m pytest -q

test-all: setup  ## includes tests marked slow
	$(PY) -m pytest -q -m ""

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

bench: setup
	@for f in bench/*_bench.py; do echo "== $$f"; $(PY) $$f || exit 1; done

train: setup
	$(PY) vagen/train.py --config configs/frozenlake_quickstart_tiny.yaml

gpu-wheels: setup  ## wheels scripts/gpu_check.sh installs offline on a GPU machine (needs network here)
	bash scripts/gpu_check.sh --prepare-wheels
