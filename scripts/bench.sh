#!/usr/bin/env bash
# Runs every benchmark of docs/BENCHMARKS.md and writes its report: the provider call
# path (criterion), convergence and scaling on a real API server with the fabric and
# node simulators, the operator's memory, and N requests on a real node with the
# operator as its own process. The report replaces everything below the
# marker line of docs/BENCHMARKS.md; nothing in it is written by hand.
#
#   scripts/bench.sh            # the full run (docs/BENCHMARKS.md says how long)
#   CRO_BENCH_SIZES="10:5:50 100:50:50" scripts/bench.sh   # other N:M:latency runs
#   CRO_BENCH_REAL_NODE=5 scripts/bench.sh   # 5 requests on the real node (default 10; 0 skips)
#   CRO_BENCH_DRA=8:3 scripts/bench.sh       # 8 claim Pods against a pool of 3 (default 6:2; 0 skips)
#   CRO_BENCH_REPLICAS=200:500:4 scripts/bench.sh   # replicas: devices:latency-ms:kills (default 1000:500:10; 0 skips)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
# shellcheck source=scripts/setup.sh
source "$ROOT/scripts/setup.sh"

OUT="$ROOT/target/bench"
mkdir -p "$OUT"
RESULTS="$OUT/results.jsonl"
: > "$RESULTS"
# Each step records the load average and how many compiler processes run beside it: on
# a shared machine that is what the figures must be read with.
step() {
  echo; echo "=== $* ($(date +%T))" >&2
  printf '{"kind":"load","step":"%s","load":"%s","compilers":%s}\n' "$*" \
    "$(cut -d' ' -f1-3 /proc/loadavg)" "$(ps -e -o comm= | grep -cE '^(rustc|cc1|cc1plus|ld|lld|cargo)$' || true)" >> "$RESULTS"
}
START=$(date +%s)

