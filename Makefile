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

.PHONY: deps venv control-plane inference-crds prometheus argocd gateway oci images lint test test-fast test-images demo compare cluster bench clean

venv:
	bash hack/setup-venv.sh

control-plane:
	bash hack/build-control-plane.sh

# The InferencePool CRD (inference.networking.k8s.io/v1) from the gateway-api-inference-extension Go module, for the
# router inference-pool tests (cached under $(KVCAL_CACHE)/share/gateway-api-inference-extension).
inference-crds:
	bash hack/fetch-inference-crds.sh

prometheus:
	@command -v prometheus >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq prometheus >/dev/null; }
	@prometheus --version 2>&1 | head -1

# podman, buildah, debootstrap, runc from Debian (the image tests); hack/oci-harness.sh says why each is needed here.
oci:
	bash hack/oci-harness.sh packages
	@podman --version

# The four images from images/*/Dockerfile, with podman and this machine's stand-in bases (no registry here; the layer
# cache and the bases live under $(KVCAL_CACHE)/oci). images/README.md: building anywhere else.
images: oci venv
	bash hack/oci-harness.sh bases
	eval "$$(bash hack/oci-harness.sh env)" && $(PY) -m kvcal.devenv.images build operator calibrator vllm-cpu --pull never
	bash hack/oci-harness.sh vllm-openai
	eval "$$(bash hack/oci-harness.sh env)" && $(PY) -m kvcal.devenv.images build verifier --pull never

# Argo CD v3.2 and kustomize (built from Go modules into $(KVCAL_CACHE)/bin) and redis for the GitOps tests.
argocd:
	@command -v redis-server >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null; }
	bash hack/build-argocd.sh

# Traefik v3.6 (a Go-only Gateway API implementation, built from Go modules into $(KVCAL_CACHE)/bin) and the Gateway
# API CRDs for the real-gateway tests (tests/e2e/test_gateway_traffic.py). Cold: ~14 CPU-minutes.
gateway:
	bash hack/build-gateway.sh

# The gateway build needs only Go and the module proxy, and the venv only PyPI (downloads, mostly waiting on the
# network), so both run in the background beside the Go builds and the apt installs (which stay in sequence: apt
# takes one lock): a cold `make deps` waits for the longest chain, not for the sum. A failed background log is shown.
deps:
	@mkdir -p "$(KVCAL_CACHE)"
	@bash hack/build-gateway.sh > "$(KVCAL_CACHE)/gateway-build.log" 2>&1 & gateway=$$!; \
	$(MAKE) --no-print-directory venv > "$(KVCAL_CACHE)/venv-setup.log" 2>&1 & venv=$$!; \
	$(MAKE) --no-print-directory control-plane inference-crds prometheus argocd oci; rc=$$?; \
	if ! wait $$venv; then cat "$(KVCAL_CACHE)/venv-setup.log" >&2; exit 1; fi; \
	cat "$(KVCAL_CACHE)/venv-setup.log"; \
	if ! wait $$gateway; then cat "$(KVCAL_CACHE)/gateway-build.log" >&2; exit 1; fi; \
	cat "$(KVCAL_CACHE)/gateway-build.log"; exit $$rc

lint: venv
	$(VENV)/bin/ruff check operator tests benchmarks
	$(VENV)/bin/ruff format --check operator tests benchmarks
	$(VENV)/bin/mypy
	PYTHONPATH=operator $(VENV)/bin/lint-imports
	$(PY) -m kvcal.generated --check

# Installs everything (venv, Go-built control plane, prometheus, podman) and runs every test (tests/images: the
# operator image is built and run; the heavy images only in `make test-images`).
test: deps lint
	$(PY) -m pytest $(PYTEST_ARGS)

# The torch and vLLM images (calibrator, verifier, vllm-cpu), built and run; too slow cold for every `make test`.
test-images: deps
	KVCAL_HEAVY_IMAGES=1 $(PY) -m pytest tests/images $(PYTEST_ARGS)

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
	$(PY) benchmarks/bench_capacity.py
	$(PY) benchmarks/bench_operator.py

clean:
	rm -rf out .pytest_cache .mypy_cache .ruff_cache
