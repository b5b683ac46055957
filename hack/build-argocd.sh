#!/usr/bin/env bash
# Builds Argo CD (and the kustomize its repo server runs) for the GitOps tests (tests/support/argocd.py) from the
# Go module proxy, cached like the control plane. v3.2.x is the last line that builds this way: from v3.4
# gitops-engine is a nested module of the argo-cd repository that the proxy cannot serve. The wrapper module repeats
# upstream's whole replace block (its go.mod pins k8s.io/* through replaces). The result is one multi-call binary that
# dispatches on its name, so the controller and the repo server are links to it. The CRDs and base config the
# harness applies are copied next to it.
set -euo pipefail

ARGOCD_VERSION="${ARGOCD_VERSION:-v3.2.6}"
CACHE="${KVCAL_CACHE:-$HOME/.cache/kvcal}"
BIN="$CACHE/bin"
SHARE="$CACHE/share/argocd"
mkdir -p "$BIN"
export GOFLAGS="-mod=mod" CGO_ENABLED=0 GOTOOLCHAIN=local
log() { echo "[argocd] $*" >&2; }

have() { [[ -x "$BIN/$1" && -f "$BIN/.$1.version" && "$(cat "$BIN/.$1.version")" == "$2" ]]; }
stamp() { echo "$2" > "$BIN/.$1.version"; }

# The repo server renders Kustomize sources with the `kustomize` binary on its PATH (the promotion-through-Git test
# commits kvcal's patch in a kustomization). v5.7.1 is the kustomize kubectl v1.35 embeds.
KUSTOMIZE_VERSION="${KUSTOMIZE_VERSION:-v5.7.1}"
if have kustomize "$KUSTOMIZE_VERSION"; then
  log "kustomize $KUSTOMIZE_VERSION cached"
else
  log "building kustomize $KUSTOMIZE_VERSION"
  GOBIN="$BIN" go install -trimpath -ldflags "-s -w" "sigs.k8s.io/kustomize/kustomize/v5@$KUSTOMIZE_VERSION"
  stamp kustomize "$KUSTOMIZE_VERSION"
fi

if have argocd "$ARGOCD_VERSION" && [[ -f "$SHARE/.version" && "$(cat "$SHARE/.version")" == "$ARGOCD_VERSION" ]]; then
  log "argocd $ARGOCD_VERSION cached"
  exit 0
fi

module="github.com/argoproj/argo-cd/v3"
work="$CACHE/src/argocd-$ARGOCD_VERSION"
mkdir -p "$work"
start=$(date +%s)
download="$(cd "$work" && go mod download -json "$module@$ARGOCD_VERSION")"
gomod="$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["GoMod"])' "$download")"
srcdir="$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["Dir"])' "$download")"
{
  echo "module kvcal.dev/argocd"
  echo
  echo "go $(awk '/^go /{print $2; exit}' "$gomod")"
  echo
  echo "require $module $ARGOCD_VERSION"
  echo
  # Upstream's replace directives, block and single-line forms, verbatim.
  awk '/^replace \($/{inblock=1; print; next} inblock{print; if ($0 ~ /^\)$/) inblock=0; next} /^replace /{print}' "$gomod"
} > "$work/go.mod"
printf '//go:build tools\n\npackage main\n\nimport _ "%s/cmd"\n' "$module" > "$work/tools.go"
printf 'package main\n\nfunc main() {}\n' > "$work/main.go"

log "resolving modules for $ARGOCD_VERSION"
(cd "$work" && go mod tidy)
log "building argocd $ARGOCD_VERSION (10-30 min on 2 cores)"
ld="-s -w -X $module/common.version=${ARGOCD_VERSION#v} -X $module/common.gitTreeState=clean"
ld="$ld -X $module/common.buildDate=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
(cd "$work" && go build -trimpath -ldflags "$ld" -o "$BIN/argocd" "$module/cmd")
for name in argocd-application-controller argocd-repo-server argocd-server; do
  ln -sf argocd "$BIN/$name"
done
stamp argocd "$ARGOCD_VERSION"

rm -rf "$SHARE"
mkdir -p "$SHARE/crds" "$SHARE/config"
cp "$srcdir/manifests/crds/"*.yaml "$SHARE/crds/"
for file in "$srcdir/manifests/base/config/"*.yaml; do
  [[ "$(basename "$file")" == kustomization.yaml ]] || cp "$file" "$SHARE/config/"
done
chmod -R u+w "$SHARE"
echo "$ARGOCD_VERSION" > "$SHARE/.version"
log "argocd $ARGOCD_VERSION built in $(( $(date +%s) - start )) s; binary in $BIN, manifests in $SHARE"
"$BIN/argocd" version --client --short 2>/dev/null || "$BIN/argocd" version --client
