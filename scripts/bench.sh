#!/usr/bin/env bash
# Runs every benchmark of docs/BENCHMARKS.md and writes its report: the provider call
# path (criterion), convergence and scaling on a real API server with the fabric and
# node simulators, the operator's memory. The report replaces everything below the
# marker line of docs/BENCHMARKS.md; nothing in it is written by hand.
#
#   scripts/bench.sh            # the full run (about 15 min on 2 cores once built)
#   CRO_BENCH_SIZES="10:5 100:50" scripts/bench.sh   # other N:M convergence runs
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
# shellcheck source=scripts/setup.sh
source "$ROOT/scripts/setup.sh"

step() { echo; echo "=== $* ($(date +%T))" >&2; }
START=$(date +%s)
OUT="$ROOT/target/bench"
mkdir -p "$OUT"
RESULTS="$OUT/results.jsonl"
: > "$RESULTS"

# N requests : M nodes : fabric latency (ms). N = 1000 runs with 100 nodes: at 50 nodes
# its 2000 devices queue 40 deep per node (attaches on one node run one at a time), which
# does not fit the 20-minute budget on 2 cores.
SIZES="${CRO_BENCH_SIZES:-10:5:50 100:50:50 300:100:50 1000:100:50}"

step "control-plane binaries and provider components"
BIN_DIR="$("$ROOT/tests/control-plane/ensure-binaries.sh" | tail -n 1)"
export CRO_KUBE_APISERVER="$BIN_DIR/kube-apiserver" CRO_ETCD="$BIN_DIR/etcd"
build_components -p fti-provider -p cro-testkit

# The cluster runs use a release build; CRO_BENCH_PROFILE=dev uses the debug build (quicker
# to build, slower and bigger: the report says which).
PROFILE="${CRO_BENCH_PROFILE:-release}"
step "build ($PROFILE)"
if [[ "$PROFILE" == release ]]; then
  cargo build --release --locked -p cro-bench
  BENCH="$ROOT/target/release/cro-bench"
else
  cargo build --locked -p cro-bench
  BENCH="$ROOT/target/debug/cro-bench"
fi

lockver() { awk -v n="$1" '$0=="name = \""n"\"" {getline; gsub(/version = |"/,""); print; exit}' Cargo.lock; }
cores=$(nproc)
python_free_json() { sed 's/\\/\\\\/g; s/"/\\"/g'; }
{
  printf '{"kind":"meta","date":"%s"' "$(date -u '+%Y-%m-%d %H:%M')"
  printf ',"cpu":"%s"' "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//' | python_free_json)"
  printf ',"cores":"%s"' "$cores"
  printf ',"memory":"%s"' "$(awk '/MemTotal/ {printf "%.1f GiB", $2/1048576}' /proc/meminfo)"
  printf ',"load":"%s"' "$(cut -d' ' -f1-3 /proc/loadavg)"
  printf ',"shared":"%s"' "${CRO_BENCH_MACHINE:-shared: other builds may run meanwhile (figures are medians and ratios of one run)}"
  printf ',"rustc":"%s"' "$(rustc -V)"
  printf ',"wasmtime":"%s"' "$(lockver wasmtime)"
  printf ',"kube":"%s"' "$(lockver kube)"
  printf ',"apiserver":"%s"' "$(basename "$(dirname "$BIN_DIR")")"
  printf ',"commit":"%s"' "$(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
  printf ',"mode":"cluster runs: %s build, sizes %s; criterion: release build, %s"}\n' "$PROFILE" "$SIZES" "${CRO_BENCH_FULL:+full}${CRO_BENCH_FULL:-quick (10 samples, 1 s each)}"
} >> "$RESULTS"

# The operator's and simulators' logs stay off: stdout carries the JSON lines.
export RUST_LOG=off
step "operator memory"
"$BENCH" memory | grep '^{' >> "$RESULTS" || echo "memory run failed" >&2

for size in $SIZES; do
  IFS=: read -r n m l <<< "$size"
  step "convergence: $n requests × 2 GPUs over $m nodes, $l ms fabric latency"
  if ! "$BENCH" converge "$n" "$m" "$l" | grep '^{' >> "$RESULTS"; then
    echo "convergence run $size failed" >&2
  fi
done

step "provider call path (criterion, release build)"
rm -rf "$ROOT/target/criterion"
if [[ -z "${CRO_BENCH_FULL:-}" ]]; then export CRO_BENCH_QUICK=1; fi
cargo bench --locked -p cro-runtime --bench provider_call >&2 || echo "criterion run failed" >&2

step "report"
REPORT="$OUT/report.md"
{
  "$BENCH" report "$RESULTS" "$ROOT/target/criterion"
  echo
  echo "Whole run: $(( ($(date +%s) - START) / 60 )) min $(( ($(date +%s) - START) % 60 )) s (builds included)."
} > "$REPORT"
DOC="$ROOT/docs/BENCHMARKS.md"
MARKER='<!-- report: everything below is written by scripts/bench.sh -->'
if grep -qF "$MARKER" "$DOC"; then
  sed -i "/^$(printf '%s' "$MARKER" | sed 's/[]\/$*.^[]/\\&/g')\$/q" "$DOC"
else
  printf '\n%s\n' "$MARKER" >> "$DOC"
fi
cat "$REPORT" >> "$DOC"
echo "report written to docs/BENCHMARKS.md" >&2
