//! Compiling in a child process the host can stop: the same executable, started with
//! [`WORKER_ARG`], reads the component on stdin and writes wasmtime's serialized code on
//! stdout. A thread cannot be stopped and a process's memory cannot be bounded from
//! inside it, so this is what keeps a component that compiles for minutes or into
//! gigabytes from taking the operator down: the child's data is capped by `setrlimit`
//! (`RLIMIT_DATA`: heap and private writable mappings, not the address space wasmtime
//! only reserves), it is killed at the wall-clock deadline, it dies with the thread that
//! started it (`PR_SET_PDEATHSIG`), and the kernel's out-of-memory killer takes it before
//! the operator (`oom_score_adj` 1000) should a container limit be reached first.
//!
//! The parent maps the child's output with `Component::deserialize` into its own engine,
//! which checks it was compiled with the same settings and by the same wasmtime build.

use std::ffi::OsStr;
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, ExitStatus, Stdio};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;

use wasmtime::Engine;
use wasmtime::component::Component;

use super::{Bounds, CompileError};
use crate::base::error_chain;

/// The first argument that makes a process a compile worker.
pub const WORKER_ARG: &str = "__cro-compile-worker";

/// Exit code of a worker whose component did not compile (its error on stderr).
const EXIT_INVALID: i32 = 2;
/// Exit code of a worker started wrongly (arguments, stdin).
const EXIT_USAGE: i32 = 64;
/// Bytes of the worker's stderr kept (the compiler's error message).
const STDERR_BYTES: u64 = 16 << 10;

static WORKER_EXE: OnceLock<PathBuf> = OnceLock::new();

/// For a binary linking the runtime (the `cro` command), first thing in `main`: when this
/// process was started as a compile worker, compiles and returns the exit code;
/// otherwise records this executable as the compile worker of every runtime made later
/// with default options ([`crate::Compiler::from_process`]) and returns `None`.
pub fn run_as_worker_or_register() -> Option<ExitCode> {
    let mut args = std::env::args_os().skip(1);
    if args.next().as_deref() == Some(OsStr::new(WORKER_ARG)) {
        return Some(worker_main(args.next().as_deref()));
    }
    if let Ok(exe) = std::env::current_exe() {
        let _ = WORKER_EXE.set(exe);
    }
    None
}

/// The executable registered by [`run_as_worker_or_register`], if any.
pub(crate) fn registered() -> Option<PathBuf> {
    WORKER_EXE.get().cloned()
}

/// The worker's side: `max_memory_bytes` is the parent's `RuntimeOptions` value, the one
/// compilation setting that comes from options (bounds checks depend on it).
fn worker_main(max_memory_bytes: Option<&OsStr>) -> ExitCode {
    let Some(max_memory_bytes) = max_memory_bytes
        .and_then(OsStr::to_str)
        .and_then(|s| s.parse::<u64>().ok())
    else {
        eprintln!("usage: cro {WORKER_ARG} MAX_MEMORY_BYTES < component.wasm");
        return ExitCode::from(EXIT_USAGE as u8);
    };
    let mut bytes = Vec::new();
    if let Err(e) = io::stdin().lock().read_to_end(&mut bytes) {
        eprintln!("cannot read the component: {e}");
        return ExitCode::from(EXIT_USAGE as u8);
    }
    let compiled = Engine::new(&crate::compile::compile_config(max_memory_bytes))
        .and_then(|engine| engine.precompile_component(&bytes));
    match compiled {
        Ok(code) => match io::stdout().lock().write_all(&code) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("cannot write the compiled code: {e}");
                ExitCode::from(EXIT_USAGE as u8)
            }
        },
        Err(e) => {
            eprintln!("{}", error_chain(&e));
            ExitCode::from(EXIT_INVALID as u8)
        }
    }
}

