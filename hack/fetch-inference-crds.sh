#!/usr/bin/env bash
# The CRDs the router inference-pool tests install in the test control plane (tests/e2e/test_inference_pool.py):
# InferencePool (inference.networking.k8s.io/v1) from the Gateway API Inference Extension, and the standard
# channel's HTTPRoute from the Gateway API, whose backendRefs name the pools. Both come from the Go modules the
# proxy serves (no build: each CRD is a file of its module), cached by version stamp like the control plane. v1 is
# the InferencePool kvcal writes; v1alpha2 is the old API (its objective/rewrite types moved to llm-d) and is not
# installed.
set -euo pipefail

INFERENCE_EXTENSION_VERSION="${INFERENCE_EXTENSION_VERSION:-v1.6.2}"
GATEWAY_API_VERSION="${GATEWAY_API_VERSION:-v1.4.0}"
CACHE="${KVCAL_CACHE:-$HOME/.cache/kvcal}"
SHARE="$CACHE/share/gateway-api-inference-extension"
STAMP="$INFERENCE_EXTENSION_VERSION gateway-api $GATEWAY_API_VERSION"
POOL_CRD="inference.networking.k8s.io_inferencepools.yaml"
ROUTE_CRD="gateway.networking.k8s.io_httproutes.yaml"
log() { echo "[inference-crds] $*" >&2; }

if [[ -f "$SHARE/$POOL_CRD" && -f "$SHARE/$ROUTE_CRD" && -f "$SHARE/.version" && "$(cat "$SHARE/.version")" == "$STAMP" ]]; then
  log "CRDs $STAMP cached"
  exit 0
fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
# The module's folder in the Go module cache (downloaded from the proxy when absent).
module_dir() {
  log "module $1 from the Go module proxy"
  local download
  download="$(cd "$work" && GOFLAGS=-mod=mod go mod download -json "$1")"
  python3 -c 'import json,sys; print(json.loads(sys.argv[1])["Dir"])' "$download"
}
mkdir -p "$SHARE"
pool_dir="$(module_dir "sigs.k8s.io/gateway-api-inference-extension@$INFERENCE_EXTENSION_VERSION")"
route_dir="$(module_dir "sigs.k8s.io/gateway-api@$GATEWAY_API_VERSION")"
cp "$pool_dir/config/crd/bases/$POOL_CRD" "$SHARE/$POOL_CRD"
cp "$route_dir/config/crd/standard/$ROUTE_CRD" "$SHARE/$ROUTE_CRD"
chmod u+w "$SHARE/$POOL_CRD" "$SHARE/$ROUTE_CRD"  # the module cache is read-only
echo "$STAMP" > "$SHARE/.version"
log "CRDs $STAMP in $SHARE"
