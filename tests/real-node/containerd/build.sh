#!/usr/bin/env bash
# Builds containerd and its runc shim once, from the Go module proxy, into the cache
# directory (outside the repository). The real node runs this containerd rather than
# Debian's 1.6.20: a DRA kubelet plugin hands a container its device as a CDI device,
# and containerd reads CDI specs only from 1.7 on (`enable_cdi`). 1.7 keeps the
# configuration format (version 2) and the shim layout the node already uses.
#
# CRO_CONTAINERD_BIN_DIR naming a directory that holds both skips the build.
# Prints the directory holding both binaries as the last line of stdout.
set -euo pipefail

VERSION="${CRO_CONTAINERD_VERSION:-v1.7.35}"
CACHE_ROOT="${CRO_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/cro}"
BIN_DIR="$CACHE_ROOT/real-node/containerd-$VERSION"
TOOLS=(containerd containerd-shim-runc-v2)

log() { echo "[containerd] $*" >&2; }

have() {
  local dir=$1 t
  for t in "${TOOLS[@]}"; do [[ -x "$dir/$t" ]] || return 1; done
}
if [[ -n "${CRO_CONTAINERD_BIN_DIR:-}" ]]; then
  have "$CRO_CONTAINERD_BIN_DIR" || { log "CRO_CONTAINERD_BIN_DIR=$CRO_CONTAINERD_BIN_DIR lacks one of ${TOOLS[*]}"; exit 1; }
  echo "$CRO_CONTAINERD_BIN_DIR"
  exit 0
fi
if have "$BIN_DIR"; then
  log "reusing $BIN_DIR"
  echo "$BIN_DIR"
  exit 0
fi

GO=$(command -v go || true)
if [[ -z "$GO" && -x /usr/local/go/bin/go ]]; then GO=/usr/local/go/bin/go; fi
[[ -n "$GO" ]] || { log "go is needed to build containerd $VERSION: not in PATH nor at /usr/local/go/bin/go"; exit 1; }

mkdir -p "$CACHE_ROOT/real-node"
exec 9>"$CACHE_ROOT/real-node/.containerd-lock"
flock 9
if have "$BIN_DIR"; then echo "$BIN_DIR"; exit 0; fi

t0=$(date +%s)
WORK="$CACHE_ROOT/real-node/containerd-src"
rm -rf "$WORK" "$BIN_DIR.tmp"
mkdir -p "$BIN_DIR.tmp"
# `go install module@version` refuses a module whose go.mod has exclude directives
# (containerd's has): build inside a copy of the module instead.
SRC=$("$GO" mod download -json "github.com/containerd/containerd@$VERSION" \
  | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
[[ -n "$SRC" && -d "$SRC" ]] || { log "go mod download gave no directory for containerd $VERSION"; exit 1; }
cp -r "$SRC" "$WORK"
chmod -R u+w "$WORK"
cd "$WORK"
# Static, without the snapshotters whose C headers are not installed; the node uses overlayfs.
CGO_ENABLED=0 GOFLAGS="-mod=mod -buildvcs=false" "$GO" build -trimpath \
  -tags no_btrfs,no_devmapper,no_zfs,no_aufs \
  -ldflags "-s -w -X github.com/containerd/containerd/version.Version=$VERSION" \
  -o "$BIN_DIR.tmp/" ./cmd/containerd ./cmd/containerd-shim-runc-v2
"$BIN_DIR.tmp/containerd" --version >&2
rm -rf "$BIN_DIR" "$WORK"
mv "$BIN_DIR.tmp" "$BIN_DIR"
log "built in $(( $(date +%s) - t0 )) s"
echo "$BIN_DIR"