/// The parent's side: compiles `bytes` in a worker started from `exe`, within `bounds`.
#[cfg(not(target_os = "linux"))]
pub(crate) fn compile(
    exe: &Path,
    _: &Engine,
    _: u64,
    _: &[u8],
    _: &Bounds,
) -> Result<Component, CompileError> {
    Err(CompileError::Worker {
        exe: exe.to_path_buf(),
        reason: "compile workers need Linux".into(),
    })
}

/// The parent's side: compiles `bytes` in a worker started from `exe`, within `bounds`.
#[cfg(target_os = "linux")]
pub(crate) fn compile(
    exe: &Path,
    engine: &Engine,
    max_memory_bytes: u64,
    bytes: &[u8],
    bounds: &Bounds,
) -> Result<Component, CompileError> {
    let worker_error = |reason: String| CompileError::Worker {
        exe: exe.to_path_buf(),
        reason,
    };
    let input = sys::sealed_input(bytes).map_err(|e| worker_error(format!("stdin: {e}")))?;
    let mut command = Command::new(exe);
    command
        .arg(WORKER_ARG)
        .arg(max_memory_bytes.to_string())
        // Nothing of the parent's environment (credentials, proxies) is the compiler's.
        .env_clear()
        .stdin(Stdio::from(input))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    sys::bound_child(&mut command, bounds.memory_bytes);
    let mut child = command
        .spawn()
        .map_err(|e| worker_error(format!("cannot start: {e}")))?;
    let pid = child.id();
    let (Some(mut stdout), Some(stderr)) = (child.stdout.take(), child.stderr.take()) else {
        let _ = child.kill();
        let _ = child.wait();
        return Err(worker_error("its pipes were not set up".into()));
    };
    let timed_out = AtomicBool::new(false);
    let (done, wait_done) = mpsc::channel::<()>();
    let (output, message) = std::thread::scope(|s| {
        // The deadline: killed when it passes (the process may be stuck anywhere).
        let timed_out = &timed_out;
        s.spawn(move || {
            if let Err(mpsc::RecvTimeoutError::Timeout) = wait_done.recv_timeout(bounds.timeout) {
                timed_out.store(true, Ordering::SeqCst);
                sys::kill(pid);
            }
        });
        let message = s.spawn(move || read_bounded(stderr, STDERR_BYTES));
        // Output larger than the memory bound was produced with more than the bound.
        let output = read_bounded(&mut stdout, bounds.memory_bytes.saturating_add(1));
        if output
            .as_ref()
            .is_ok_and(|o| o.len() as u64 > bounds.memory_bytes)
        {
            sys::kill(pid);
        }
        // Ended but not reaped: its pid cannot be reused while the watchdog may still
        // send its signal, so the watchdog is stopped before the child is reaped.
        sys::wait_not_reaped(pid);
        drop(done);
        let message = message.join().unwrap_or_else(|_| Ok(Vec::new()));
        (output, message)
    });
    let status = child.wait();
    let message = String::from_utf8_lossy(&message.unwrap_or_default())
        .trim()
        .to_string();
    let status = status.map_err(|e| worker_error(format!("cannot wait for it: {e}")))?;
    if timed_out.load(Ordering::SeqCst) {
        return Err(CompileError::Timeout {
            ms: bounds.timeout.as_millis() as u64,
        });
    }
    let output = output.map_err(|e| worker_error(format!("reading its output: {e}")))?;
    if output.len() as u64 > bounds.memory_bytes || ran_out_of_memory(&status, &message) {
        return Err(CompileError::Memory {
            bytes: bounds.memory_bytes,
        });
    }
    match status.code() {
        Some(0) => {}
        Some(EXIT_INVALID) => return Err(CompileError::Invalid(message)),
        _ => return Err(worker_error(format!("{status}: {message}"))),
    }
    // SAFETY: `deserialize` maps its input as native code. This is what a child started
    // from our own executable wrote for this engine's settings, read straight from its
    // pipe; wasmtime checks the settings and its own version before mapping it.
    unsafe { Component::deserialize(engine, &output) }
        .map_err(|e| CompileError::Deserialize(error_chain(&e)))
}

