#!/usr/bin/env bash
# The image-build harness of THIS kind of machine (no Docker engine, no registry, a TLS-intercepting egress proxy,
# no CAP_SYS_RESOURCE, cgroup v1/v2 hybrid): podman + runc, storage and config under $KVCAL_OCI, and stand-in base
# images under the names the product Dockerfiles use. Nothing here enters a product Dockerfile (images/README.md
# says how to build anywhere else).
#   hack/oci-harness.sh packages     podman, buildah, debootstrap, runc from Debian (apt), when missing
#   hack/oci-harness.sh bases        config + debootstrap Debian + stand-ins for python:3.11 and nvidia/cuda
#   hack/oci-harness.sh vllm-openai  stand-in for vllm/vllm-openai (the verifier's base) from the built vllm-cpu image
#   hack/oci-harness.sh env          print the exports podman needs here (eval "$(hack/oci-harness.sh env)")
# Every step is skipped when its result exists (the rootfs, a base image), so a second run takes seconds.
set -euo pipefail
cd "$(dirname "$0")/.."
OCI="${KVCAL_OCI:-${KVCAL_CACHE:-$HOME/.cache/kvcal}/oci}"
DEBIAN_MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
HARNESS_BASE=localhost/kvcal-harness/debian:bookworm
# The names the product Dockerfiles' FROM lines resolve to (docker.io is what a short name means).
PYTHON_STANDIN=docker.io/library/python:3.11.14-slim-bookworm
CUDA_STANDIN=docker.io/nvidia/cuda:13.0.1-base-ubuntu24.04
VLLM_OPENAI_STANDIN=docker.io/vllm/vllm-openai:v0.32.0
VLLM_CPU_IMAGE=docker.io/kvcal/vllm-cpu:0.32.0

log() { echo "[oci-harness] $*" >&2; }

packages() {
  local missing=()
  for tool in podman buildah debootstrap runc; do command -v "$tool" >/dev/null || missing+=("$tool"); done
  ((${#missing[@]} == 0)) && return
  log "installing ${missing[*]} (apt)"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq podman buildah debootstrap runc >/dev/null
}

config() {
  mkdir -p "$OCI"
  # Native overlay on ext4; storage in the cache so layers survive between runs.
  cat >"$OCI/storage.conf" <<CONF
[storage]
driver = "overlay"
graphroot = "$OCI/storage"
runroot = "$OCI/run"
CONF
  # podman asks for nofile=1048576 by default: without CAP_SYS_RESOURCE (hard limit 20000 here) every container fails
  # with "setrlimit RLIMIT_NOFILE"; crun refuses hybrid cgroups, runc works.
  cat >"$OCI/containers.conf" <<CONF
[containers]
default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]
[engine]
runtime = "runc"
CONF
}

env_exports() {
  echo "export CONTAINERS_STORAGE_CONF=$OCI/storage.conf CONTAINERS_CONF=$OCI/containers.conf"
}

exists() { podman image exists "$1"; }

debian_base() {
  exists "$HARNESS_BASE" && return
  if [[ ! -f "$OCI/rootfs/etc/debian_version" ]]; then
    log "debootstrap bookworm into $OCI/rootfs (about 2 min)"
    rm -rf "$OCI/rootfs.tmp"
    debootstrap --variant=minbase --include=ca-certificates bookworm "$OCI/rootfs.tmp" "$DEBIAN_MIRROR" >/dev/null
    mv "$OCI/rootfs.tmp" "$OCI/rootfs"
  fi
  # The egress proxy re-signs HTTPS: trust this machine's extra CAs, and point pip at the system bundle.
  if compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null; then
    cp /usr/local/share/ca-certificates/*.crt "$OCI/rootfs/usr/local/share/ca-certificates/"
    chroot "$OCI/rootfs" update-ca-certificates >/dev/null
  fi
  printf '[global]\ncert = /etc/ssl/certs/ca-certificates.crt\n' >"$OCI/rootfs/etc/pip.conf"
  rm -rf "$OCI/rootfs/var/cache/apt/archives/"*.deb "$OCI/rootfs/var/lib/apt/lists/"*
  log "importing $HARNESS_BASE"
  tar -C "$OCI/rootfs" -c . | podman import --quiet --change 'CMD ["bash"]' - "$HARNESS_BASE" >/dev/null
}

standin() {  # NAME CONTAINERFILE [BUILD-ARGS...]: build a stand-in base under NAME unless it exists
  local name="$1" file="$2"
  shift 2
  exists "$name" && return
  log "stand-in $name ($file)"
  podman build --pull=never -q -f "$file" "$@" -t "$name" hack/oci >/dev/null
}

bases() {
  packages
  config
  debian_base
  standin "$PYTHON_STANDIN" hack/oci/python.Containerfile --build-arg "BASE=$HARNESS_BASE"
  standin "$CUDA_STANDIN" hack/oci/cuda.Containerfile --build-arg "BASE=$HARNESS_BASE"
}

vllm_openai() {
  exists "$VLLM_CPU_IMAGE" || { log "build $VLLM_CPU_IMAGE first (make images)"; exit 1; }
  # Made anew whenever vllm-cpu was rebuilt, so the verifier never sits on a stale vLLM image.
  local base_id label='{{index .Labels "kvcal.dev/base-id"}}'
  base_id="$(podman image inspect --format '{{.Id}}' "$VLLM_CPU_IMAGE")"
  if exists "$VLLM_OPENAI_STANDIN" && [[ "$(podman image inspect --format "$label" "$VLLM_OPENAI_STANDIN")" != "$base_id" ]]; then
    podman rmi "$VLLM_OPENAI_STANDIN" >/dev/null
  fi
  standin "$VLLM_OPENAI_STANDIN" hack/oci/vllm-openai.Containerfile --build-arg "BASE=$VLLM_CPU_IMAGE" \
    --label "kvcal.dev/base-id=$base_id"
}

eval "$(env_exports)"
case "${1:-bases}" in
  packages) packages ;;
  bases) bases ;;
  vllm-openai) config; vllm_openai ;;
  env) config; env_exports ;;
  *) echo "usage: $0 packages|bases|vllm-openai|env" >&2; exit 2 ;;
esac
