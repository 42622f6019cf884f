#!/usr/bin/env bash
# Builds cro-standin-device-plugin once per source digest into the cache directory
# (outside the repository, so a fresh clone or CI reuses it and the tree stays clean).
# Prints the path of the binary as the last line of stdout; logs go to stderr.
set -euo pipefail

SRC_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CACHE_ROOT="${CRO_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/cro}"
NAME=cro-standin-device-plugin

log() { echo "[device-plugin] $*" >&2; }

# Keyed by content, not mtime: a fresh checkout must hit the cache, and any edit to the
# sources or the pinned dependencies must miss it.
DIGEST=$(cd "$SRC_DIR" && cat main.go go.mod go.sum | sha256sum | cut -c1-16)
OUT_DIR="$CACHE_ROOT/real-node/device-plugin-$DIGEST"
BIN="$OUT_DIR/$NAME"

if [[ -x "$BIN" ]]; then
  log "reusing $BIN"
  echo "$BIN"
  exit 0
fi

GO=$(command -v go || true)
if [[ -z "$GO" && -x /usr/local/go/bin/go ]]; then GO=/usr/local/go/bin/go; fi
[[ -n "$GO" ]] || { log "go is needed to build $NAME: not in PATH nor at /usr/local/go/bin/go"; exit 1; }

mkdir -p "$CACHE_ROOT/real-node"
exec 9>"$CACHE_ROOT/real-node/.device-plugin-lock"
flock 9
# Another run may have finished the build while we waited for the lock.
if [[ -x "$BIN" ]]; then echo "$BIN"; exit 0; fi

mkdir -p "$OUT_DIR"
# Left by a build that was killed outright (the trap below cannot run on SIGKILL).
rm -f "$OUT_DIR/.$NAME.tmp."*
TMP="$OUT_DIR/.$NAME.tmp.$$"
trap 'rm -f "$TMP"' EXIT
t0=$(date +%s)
# -mod=mod lets the build fetch modules missing from the module cache; go.sum still
# pins every one of them, so this cannot drift.
(cd "$SRC_DIR" && GOFLAGS=-mod=mod CGO_ENABLED=0 "$GO" build -trimpath -ldflags "-s -w" -o "$TMP" .)
# rename(2) is atomic: an interrupted build leaves only the temp file, never $BIN.
mv -f "$TMP" "$BIN"
trap - EXIT
log "built $BIN in $(( $(date +%s) - t0 )) s"
echo "$BIN"
