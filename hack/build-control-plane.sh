#!/usr/bin/env bash
# Builds the real Kubernetes control plane used by tests and `make cluster`, from Go modules:
# etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubectl (k8s.io/kubernetes through a wrapper module that repeats its
# staging replaces at the matching v0.X.Y), and helm. Binaries are cached per version: a rebuild is skipped when the
# wanted version is already there.
set -euo pipefail

K8S_VERSION="${K8S_VERSION:-v1.35.4}"
ETCD_VERSION="${ETCD_VERSION:-v3.6.16}"
HELM_VERSION="${HELM_VERSION:-v3.22.0}"
CACHE="${KVCAL_CACHE:-$HOME/.cache/kvcal}"
BIN="$CACHE/bin"
mkdir -p "$BIN"
export GOFLAGS="-mod=mod" CGO_ENABLED=0 GOTOOLCHAIN=local
log() { echo "[control-plane] $*" >&2; }

have() { [[ -x "$BIN/$1" && -f "$BIN/.$1.version" && "$(cat "$BIN/.$1.version")" == "$2" ]]; }
stamp() { echo "$2" > "$BIN/.$1.version"; }

build_k8s() {
  if have kube-apiserver "$K8S_VERSION" && have kube-controller-manager "$K8S_VERSION" && have kube-scheduler "$K8S_VERSION" \
    && have kubectl "$K8S_VERSION"; then
    log "kubernetes $K8S_VERSION cached"; return
  fi
  local minor="v0.${K8S_VERSION#v1.}"
  local work="$CACHE/src/k8s-$K8S_VERSION"
  mkdir -p "$work"
  local gomod
  gomod="$(cd "$work" && go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | python3 -c 'import json,sys; print(json.load(sys.stdin)["GoMod"])')"
  {
    echo "module kvcal.dev/controlplane"
    echo
    echo "go $(awk '/^go /{print $2; exit}' "$gomod")"
    echo
    echo "require k8s.io/kubernetes $K8S_VERSION"
    echo
    echo "replace ("
    # k8s.io/kubernetes points its staging modules at ./staging/src/...; outside its tree they are the v0.X.Y modules.
    awk -v minor="$minor" '/=> \.\/staging\/src\//{print "\t" $1 " => " $1 " " minor}' "$gomod"
    echo ")"
  } > "$work/go.mod"
  cat > "$work/tools.go" <<'GO'
//go:build tools

package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
)
GO
  local date; date="$(date -u +%Y-%m-%dT%H:%M:%SZ)"
  local pkg="k8s.io/component-base/version"
  local ld="-s -w -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$(echo "$K8S_VERSION" | cut -d. -f2) -X $pkg.gitTreeState=clean -X $pkg.buildDate=$date"
  ld="$ld -X k8s.io/client-go/pkg/version.gitVersion=$K8S_VERSION"
  (cd "$work" && go mod tidy -e >/dev/null 2>&1 || true)
  for cmd in kube-apiserver kube-controller-manager kube-scheduler kubectl; do
    if have "$cmd" "$K8S_VERSION"; then log "$cmd $K8S_VERSION cached"; continue; fi
    log "building $cmd $K8S_VERSION (several minutes on 2 cores)"
    (cd "$work" && go build -trimpath -ldflags "$ld" -o "$BIN/$cmd" "k8s.io/kubernetes/cmd/$cmd")
    stamp "$cmd" "$K8S_VERSION"
  done
}

build_etcd() {
  if have etcd "$ETCD_VERSION"; then log "etcd $ETCD_VERSION cached"; return; fi
  log "building etcd $ETCD_VERSION"
  # etcd's server module carries replace directives, so `go install mod@version` refuses it: use a wrapper module.
  local work="$CACHE/src/etcd-$ETCD_VERSION"
  mkdir -p "$work"
  printf 'module kvcal.dev/etcd\n\ngo 1.25\n\nrequire go.etcd.io/etcd/server/v3 %s\n' "$ETCD_VERSION" > "$work/go.mod"
  printf '//go:build tools\n\npackage tools\n\nimport _ "go.etcd.io/etcd/server/v3"\n' > "$work/tools.go"
  (cd "$work" && go mod tidy -e >/dev/null 2>&1 || true)
  (cd "$work" && go build -trimpath -ldflags "-s -w" -o "$BIN/etcd" go.etcd.io/etcd/server/v3)
  stamp etcd "$ETCD_VERSION"
}

build_helm() {
  if have helm "$HELM_VERSION"; then log "helm $HELM_VERSION cached"; return; fi
  log "building helm $HELM_VERSION"
  GOBIN="$BIN" go install -trimpath -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION" "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
  stamp helm "$HELM_VERSION"
}

build_etcd
build_helm
build_k8s
log "binaries in $BIN"
ls -1 "$BIN"
