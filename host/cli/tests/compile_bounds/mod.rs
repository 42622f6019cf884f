//! Compiling a component is bounded: the pre-scan refuses a component above
//! `limits.compile_max_*` before anything is compiled, and the compiler, run in a worker
//! process of the `cro` binary, is stopped at `limits.compile_timeout_ms` and
//! `limits.compile_memory_bytes` with a typed error naming the limit. The FTI provider's
//! whole conformance suite runs beside these attacks, in the same runtime, and passes.
//! (Compiling 100,000 empty functions took 14 s of CPU and 607 MiB in the operator's
//! process before: at the download limit, an out-of-memory kill of the operator.)

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use cro_runtime::cluster::StaticCluster;
use cro_runtime::{CompileError, Compiler, LoadError, ProviderSpec, Runtime, RuntimeOptions};

/// A component holding one core module of `n` functions that do nothing: a few bytes
/// each to send, Cranelift's whole per-function cost each to compile.
pub fn wide_component(n: u32) -> Vec<u8> {
    let mut module = b"\0asm\x01\0\0\0".to_vec();
    // One function type, [] -> [].
    section(&mut module, 1, &[1, 0x60, 0, 0]);
    let mut funcs = leb(n);
    funcs.extend(std::iter::repeat_n(0u8, n as usize));
    section(&mut module, 3, &funcs);
    let mut code = leb(n);
    for _ in 0..n {
        // Body of 2 bytes: no locals, `end`.
        code.extend([2, 0, 0x0b]);
    }
    section(&mut module, 10, &code);
    let mut component = b"\0asm\x0d\0\x01\0".to_vec();
    // Section 1 of a component: a core module.
    section(&mut component, 1, &module);
    component
}

fn section(out: &mut Vec<u8>, id: u8, body: &[u8]) {
    out.push(id);
    out.extend(leb(body.len() as u32));
    out.extend(body);
}

fn leb(mut n: u32) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let byte = (n & 0x7f) as u8;
        n >>= 7;
        if n == 0 {
            out.push(byte);
            return out;
        }
        out.push(byte | 0x80);
    }
}

fn cro_exe() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_cro"))
}

fn worker_options() -> RuntimeOptions {
    RuntimeOptions {
        compiler: Compiler::Worker(cro_exe()),
        // Every load compiles: a cache hit would skip what is measured.
        component_cache: None,
        ..cro_conformance::tool_runtime_options()
    }
}

async fn load(runtime: &Runtime, spec: &ProviderSpec, bytes: Vec<u8>) -> Result<(), LoadError> {
    runtime
        .load_bytes(spec, bytes, Arc::new(StaticCluster::new()))
        .await
        .map(|_| ())
}

/// The attacks, one after another, each with the limit it should hit.
async fn attacks(runtime: &Runtime) {
    let defaults = cro_runtime::Limits::default();
    let spec = ProviderSpec::new("wide", "wide.wasm");

    // Above the function limit: refused by the pre-scan, nothing compiled.
    let n = u32::try_from(defaults.compile_max_functions + 1).unwrap();
    let started = Instant::now();
    let err = load(runtime, &spec, wide_component(n)).await.unwrap_err();
    eprintln!("pre-scan refusal of {n} functions: {:?}", started.elapsed());
    let LoadError::Compile(e @ CompileError::TooLarge { .. }) = &err else {
        panic!("{err:?}")
    };
    assert_eq!(e.limit_field(), Some("compile_max_functions"));
    assert!(
        err.to_string().contains("limits.compile_max_functions"),
        "{err}"
    );

    // Within the scan's limits but slow to compile: stopped at the deadline.
    let mut slow = spec.clone();
    slow.limits.compile_timeout_ms = 500;
    let started = Instant::now();
    let err = load(runtime, &slow, wide_component(40_000))
        .await
        .unwrap_err();
    eprintln!("compile stopped at 500 ms after {:?}", started.elapsed());
    assert!(
        matches!(err, LoadError::Compile(CompileError::Timeout { ms: 500 })),
        "{err:?}"
    );
    assert!(
        err.to_string().contains("limits.compile_timeout_ms"),
        "{err}"
    );

    // Within the scan's limits but needing more memory than allowed: stopped.
    let mut tight = spec.clone();
    tight.limits.compile_memory_bytes = 96 << 20;
    let err = load(runtime, &tight, wide_component(40_000))
        .await
        .unwrap_err();
    assert!(
        matches!(err, LoadError::Compile(CompileError::Memory { bytes }) if bytes == 96 << 20),
        "{err:?}"
    );
    assert!(
        err.to_string().contains("limits.compile_memory_bytes"),
        "{err}"
    );

    // A small one compiles in the worker and maps back into the runtime's engine: what
    // stops its load is that it is no provider, not its compilation.
    let err = load(runtime, &spec, wide_component(10)).await.unwrap_err();
    assert!(matches!(err, LoadError::WrongWorld { .. }), "{err:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compiling_is_bounded_beside_a_well_behaved_fti_provider() {
    let runtime = Runtime::new(worker_options()).unwrap();
    let fti = cro_test_support::component("fti-provider");
    let mut opts = cro_conformance::SuiteOptions::new(fti);
    opts.runtime = worker_options();
    let suite = async {
        let started = Instant::now();
        let report = cro_conformance::run_simulated(&opts).await.unwrap();
        (report, started.elapsed())
    };
    let ((report, took), ()) = tokio::join!(suite, attacks(&runtime));
    eprintln!("FTI suite beside the attacks: {took:?}");
    let failed: Vec<_> = report
        .checks
        .iter()
        .filter(|c| c.status == cro_conformance::Status::Fail)
        .map(|c| format!("{}: {}", c.name, c.why))
        .collect();
    assert!(report.passed(), "{failed:#?}");
}

/// `cro provider inspect` compiles in its own worker: the pre-scan's refusal names the
/// limit, and nothing is compiled.
#[test]
fn inspect_refuses_a_component_above_the_compile_limits() {
    let dir = tempfile::tempdir().unwrap();
    let n = u32::try_from(cro_runtime::Limits::default().compile_max_functions + 1).unwrap();
    let path = dir.path().join("wide.wasm");
    std::fs::write(&path, wide_component(n)).unwrap();
    let (ok, _, stderr) = super::inspect(&path, &[]);
    assert!(!ok);
    assert!(stderr.contains("limits.compile_max_functions"), "{stderr}");
}
