#!/usr/bin/env bash
# Installs everything the demo and the tests need; safe to run again (each step checks
# first). Sourced by scripts/demo.sh and scripts/test.sh.
set -euo pipefail

say() { echo "[setup] $*" >&2; }
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

# Debian packages: a C toolchain for ring/wasmtime, and Go, which builds kube-apiserver and
# etcd for the tests. Only asked for when missing so a second run does nothing.
need_apt=()
command -v cc >/dev/null || need_apt+=(build-essential)
command -v curl >/dev/null || need_apt+=(curl)
command -v flock >/dev/null || need_apt+=(util-linux)
command -v git >/dev/null || need_apt+=(git)
# Builds the container image without a daemon or registry (deploy/image/build.sh).
command -v buildah >/dev/null || need_apt+=(buildah)
if ((${#need_apt[@]})); then
  say "installing ${need_apt[*]}"
  if [[ $(id -u) -eq 0 ]]; then SUDO=""; else SUDO="sudo"; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}"
fi

if ! command -v cargo >/dev/null; then
  if [[ -x "$HOME/.cargo/bin/cargo" ]]; then
    export PATH="$HOME/.cargo/bin:$PATH"
  else
    say "Rust is missing: install rustup (https://rustup.rs) with Rust 1.95 or newer"; exit 1
  fi
fi
if command -v rustup >/dev/null; then
  if ! rustup target list --installed | grep -qx wasm32-wasip2; then
    say "adding the wasm32-wasip2 target"
    rustup target add wasm32-wasip2
  fi
  for comp in rustfmt clippy; do
    rustup component list --installed | grep -q "^$comp" || rustup component add "$comp"
  done
else
  say "rustup not found: make sure the wasm32-wasip2 target is installed"
fi

if ! command -v go >/dev/null; then
  if [[ -x /usr/local/go/bin/go ]]; then
    export PATH="/usr/local/go/bin:$PATH"
  else
    say "installing Go from Debian (builds kube-apiserver and etcd for the tests)"
    if [[ $(id -u) -eq 0 ]]; then SUDO=""; else SUDO="sudo"; fi
    $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq golang-go
  fi
fi

# helm and kustomize for the deployment tests (deploy/helm, deploy/kustomize), and crane
# for the loopback OCI registry of the component-source tests: built once from the Go
# module proxy into ~/.cache/cro/tools (a few minutes cold, nothing after).
ensure_deploy_tools() {
  "$ROOT/deploy/tools/ensure-tools.sh" helm kustomize crane >/dev/null
}

# Provider components live in their own target dir so a test that builds one while
# `cargo test` holds the workspace lock never deadlocks.
build_components() {
  say "building provider components for wasm32-wasip2"
  (cd "$ROOT" && CARGO_TARGET_DIR="$ROOT/target/wasm" cargo build --profile component --locked \
    --target wasm32-wasip2 "$@")
}
