# kvcal: two commands on a fresh machine (see README): `make demo` and `make test`.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
KVCAL_CACHE ?= $(HOME)/.cache/kvcal
export KVCAL_CACHE
export PATH := $(KVCAL_CACHE)/bin:$(abspath $(VENV))/bin:$(PATH)
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
PYTEST_ARGS ?=

.PHONY: deps venv control-plane prometheus lint test test-fast demo compare cluster bench clean

venv:
	bash hack/setup-venv.sh

control-plane:
	bash hack/build-control-plane.sh

prometheus:
	@command -v prometheus >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq prometheus >/dev/null; }
	@prometheus --version 2>&1 | head -1

deps: venv control-plane prometheus

lint: venv
	$(VENV)/bin/ruff check operator tests benchmarks
	$(VENV)/bin/ruff format --check operator tests benchmarks
	$(VENV)/bin/mypy

# Installs everything (venv, Go-built control plane, prometheus) and runs every test.
test: deps lint
	$(PY) -m pytest $(PYTEST_ARGS)

# Unit tests only (no cluster, no model).
test-fast: venv
	$(PY) -m pytest tests/unit $(PYTEST_ARGS)

# The main job on the embedded default: calibrate SmolLM2-135M-Instruct on the bundled set and print the comparison.
demo: venv
	$(VENV)/bin/kvcal calibrate --demo --out out/demo --force

compare: venv
	$(VENV)/bin/kvcal compare --demo --out out/compare

# A real control plane for manual use; prints KUBECONFIG=... on its last line.
cluster: control-plane venv
	$(PY) -m kvcal.devenv.controlplane up --crd crds/kvcal.dev_kvcalibrations.yaml

bench: venv
	$(PY) benchmarks/bench_calibrate.py
	$(PY) benchmarks/bench_analysis.py
	$(PY) benchmarks/bench_operator.py

clean:
	rm -rf out .pytest_cache .mypy_cache .ruff_cache
