//! Compiling a component within bounds. Compiling is work the host does on a
//! component's behalf before any of its budgets apply, and Cranelift's time and memory
//! grow with what the binary holds: 100,000 tiny functions in 1.8 MB took 14 s of CPU
//! and 607 MiB, 400,000 took 86 s and 2.5 GiB, which inside the operator's pod is an
//! out-of-memory kill of the operator. So:
//! 1. [`scan`] reads the binary's shape (functions, code bytes, locals, nesting) and
//!    refuses a component above `limits.compile_max_*` before compiling anything;
//! 2. the compiler runs in a child process ([`worker`]) under `limits.compile_timeout_ms`
//!    and `limits.compile_memory_bytes`, killed when it passes either, so the worst a
//!    component can cost is those bounds, paid by a process that is not the operator.
//!
//! A binary that cannot start a worker (a test process, a library user that did not
//! register one, see [`Compiler`]) compiles in process, bounded by the scan only.

pub(crate) mod scan;
pub mod worker;

use std::path::PathBuf;
use std::time::Duration;

use wasmtime::Engine;
use wasmtime::component::Component;

use crate::base::base_config;
use crate::limits::Limits;
pub use scan::Shape;

/// Where components are compiled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Compiler {
    /// In this process: bounded by the pre-scan only.
    InProcess,
    /// In a child process started from this executable (which must call
    /// [`worker::run_as_worker_or_register`] first thing in `main`), under the time and
    /// memory bounds of `limits`.
    Worker(PathBuf),
}

impl Compiler {
    /// The worker this executable registered, else in process (always, off Linux: the
    /// worker's bounds are Linux system calls).
    pub fn from_process() -> Compiler {
        match worker::registered() {
            Some(exe) if cfg!(target_os = "linux") => Compiler::Worker(exe),
            _ => Compiler::InProcess,
        }
    }
}

/// What one compile may take, from `limits`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Bounds {
    pub(crate) timeout: Duration,
    pub(crate) memory_bytes: u64,
}

impl Bounds {
    pub(crate) fn of(limits: &Limits) -> Bounds {
        Bounds {
            timeout: Duration::from_millis(limits.compile_timeout_ms),
            memory_bytes: limits.compile_memory_bytes,
        }
    }
}

/// Why a component was not compiled.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CompileError {
    /// The pre-scan found more than a limit allows; nothing was compiled.
    #[error(
        "the component has {found} {what}, more than limits.{field} ({max}) allows; it was \
         not compiled"
    )]
    TooLarge {
        field: &'static str,
        what: &'static str,
        found: u64,
        max: u64,
    },
    /// The compiler ran past `limits.compile_timeout_ms` and was killed.
    #[error(
        "compiling the component took longer than limits.compile_timeout_ms ({ms} ms); the \
         compiler was stopped"
    )]
    Timeout { ms: u64 },
    /// The compiler needed more than `limits.compile_memory_bytes` and was stopped.
    #[error(
        "compiling the component needed more than limits.compile_memory_bytes ({bytes} \
         bytes); the compiler was stopped"
    )]
    Memory { bytes: u64 },
    /// Not WebAssembly the compiler accepts.
    #[error("{0}")]
    Invalid(String),
    /// The worker could not be run (not the component's fault).
    #[error("compile worker {}: {reason}", exe.display())]
    Worker { exe: PathBuf, reason: String },
    /// The worker's output did not map into this engine.
    #[error("the compile worker's output was refused: {0}")]
    Deserialize(String),
}

impl CompileError {
    /// The `limits` field that stopped the compile, if a limit did.
    pub fn limit_field(&self) -> Option<&'static str> {
        match self {
            CompileError::TooLarge { field, .. } => Some(field),
            CompileError::Timeout { .. } => Some("compile_timeout_ms"),
            CompileError::Memory { .. } => Some("compile_memory_bytes"),
            _ => None,
        }
    }
}

/// Refuses a shape above the limits, naming the first limit it passes.
pub(crate) fn check(shape: &Shape, limits: &Limits) -> Result<(), CompileError> {
    let checks = [
        (
            "compile_max_functions",
            "functions",
            shape.functions,
            limits.compile_max_functions,
        ),
        (
            "compile_max_code_bytes",
            "bytes of code",
            shape.code_bytes,
            limits.compile_max_code_bytes,
        ),
        (
            "compile_max_locals",
            "locals in one function",
            shape.max_locals,
            u64::from(limits.compile_max_locals),
        ),
        (
            "compile_max_nesting",
            "levels of nested blocks in one function",
            shape.max_nesting,
            u64::from(limits.compile_max_nesting),
        ),
    ];
    match checks.into_iter().find(|(_, _, found, max)| found > max) {
        Some((field, what, found, max)) => Err(CompileError::TooLarge {
            field,
            what,
            found,
            max,
        }),
        None => Ok(()),
    }
}

/// Compiles with `compiler`; `max_memory_bytes` is the engine's (see
/// [`compile_config`]).
pub(crate) fn compile(
    compiler: &Compiler,
    engine: &Engine,
    max_memory_bytes: u64,
    bytes: &[u8],
    bounds: &Bounds,
) -> Result<Component, CompileError> {
    match compiler {
        Compiler::InProcess => Component::new(engine, bytes)
            .map_err(|e| CompileError::Invalid(crate::base::error_chain(&e))),
        Compiler::Worker(exe) => worker::compile(exe, engine, max_memory_bytes, bytes, bounds),
    }
}

/// Every setting that shapes compiled code, and nothing else: a compile worker
/// ([`worker`]) builds its engine from this alone, and its output maps into the runtime's
/// engine (`crate::engine`) only if the two agree (wasmtime checks). Here rather than in
/// `crate::engine`, which uses this module: the worker needs it without the engine.
pub(crate) fn compile_config(max_memory_bytes: u64) -> wasmtime::Config {
    let mut config = base_config();
    config
        .epoch_interruption(true)
        .memory_reservation(max_memory_bytes);
    config
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_limit_passed_is_named() {
        let limits = Limits::default();
        let fits = Shape {
            functions: limits.compile_max_functions,
            code_bytes: 1,
            max_locals: 0,
            max_nesting: 0,
        };
        assert_eq!(check(&fits, &limits), Ok(()));
        let wide = Shape {
            functions: limits.compile_max_functions + 1,
            ..fits
        };
        let e = check(&wide, &limits).unwrap_err();
        assert_eq!(e.limit_field(), Some("compile_max_functions"));
        assert!(
            e.to_string().contains("limits.compile_max_functions"),
            "{e}"
        );
        let deep = Shape {
            max_nesting: u64::from(limits.compile_max_nesting) + 1,
            ..fits
        };
        assert_eq!(
            check(&deep, &limits).unwrap_err().limit_field(),
            Some("compile_max_nesting")
        );
        let many_locals = Shape {
            max_locals: u64::from(limits.compile_max_locals) + 1,
            ..fits
        };
        assert_eq!(
            check(&many_locals, &limits).unwrap_err().limit_field(),
            Some("compile_max_locals")
        );
    }
}
