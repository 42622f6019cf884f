#!/usr/bin/env bash
# Provides what the real-node test tier runs besides etcd and kube-apiserver: kubelet,
# kube-controller-manager, kube-scheduler and kubectl (kubectl for people looking at the
# cluster), built once from the Go module proxy like ensure-binaries.sh builds the API
# server, into the same cache directory (outside the repository).
#
# CRO_KUBE_NODE_BIN_DIR naming a directory that holds all four skips the build.
# Prints the directory holding the four binaries as the last line of stdout.
set -euo pipefail
SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

K8S_VERSION="${CRO_K8S_VERSION:-v1.36.3}"
CACHE_ROOT="${CRO_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/cro}"
BIN_DIR="$CACHE_ROOT/controlplane/$K8S_VERSION/node-bin"
TOOLS=(kubelet kube-controller-manager kube-scheduler kubectl)

log() { echo "[node-binaries] $*" >&2; }

have() {
  local dir=$1 t
  for t in "${TOOLS[@]}"; do [[ -x "$dir/$t" ]] || return 1; done
}
if [[ -n "${CRO_KUBE_NODE_BIN_DIR:-}" ]]; then
  have "$CRO_KUBE_NODE_BIN_DIR" || { log "CRO_KUBE_NODE_BIN_DIR=$CRO_KUBE_NODE_BIN_DIR lacks one of ${TOOLS[*]}"; exit 1; }
  echo "$CRO_KUBE_NODE_BIN_DIR"
  exit 0
fi
if have "$BIN_DIR"; then
  log "reusing cached binaries in $BIN_DIR"
  echo "$BIN_DIR"
  exit 0
fi
command -v go >/dev/null || { log "go is needed to build ${TOOLS[*]}"; exit 1; }

mkdir -p "$CACHE_ROOT/controlplane"
exec 9>"$CACHE_ROOT/controlplane/.node-lock"
flock 9
if have "$BIN_DIR"; then echo "$BIN_DIR"; exit 0; fi

WORK="$CACHE_ROOT/controlplane/$K8S_VERSION/node-src"
rm -rf "$WORK" "$BIN_DIR.tmp"
mkdir -p "$WORK" "$BIN_DIR.tmp"
cd "$WORK"

MINOR="${K8S_VERSION#v1.}"; MINOR="${MINOR%%.*}"
t0=$(date +%s)
# shellcheck source=tests/control-plane/k8s-module.sh
source "$SCRIPT_DIR/k8s-module.sh"
k8s_module cro.local/nodebinaries
cat > tools.go <<'GOSRC'
//go:build tools

package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubelet"
	_ "k8s.io/kubernetes/cmd/kubectl"
)
GOSRC
GOFLAGS=-mod=mod go mod tidy -e >tidy.log 2>&1 || log "go mod tidy reported problems; see $WORK/tidy.log"
VPKG=k8s.io/component-base/version
LDFLAGS="-s -w -X $VPKG.gitVersion=$K8S_VERSION -X $VPKG.gitMajor=1 -X $VPKG.gitMinor=$MINOR -X $VPKG.gitTreeState=clean -X $VPKG.buildDate=1970-01-01T00:00:00Z"
for t in kubelet kube-controller-manager kube-scheduler kubectl; do
  t1=$(date +%s)
  pkg="k8s.io/kubernetes/cmd/$t"
  GOFLAGS=-mod=mod CGO_ENABLED=0 go build -trimpath -pgo=off -ldflags "$LDFLAGS" -o "$BIN_DIR.tmp/$t" "$pkg"
  log "$t built in $(( $(date +%s) - t1 )) s"
done
log "all built in $(( $(date +%s) - t0 )) s"
"$BIN_DIR.tmp/kubelet" --version >&2
rm -rf "$BIN_DIR"
mv "$BIN_DIR.tmp" "$BIN_DIR"
echo "$BIN_DIR"
