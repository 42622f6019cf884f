#!/usr/bin/env bash
# Provides the etcd and kube-apiserver binaries the integration tests start.
#
# Order of preference (first hit wins, nothing is built):
#   1. CRO_KUBE_APISERVER and CRO_ETCD naming existing executables;
#   2. KUBEBUILDER_ASSETS, a directory holding kube-apiserver and etcd;
#   3. the cache directory below, filled by an earlier run of this script.
# Otherwise both are built once from the Go module proxy into the cache, which lives
# outside the repository so a fresh clone never rebuilds and nothing binary is committed.
#
# Prints the directory holding both binaries as the last line of stdout.
set -euo pipefail
SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

K8S_VERSION="${CRO_K8S_VERSION:-v1.36.3}"
CACHE_ROOT="${CRO_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/cro}"
BIN_DIR="$CACHE_ROOT/controlplane/$K8S_VERSION/bin"

log() { echo "[control-plane] $*" >&2; }

if [[ -n "${CRO_KUBE_APISERVER:-}" || -n "${CRO_ETCD:-}" ]]; then
  [[ -n "${CRO_KUBE_APISERVER:-}" && -n "${CRO_ETCD:-}" ]] || { log "set both CRO_KUBE_APISERVER and CRO_ETCD, or neither"; exit 1; }
  [[ -f "$CRO_KUBE_APISERVER" && -x "$CRO_KUBE_APISERVER" ]] || { log "CRO_KUBE_APISERVER=$CRO_KUBE_APISERVER is not an executable file"; exit 1; }
  [[ -f "$CRO_ETCD" && -x "$CRO_ETCD" ]] || { log "CRO_ETCD=$CRO_ETCD is not an executable file"; exit 1; }
  log "using CRO_KUBE_APISERVER and CRO_ETCD from the environment"
  api_dir=$(cd "$(dirname "$CRO_KUBE_APISERVER")" && pwd)
  etcd_dir=$(cd "$(dirname "$CRO_ETCD")" && pwd)
  if [[ "$api_dir" == "$etcd_dir" && "$(basename "$CRO_KUBE_APISERVER")" == kube-apiserver && "$(basename "$CRO_ETCD")" == etcd ]]; then
    echo "$api_dir"
  else
    # Callers expect one directory holding both names: link them side by side.
    links="$CACHE_ROOT/controlplane/from-env-$(printf '%s\n%s' "$api_dir/${CRO_KUBE_APISERVER##*/}" "$etcd_dir/${CRO_ETCD##*/}" | cksum | cut -d' ' -f1)"
    mkdir -p "$links"
    ln -sfn "$api_dir/${CRO_KUBE_APISERVER##*/}" "$links/kube-apiserver"
    ln -sfn "$etcd_dir/${CRO_ETCD##*/}" "$links/etcd"
    echo "$links"
  fi
  exit 0
fi
if [[ -n "${KUBEBUILDER_ASSETS:-}" ]]; then
  if [[ -x "$KUBEBUILDER_ASSETS/kube-apiserver" && -x "$KUBEBUILDER_ASSETS/etcd" ]]; then
    log "using KUBEBUILDER_ASSETS=$KUBEBUILDER_ASSETS"
    echo "$KUBEBUILDER_ASSETS"
    exit 0
  fi
  log "KUBEBUILDER_ASSETS=$KUBEBUILDER_ASSETS lacks kube-apiserver or etcd; falling back to the cache"
fi

have() { [[ -x "$BIN_DIR/kube-apiserver" && -x "$BIN_DIR/etcd" ]]; }
if have; then
  log "reusing cached binaries in $BIN_DIR (found in ${SECONDS} s, nothing rebuilt)"
  echo "$BIN_DIR"
  exit 0
fi

command -v go >/dev/null || { log "go is needed to build kube-apiserver and etcd (or set KUBEBUILDER_ASSETS)"; exit 1; }

# One builder at a time: parallel test binaries or a second shell wait for the first.
mkdir -p "$CACHE_ROOT/controlplane"
if command -v flock >/dev/null; then
  exec 9>"$CACHE_ROOT/controlplane/.lock"
  log "waiting for any other build of $K8S_VERSION to finish"
  flock 9
else
  log "flock not found: not guarding against a concurrent build"
fi
if have; then
  log "another run built them while we waited (${SECONDS} s); reusing $BIN_DIR"
  echo "$BIN_DIR"
  exit 0
fi

WORK="$CACHE_ROOT/controlplane/$K8S_VERSION/src"
rm -rf "$WORK"
mkdir -p "$WORK" "$BIN_DIR.tmp"
cd "$WORK"

# The staging modules' published version (k8s-module.sh pins them to it).
STAGING_VERSION="v0.${K8S_VERSION#v1.}"
MINOR="${K8S_VERSION#v1.}"; MINOR="${MINOR%%.*}"
t0=$(date +%s)
# shellcheck source=tests/control-plane/k8s-module.sh
source "$SCRIPT_DIR/k8s-module.sh"
k8s_module cro.local/controlplane
cat > tools.go <<'GOSRC'
//go:build tools

package tools

import (
	_ "go.etcd.io/etcd/server/v3"
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
)
GOSRC
log "resolving modules for kube-apiserver $K8S_VERSION (staging $STAGING_VERSION)"
# tidy -e resolves what it can; anything it could not resolve fails the build below with
# go's own message, and its log stays next to the sources.
GOFLAGS=-mod=mod go mod tidy -e >tidy.log 2>&1 || log "go mod tidy reported problems; see $WORK/tidy.log"
# etcd's server version is whatever k8s.io/kubernetes requires (its client matches it).
GOFLAGS=-mod=mod go get go.etcd.io/etcd/server/v3@"$(go list -m -f '{{.Version}}' go.etcd.io/etcd/server/v3 2>/dev/null || echo v3.6.8)" >/dev/null 2>&1 || true
t1=$(date +%s)
log "modules resolved in $((t1 - t0)) s; building kube-apiserver (a cold build takes 10-20 minutes on 2 cores)"
VPKG=k8s.io/component-base/version
LDFLAGS="-s -w -X $VPKG.gitVersion=$K8S_VERSION -X $VPKG.gitMajor=1 -X $VPKG.gitMinor=$MINOR -X $VPKG.gitTreeState=clean -X $VPKG.buildDate=1970-01-01T00:00:00Z"
GOFLAGS=-mod=mod CGO_ENABLED=0 go build -trimpath -pgo=off -ldflags "$LDFLAGS" -o "$BIN_DIR.tmp/kube-apiserver" k8s.io/kubernetes/cmd/kube-apiserver
t2=$(date +%s)
log "kube-apiserver built in $((t2 - t1)) s; building etcd"
GOFLAGS=-mod=mod CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$BIN_DIR.tmp/etcd" go.etcd.io/etcd/server/v3
t3=$(date +%s)
log "etcd built in $((t3 - t2)) s; total $((t3 - t0)) s"
"$BIN_DIR.tmp/kube-apiserver" --version >&2
"$BIN_DIR.tmp/etcd" --version >&2
rm -rf "$BIN_DIR"
mv "$BIN_DIR.tmp" "$BIN_DIR"
echo "$BIN_DIR"
