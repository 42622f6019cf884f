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
# readelf: a cli test reads the `cro` executable's dynamic section (packed relocations).
command -v readelf >/dev/null || need_apt+=(binutils)
command -v curl >/dev/null || need_apt+=(curl)
command -v flock >/dev/null || need_apt+=(util-linux)
command -v git >/dev/null || need_apt+=(git)
# Python providers and the reference fabric simulator (componentize-py, fabric_sim.py);
# JavaScript providers (componentize-js, from npm).
command -v python3 >/dev/null || need_apt+=(python3 python3-venv)
command -v npm >/dev/null || need_apt+=(nodejs npm)
# Builds the container image without a daemon or registry (deploy/image/build.sh).
command -v buildah >/dev/null || need_apt+=(buildah)
# The real-node test tier (docs/real-node.md): a kubelet's container runtime, the OCI
# runtime under it and the CNI loopback plugin, started by the tests, not by systemd.
command -v containerd >/dev/null || need_apt+=(containerd)
command -v runc >/dev/null || [[ -x /usr/sbin/runc ]] || need_apt+=(runc)
[[ -x /usr/lib/cni/loopback ]] || need_apt+=(containernetworking-plugins)
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
  # The real node's stand-in binaries are static (musl): their images have no libc.
  if ! rustup target list --installed | grep -qx x86_64-unknown-linux-musl; then
    say "adding the x86_64-unknown-linux-musl target"
    rustup target add x86_64-unknown-linux-musl
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

# componentize-py builds Python providers (providers/python-example) into components. It
# is a pinned PyPI wheel (the compiler and CPython-for-wasm ship inside it) installed in a
# venv under ~/.cache/cro/tools, keyed by the version so a bump reinstalls and a second run
# does nothing.
COMPONENTIZE_PY_VERSION=0.25.1
ensure_componentize_py() {
  local venv="$HOME/.cache/cro/tools/componentize-py-$COMPONENTIZE_PY_VERSION"
  # The marker is written last: an interrupted install never looks finished.
  if [[ ! -f "$venv/.complete" ]]; then
    command -v python3 >/dev/null || { say "python3 is missing (needed for componentize-py)"; exit 1; }
    say "installing componentize-py $COMPONENTIZE_PY_VERSION into $venv"
    rm -rf "$venv"
    mkdir -p "$(dirname "$venv")"
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check \
      "componentize-py==$COMPONENTIZE_PY_VERSION"
    touch "$venv/.complete"
  fi
  COMPONENTIZE_PY="$venv/bin/componentize-py"
  export COMPONENTIZE_PY
}

# componentize-js builds JavaScript providers (the `cro provider new --lang javascript`
# template, certified by host/cli/tests/templates). A pinned npm package (StarlingMonkey
# inside) installed under ~/.cache/cro/tools, keyed by the version; a scaffold's
# node_modules may point at it. Exports COMPONENTIZE_JS_MODULES (that node_modules).
COMPONENTIZE_JS_VERSION=0.23.0
ensure_componentize_js() {
  local dir="$HOME/.cache/cro/tools/componentize-js-$COMPONENTIZE_JS_VERSION"
  if [[ ! -f "$dir/.complete" ]]; then
    command -v npm >/dev/null || { say "npm is missing (needed for componentize-js)"; exit 1; }
    say "installing componentize-js $COMPONENTIZE_JS_VERSION into $dir"
    rm -rf "$dir"
    mkdir -p "$dir"
    (cd "$dir" && npm install --no-audit --no-fund --silent \
      "@bytecodealliance/componentize-js@$COMPONENTIZE_JS_VERSION")
    touch "$dir/.complete"
  fi
  COMPONENTIZE_JS_MODULES="$dir/node_modules"
  export COMPONENTIZE_JS_MODULES
}

# DMTF's Redfish Protocol Validator (PyPI), run by simulators/redfish/validate.sh against
# the Redfish simulator. It needs no schema files, so it runs offline. Installed in a venv
# under ~/.cache/cro/tools, keyed by its version.
RF_PROTOCOL_VALIDATOR_VERSION=1.3.2
ensure_redfish_protocol_validator() {
  local venv="$HOME/.cache/cro/tools/redfish-protocol-validator-$RF_PROTOCOL_VALIDATOR_VERSION"
  if [[ ! -f "$venv/.complete" ]]; then
    command -v python3 >/dev/null || { say "python3 is missing (needed for the Redfish validator)"; exit 1; }
    say "installing redfish-protocol-validator $RF_PROTOCOL_VALIDATOR_VERSION into $venv"
    rm -rf "$venv"
    mkdir -p "$(dirname "$venv")"
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check \
      "redfish-protocol-validator==$RF_PROTOCOL_VALIDATOR_VERSION"
    touch "$venv/.complete"
  fi
  RF_PROTOCOL_VALIDATOR="$venv/bin/rf_protocol_validator"
  export RF_PROTOCOL_VALIDATOR
}

# The Python example provider (providers/python-example) as a component, into
# target/wasm/python. Rebuilt only when its sources, the WIT it targets or the
# componentize-py version change (a stamp of their digest sits beside the output).
PYTHON_EXAMPLE_WIT=wit/since_v0.2.0
build_python_example() {
  ensure_componentize_py
  local src="$ROOT/providers/python-example" out="$ROOT/target/wasm/python"
  local wasm="$out/python_example.wasm" stamp="$out/python_example.stamp" digest
  digest="$( (echo "componentize-py $COMPONENTIZE_PY_VERSION $PYTHON_EXAMPLE_WIT";
              cd "$ROOT" && find providers/python-example "$PYTHON_EXAMPLE_WIT" -type f \
                \( -name '*.py' -o -name '*.wit' \) -not -path '*/__pycache__/*' | LC_ALL=C sort |
                xargs sha256sum) | sha256sum | cut -d' ' -f1)"
  if [[ -f "$wasm" && -f "$stamp" && "$(cat "$stamp")" == "$digest" ]]; then
    return 0
  fi
  say "building the Python example provider (componentize-py $COMPONENTIZE_PY_VERSION)"
  mkdir -p "$out"
  # Written beside the output and renamed: an interrupted build never looks finished.
  (cd "$src" && "$COMPONENTIZE_PY" -q -d "$ROOT/$PYTHON_EXAMPLE_WIT" -w provider-world \
    componentize -p "$src" app -o "$wasm.tmp")
  mv "$wasm.tmp" "$wasm"
  echo "$digest" > "$stamp"
}