#[cfg(target_os = "linux")]
/// Up to `max` bytes of `r`; the rest is read and dropped, so the writer never blocks.
fn read_bounded(mut r: impl Read, max: u64) -> io::Result<Vec<u8>> {
    let mut kept = Vec::new();
    (&mut r).take(max).read_to_end(&mut kept)?;
    io::copy(&mut r, &mut io::sink())?;
    Ok(kept)
}

#[cfg(target_os = "linux")]
/// Rust aborts when an allocation fails (`RLIMIT_DATA` reached), after saying so; a
/// mapping wasmtime makes fails with `ENOMEM`; the kernel's out-of-memory killer sends
/// SIGKILL.
fn ran_out_of_memory(status: &ExitStatus, message: &str) -> bool {
    use std::os::unix::process::ExitStatusExt;
    let said_so = (message.contains("memory allocation") && message.contains("failed"))
        || message.contains("Cannot allocate memory");
    status.signal() == Some(libc::SIGKILL) || said_so
}

#[cfg(target_os = "linux")]
mod sys {
    use std::fs::File;
    use std::io::{self, Seek, Write};
    use std::os::fd::FromRawFd;
    use std::os::unix::process::CommandExt;
    use std::process::Command;

    /// The component in an anonymous memory file, read by the worker as its stdin: no
    /// pipe to write to a child that may die (which would raise SIGPIPE in a command that
    /// restored its default action), and no file on disk.
    pub(super) fn sealed_input(bytes: &[u8]) -> io::Result<File> {
        // SAFETY: a plain system call with a NUL-terminated name; the result is checked.
        let fd = unsafe { libc::memfd_create(c"cro-component".as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` was just created and is owned by nothing else.
        let mut file = unsafe { File::from_raw_fd(fd) };
        file.write_all(bytes)?;
        file.rewind()?;
        Ok(file)
    }

    /// Bounds the child before it runs: its data, no core dump, killed with the thread
    /// that started it, first in line for the out-of-memory killer.
    pub(super) fn bound_child(command: &mut Command, memory_bytes: u64) {
        // SAFETY: between fork and exec only async-signal-safe system calls are made, on
        // values computed before the fork; their failures are reported as errors of exec.
        unsafe {
            command.pre_exec(move || {
                let data = libc::rlimit {
                    rlim_cur: memory_bytes as libc::rlim_t,
                    rlim_max: memory_bytes as libc::rlim_t,
                };
                if libc::setrlimit(libc::RLIMIT_DATA, &data) != 0 {
                    return Err(io::Error::last_os_error());
                }
                let none = libc::rlimit {
                    rlim_cur: 0,
                    rlim_max: 0,
                };
                libc::setrlimit(libc::RLIMIT_CORE, &none);
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(io::Error::last_os_error());
                }
                // Best effort: without /proc the other bounds still hold.
                let fd = libc::open(c"/proc/self/oom_score_adj".as_ptr(), libc::O_WRONLY);
                if fd >= 0 {
                    libc::write(fd, b"1000".as_ptr().cast(), 4);
                    libc::close(fd);
                }
                Ok(())
            });
        }
    }

    /// Waits until the child has ended, leaving it to be reaped (`WNOWAIT`).
    pub(super) fn wait_not_reaped(pid: u32) {
        loop {
            // SAFETY: `info` is a plain C struct the kernel fills; the result is checked.
            let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
            let r = unsafe {
                libc::waitid(
                    libc::P_PID,
                    pid as libc::id_t,
                    &mut info,
                    libc::WEXITED | libc::WNOWAIT,
                )
            };
            if r == 0 || io::Error::last_os_error().kind() != io::ErrorKind::Interrupted {
                return;
            }
        }
    }

    pub(super) fn kill(pid: u32) {
        // SAFETY: a signal to our own child, which has not been waited for yet (the
        // caller waits after this), so its pid cannot have been reused.
        unsafe {
            libc::kill(pid as libc::pid_t, libc::SIGKILL);
        }
    }
}
