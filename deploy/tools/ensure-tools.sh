#!/usr/bin/env bash
# Provides the tools the tests use (helm, kustomize, and crane for a loopback OCI
# registry), built once from the Go
# module proxy into a cache outside the repository, the way tests/control-plane/
# ensure-binaries.sh provides kube-apiserver. A fresh clone never rebuilds them and nothing
# binary is committed.
#
# Usage: ensure-tools.sh [helm|kustomize|crane]...   (default: all three)
# Prints one line per tool: "<name>=<absolute path>". CRO_HELM / CRO_KUSTOMIZE / CRO_CRANE naming an
# existing executable are used as they are.
set -euo pipefail

HELM_VERSION="${CRO_HELM_VERSION:-v3.19.5}"
KUSTOMIZE_VERSION="${CRO_KUSTOMIZE_VERSION:-v5.7.1}"
# go-containerregistry's crane: `crane registry serve` is a real OCI registry for tests.
CRANE_VERSION="${CRO_CRANE_VERSION:-v0.22.1}"
CACHE_ROOT="${CRO_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/cro}"

log() { echo "[tools] $*" >&2; }

ensure() {
  local name="$1" module="$2" version="$3" override="$4"
  if [[ -n "$override" ]]; then
    [[ -f "$override" && -x "$override" ]] || { log "$name: $override is not an executable file"; exit 1; }
    echo "$name=$override"; return
  fi
  local dir="$CACHE_ROOT/tools/$name/$version"
  local bin="$dir/$name"
  if [[ -x "$bin" ]]; then echo "$name=$bin"; return; fi
  command -v go >/dev/null || { log "go is needed to build $name (or set CRO_${name^^})"; exit 1; }
  mkdir -p "$dir"
  # One builder at a time: parallel test binaries wait for the first.
  exec 8>"$dir/.lock"
  flock 8
  if [[ ! -x "$bin" ]]; then
    local t0; t0=$(date +%s)
    log "building $name $version from the Go module proxy (once; cached in $dir)"
    GOBIN="$dir/.tmp" CGO_ENABLED=0 go install -trimpath -ldflags "-s -w" "$module@$version"
    mv "$dir/.tmp/$name" "$bin"
    rmdir "$dir/.tmp" 2>/dev/null || true
    log "$name built in $(( $(date +%s) - t0 )) s"
  fi
  exec 8>&-
  echo "$name=$bin"
}

tools=("$@")
((${#tools[@]})) || tools=(helm kustomize crane)
for t in "${tools[@]}"; do
  case "$t" in
    helm) ensure helm helm.sh/helm/v3/cmd/helm "$HELM_VERSION" "${CRO_HELM:-}" ;;
    kustomize) ensure kustomize sigs.k8s.io/kustomize/kustomize/v5 "$KUSTOMIZE_VERSION" "${CRO_KUSTOMIZE:-}" ;;
    crane) ensure crane github.com/google/go-containerregistry/cmd/crane "$CRANE_VERSION" "${CRO_CRANE:-}" ;;
    *) log "unknown tool $t (helm, kustomize, crane)"; exit 1 ;;
  esac
done
