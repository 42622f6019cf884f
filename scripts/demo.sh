#!/usr/bin/env bash
# The local demo: installs what is needed, then runs the whole flow on this machine — a real
# kube-apiserver + etcd, the fabric simulator, the real FTI component in the sandbox, and the
# operator attaching, growing, shrinking and detaching the Go operator's README request.
# Safe to run again: every step reuses what an earlier run built.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
# shellcheck source=scripts/setup.sh
source "$ROOT/scripts/setup.sh"

step() { echo; echo "=== $* ($(date +%T))"; }
t0=$(date +%s)

step "control-plane binaries (kube-apiserver, etcd)"
BIN_DIR="$("$ROOT/tests/control-plane/ensure-binaries.sh" | tail -n 1)"
export CRO_KUBE_APISERVER="$BIN_DIR/kube-apiserver" CRO_ETCD="$BIN_DIR/etcd"
echo "using $BIN_DIR"

step "the FTI provider component (wasm32-wasip2)"
build_components -p fti-provider
COMPONENT="$ROOT/target/wasm/wasm32-wasip2/component/fti_provider.wasm"
echo
cargo run -q --locked -p cro -- provider inspect "$COMPONENT"

step "building the demo (the first run compiles the workspace: several minutes)"
cargo build -q --locked -p cro-operator --example demo

step "demo"
# Extra arguments go to the demo: --hold pauses once the request is Running.
cargo run -q --locked -p cro-operator --example demo -- "$@"

echo
echo "demo.sh finished in $(( $(date +%s) - t0 )) s"
