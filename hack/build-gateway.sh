#!/usr/bin/env bash
# Builds Traefik, a Gateway API implementation written in Go only (Envoy-based gateways need the Envoy binary, which
# no module proxy serves), for the real-gateway tests (tests/support/gateway.py), from the Go module proxy and cached
# like the control plane. The wrapper module repeats upstream's replace and exclude directives (its go.mod points three
# modules at Containous forks). Next to the binary: the Gateway API CRDs of the standard channel (Gateway,
# GatewayClass, HTTPRoute, ...) at the version of sigs.k8s.io/gateway-api that this Traefik requires, and upstream's
# RBAC for its kubernetesGateway provider. Cold: about 13.6 CPU-minutes (8-9 min wall on an idle 2-core machine).
set -euo pipefail

TRAEFIK_VERSION="${TRAEFIK_VERSION:-v3.6.12}"
CACHE="${KVCAL_CACHE:-$HOME/.cache/kvcal}"
BIN="$CACHE/bin"
SHARE="$CACHE/share/gateway-api"
mkdir -p "$BIN"
export GOFLAGS="-mod=mod" CGO_ENABLED=0 GOTOOLCHAIN=local
log() { echo "[gateway] $*" >&2; }

have() { [[ -x "$BIN/$1" && -f "$BIN/.$1.version" && "$(cat "$BIN/.$1.version")" == "$2" ]]; }
stamp() { echo "$2" > "$BIN/.$1.version"; }

if have traefik "$TRAEFIK_VERSION" && [[ -f "$SHARE/.version" && "$(cat "$SHARE/.version")" == "$TRAEFIK_VERSION" ]]; then
  log "traefik $TRAEFIK_VERSION cached"
  exit 0
fi

module="github.com/traefik/traefik/v3"
work="$CACHE/src/traefik-$TRAEFIK_VERSION"
mkdir -p "$work"
start=$(date +%s)
field() { python3 -c 'import json,sys; print(json.loads(sys.argv[1])[sys.argv[2]])' "$1" "$2"; }
download="$(cd "$work" && go mod download -json "$module@$TRAEFIK_VERSION")"
gomod="$(field "$download" GoMod)"
srcdir="$(field "$download" Dir)"
{
  echo "module kvcal.dev/traefik"
  echo
  echo "go $(awk '/^go /{print $2; exit}' "$gomod")"
  echo
  echo "require $module $TRAEFIK_VERSION"
  echo
  # Upstream's replace and exclude directives, block and single-line forms, verbatim.
  awk '/^(replace|exclude) \($/{inblock=1; print; next} inblock{print; if ($0 ~ /^\)$/) inblock=0; next}
       /^(replace|exclude) /{print}' "$gomod"
} > "$work/go.mod"
printf '//go:build tools\n\npackage main\n\nimport _ "%s/cmd/traefik"\n' "$module" > "$work/tools.go"
printf 'package main\n\nfunc main() {}\n' > "$work/main.go"

if ! have traefik "$TRAEFIK_VERSION"; then
  log "resolving modules for $TRAEFIK_VERSION"
  (cd "$work" && go mod tidy)
  log "building traefik $TRAEFIK_VERSION (about 14 CPU-minutes)"
  ld="-s -w -X $module/pkg/version.Version=$TRAEFIK_VERSION"
  (cd "$work" && go build -trimpath -ldflags "$ld" -o "$BIN/traefik" "$module/cmd/traefik")
  stamp traefik "$TRAEFIK_VERSION"
fi

# The CRDs must be the ones this Traefik's client was generated against: read the version from the build's module
# graph, not from a pin here.
api_version="$(cd "$work" && go list -m -f '{{.Version}}' sigs.k8s.io/gateway-api)"
api_dir="$(field "$(cd "$work" && go mod download -json "sigs.k8s.io/gateway-api@$api_version")" Dir)"
rm -rf "$SHARE"
mkdir -p "$SHARE/crds"
for file in "$api_dir/config/crd/standard/"*.yaml; do
  [[ "$(basename "$file")" == kustomization.yaml ]] || cp "$file" "$SHARE/crds/"
done
cp "$srcdir/docs/content/reference/dynamic-configuration/kubernetes-gateway-rbac.yml" "$SHARE/"
chmod -R u+w "$SHARE"
echo "$api_version" > "$SHARE/.gateway-api-version"
echo "$TRAEFIK_VERSION" > "$SHARE/.version"
log "traefik $TRAEFIK_VERSION built in $(( $(date +%s) - start )) s; binary in $BIN, Gateway API $api_version CRDs in $SHARE"
"$BIN/traefik" version | head -1