# N requests : M nodes : fabric latency (ms), as the issue sets them: M = 50 nodes,
# 50 ms per fabric call.
SIZES="${CRO_BENCH_SIZES:-10:50:50 100:50:50 1000:50:50}"
# Requests of 1 GPU on the real node (docs/real-node.md: root, containerd, runc; it
# waits for the machine-wide real-node lock while a test holds it); 0 skips the stage.
REAL_NODE="${CRO_BENCH_REAL_NODE:-10}"
[[ "$REAL_NODE" =~ ^[0-9]+$ ]] || { echo "CRO_BENCH_REAL_NODE must be a number, not $REAL_NODE" >&2; exit 1; }
REAL_NODE=$((10#$REAL_NODE))
# Pods:pool of the DRA stage on the real node (each Pod claims one fabric GPU; the pool
# holds fewer); 0 skips it.
DRA="${CRO_BENCH_DRA:-6:2}"
[[ "$DRA" == 0 || "$DRA" =~ ^[0-9]+:[0-9]+$ ]] || { echo "CRO_BENCH_DRA must be PODS:POOL or 0, not $DRA" >&2; exit 1; }
# Replicas sharing four providers: devices (N/2 requests of 2 GPUs), fabric latency (ms)
# and SIGKILLs of a provider's holder; 0 skips the stage.
REPLICAS="${CRO_BENCH_REPLICAS:-1000:500:10}"
[[ "$REPLICAS" == 0 || "$REPLICAS" =~ ^[0-9]+:[0-9]+:[0-9]+$ ]] || { echo "CRO_BENCH_REPLICAS must be DEVICES:LATENCY_MS:KILLS or 0, not $REPLICAS" >&2; exit 1; }

step "control-plane binaries"
BIN_DIR="$("$ROOT/tests/control-plane/ensure-binaries.sh" | tail -n 1)"
export CRO_KUBE_APISERVER="$BIN_DIR/kube-apiserver" CRO_ETCD="$BIN_DIR/etcd"

# The cluster runs use the `bench` profile (release code without line tables, the crates
# that compile components at opt-level 1: Cargo.toml says why); CRO_BENCH_PROFILE=dev
# uses the debug build (quicker to build, slower and bigger: the report says which).
PROFILE="${CRO_BENCH_PROFILE:-bench}"
step "build ($PROFILE; provider components beside it)"
BUILD_START=$(date +%s)
# The provider components (their own target directory, so no lock is shared) build
# beside the host: the host's build leaves a core idle while one crate's front end runs.
# One package per cargo invocation, exactly as the benchmarks ask for them
# (cro_test_support::component): built together, their shared dependencies get the
# union of both packages' features, and each benchmark's own request then rebuilt them
# while it was measuring.
(build_components -p fti-provider && build_components -p cro-testkit) > "$OUT/components.log" 2>&1 &
COMPONENTS_PID=$!
# The criterion benchmark is built in the same cargo invocation as cro-bench: built apart
# (`cargo bench`), its dev-dependencies resolved other features of the crates both
# share, and wasmtime, cranelift and kube were built a second time (5 min of a 15-minute
# cold build here). Both executables are then run directly, found in cargo's output.
executable() { sed -n "s/.*\"executable\":\"\([^\"]*\/$1[^\"/]*\)\".*/\1/p" | tail -n 1; }
# The operator's own executable, `cro` (host/cli), named exactly (cro-bench also starts
# with "cro"). The real-node stage runs it as a process of its own; it is built in the
# same invocation, so its shared dependencies are built once for both.
exact_executable() { sed -n "s/.*\"executable\":\"\([^\"]*\/$1\)\".*/\1/p" | tail -n 1; }
if [[ "$PROFILE" == bench ]]; then
  cargo build --profile bench --locked -p cro-bench -p cro -p cro-runtime --bins --bench provider_call \
    --message-format=json-render-diagnostics > "$OUT/build.json"
  BENCH="$(executable cro-bench < "$OUT/build.json")"
  CRO="$(exact_executable cro < "$OUT/build.json")"
else
  cargo build --locked -p cro-bench -p cro --message-format=json-render-diagnostics > "$OUT/build.json"
  BENCH="$(executable cro-bench < "$OUT/build.json")"
  CRO="$(exact_executable cro < "$OUT/build.json")"
  step "build the criterion benchmark (bench profile)"
  cargo build --profile bench --locked -p cro-runtime --bench provider_call \
    --message-format=json-render-diagnostics > "$OUT/build.json"
fi
CRITERION="$(executable provider_call- < "$OUT/build.json")"
wait "$COMPONENTS_PID" || { cat "$OUT/components.log" >&2; echo "the provider components did not build" >&2; exit 1; }
[[ -x "$BENCH" ]] || { echo "no cro-bench executable in cargo's output" >&2; exit 1; }
[[ -x "$CRO" ]] || { echo "no cro executable in cargo's output" >&2; exit 1; }
[[ -x "$CRITERION" ]] || { echo "no criterion benchmark executable in cargo's output" >&2; exit 1; }
BUILD_SECONDS=$(( $(date +%s) - BUILD_START ))

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
  printf ',"mode":"cluster runs: %s build, sizes %s, real node %s, replicas %s; criterion: bench profile, %s"}\n' "$PROFILE" "$SIZES" "$REAL_NODE" "$REPLICAS" "${CRO_BENCH_QUICK:+quick (10 samples, 1 s each)}${CRO_BENCH_QUICK:-100 samples, 3 s each after 1 s of warm-up}"
} >> "$RESULTS"

# The operator's and simulators' logs stay off: stdout carries the JSON lines.
export RUST_LOG=off
# Each convergence phase (all Running; all gone) gets at most this long, so that a
# regression cannot make the run outlast its 20-minute budget; the report then says how
# many objects were left at the deadline.
export CRO_BENCH_PHASE_DEADLINE_S="${CRO_BENCH_PHASE_DEADLINE_S:-300}"
step "operator memory"
"$BENCH" memory | grep '^{' >> "$RESULTS" || echo "memory run failed" >&2

for size in $SIZES; do
  IFS=: read -r n m l <<< "$size"
  step "convergence: $n requests × 2 GPUs over $m nodes, $l ms fabric latency"
  # A run that does not finish within the phase deadline is recorded as such (the
  # report says how far it got), so the rest of the run still happens.
  if ! "$BENCH" converge "$n" "$m" "$l" 2> "$OUT/converge-$n.err" | grep '^{' >> "$RESULTS"; then
    echo "convergence run $size failed: $(tail -n 1 "$OUT/converge-$n.err")" >&2
    printf '{"kind":"converge_failed","requests":%s,"nodes":%s,"latency_ms":%s,"error":"%s"}\n' "$n" "$m" "$l" \
      "$(tail -n 1 "$OUT/converge-$n.err" | python_free_json)" >> "$RESULTS"
  fi
done

if [[ "$REAL_NODE" != 0 ]]; then
  step "real node: $REAL_NODE requests × 1 GPU, node commands through pods/exec, the operator as its own process"
  # A failed stage is recorded (the report says why: the last line of its error output
  # that is not a hint, e.g. a missing prerequisite), so the rest of the run still happens.
  if ! CRO_BENCH_CRO="$CRO" CRO_BENCH_OPERATOR_LOG="$OUT/real-node-operator.log" \
      "$BENCH" real-node "$REAL_NODE" 2> "$OUT/real-node.err" | grep '^{' >> "$RESULTS"; then
    why="$(grep -v '^note: ' "$OUT/real-node.err" | tail -n 1 || true)"
    echo "real-node run failed: $why" >&2
    printf '{"kind":"real_node_failed","requests":%s,"error":"%s"}\n' "$REAL_NODE" "$(printf '%s' "$why" | python_free_json)" >> "$RESULTS"
  fi
fi

if [[ "$DRA" != 0 ]]; then
  pods="${DRA%%:*}" pool="${DRA##*:}"
  step "real node, DRA: $pods Pods claiming a fabric GPU each, a pool of $pool"
  if ! CRO_BENCH_CRO="$CRO" CRO_BENCH_OPERATOR_LOG="$OUT/dra-operator.log" \
      "$BENCH" real-node-dra "$pods" "$pool" 2> "$OUT/dra.err" | grep '^{' >> "$RESULTS"; then
    why="$(grep -v '^note: ' "$OUT/dra.err" | tail -n 1 || true)"
    echo "DRA run failed: $why" >&2
    printf '{"kind":"real_node_dra_failed","pods":%s,"pool":%s,"error":"%s"}\n' "$pods" "$pool" "$(printf '%s' "$why" | python_free_json)" >> "$RESULTS"
  fi
fi

if [[ "$REPLICAS" != 0 ]]; then
  IFS=: read -r rd rl rk <<< "$REPLICAS"
  step "replicas: $rd devices over 4 providers with 1, 2 and 4 replicas, $rl ms fabric latency; $rk SIGKILLs of a provider's holder"
  # The replicas are processes of cro-bench itself (`cro-bench replica`); their logs
  # go under target/bench/replicas. A failed stage is recorded like the others.
  rm -rf "$OUT/replicas"
  if ! CRO_BENCH_REPLICA_LOGS="$OUT/replicas" "$BENCH" replicas "$rd" "$rl" "$rk" 2> "$OUT/replicas.err" | grep '^{' >> "$RESULTS"; then
    why="$(tail -n 1 "$OUT/replicas.err")"
    echo "replicas run failed: $why" >&2
    printf '{"kind":"replicas_failed","devices":%s,"latency_ms":%s,"kills":%s,"error":"%s"}\n' "$rd" "$rl" "$rk" "$(printf '%s' "$why" | python_free_json)" >> "$RESULTS"
  fi
fi

step "provider call path (criterion, bench profile)"
rm -rf "$ROOT/target/criterion"
# 100 samples of 3 s each after 1 s of warm-up (criterion's defaults are 5 s after 3 s:
# a minute more for the same medians within their spread here), or with
# CRO_BENCH_QUICK=1 10 samples of 1 s, which moved the WASM / native ratios by a third
# from one run to the next. Run as `cargo bench` would: from the package's directory,
# with `--bench`, its output under the workspace's target/criterion (where the report
# reads it).
CRITERION_ARGS=(--warm-up-time 1 --measurement-time 3)
[[ -n "${CRO_BENCH_QUICK:-}" ]] && CRITERION_ARGS=()
(cd "$ROOT/host/runtime" && CRITERION_HOME="$ROOT/target/criterion" "$CRITERION" --bench "${CRITERION_ARGS[@]}" >&2) \
  || echo "criterion run failed" >&2

step "report"
REPORT="$OUT/report.md"
TOTAL=$(( $(date +%s) - START ))
RUN=$(( TOTAL - BUILD_SECONDS ))
{
  "$BENCH" report "$RESULTS" "$ROOT/target/criterion"
  echo
  echo "Whole run: $(( RUN / 60 )) min $(( RUN % 60 )) s of measuring, plus $(( BUILD_SECONDS / 60 )) min $(( BUILD_SECONDS % 60 )) s of builds (seconds when they are up to date; docs/BENCHMARKS.md says what a cold build takes)."
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
