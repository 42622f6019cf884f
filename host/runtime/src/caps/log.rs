//! The `log` capability: the guest's messages into the host's `tracing`, tagged with the
//! provider's name. Always granted, never free:
//! - every message is clipped to [`MESSAGE_BYTES`] and its control characters escaped,
//!   so a `\n` cannot forge a second line and a megabyte message makes one short line;
//! - one call may write `limits.log_lines_per_call` lines and `limits.log_bytes_per_call`
//!   bytes; past either the call fails with `CallError::Budget` (a provider logging in a
//!   loop is broken, and saying so beats a silent flood);
//! - the provider as a whole may write `limits.log_lines_per_minute` lines and
//!   `limits.log_bytes_per_minute` bytes; past either, lines are dropped (and counted)
//!   until the minute is over, so many well-behaved calls cannot flood the log either.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use wasmtime::component::{HasSelf, Linker};
use wasmtime_wasi::WasiView;

use super::capability::{CallSetup, Capability, Declared, Findings, Load, NoGrant, SetupError};
use crate::base::{FieldError, clip};
use crate::budget::{Admit, Budget, BudgetCounters, BudgetExceeded, MinuteWindow};
use crate::gate::{CapabilityKind, Check, Gate};
use crate::limits::Limits;

/// The `cro:provider/log` import's bindings, as every served contract version imports it
/// (unchanged since 0.1.0; the version modules in `crate::wit` map it here).
pub(crate) mod wit {
    wasmtime::component::bindgen!({
        path: "../../wit/since_v0.1.0",
        inline: "
            package cro-host:log;
            world imports {
                import cro:provider/log@0.1.0;
            }
        ",
        world: "cro-host:log/imports",
        imports: {
            // The log budget ends a call that logs past it.
            "cro:provider/log.log": trappable,
        },
    });

    pub(crate) use self::cro::provider::log::*;
}

/// The capability, as `crate::caps` registers it.
pub(crate) struct LogCap;

impl Capability for LogCap {
    const NAME: &'static str = "log";
    type Grant = NoGrant;
    type Shared = Log;
    type Call = LogCall;

    fn validate(_: &NoGrant) -> Result<(), FieldError> {
        Ok(())
    }

    fn load(_: &NoGrant, load: &Load<'_>) -> Result<Log, SetupError> {
        Ok(Log::new(
            load.provider.to_string(),
            load.gate.clone(),
            load.budgets.clone(),
            load.limits,
        ))
    }

    fn call(shared: &Arc<Log>, _: &CallSetup) -> LogCall {
        LogCall::new(shared.clone())
    }

    fn add_to_linker<T: WasiView + 'static>(
        linker: &mut Linker<T>,
        get: fn(&mut T) -> &mut LogCall,
    ) -> wasmtime::Result<()> {
        wit::add_to_linker::<T, HasSelf<LogCall>>(linker, get)
    }

    /// Always granted and never declared: nothing to compare.
    fn report(_: &NoGrant, _: &Declared<'_>, _: &mut Findings) {}

    #[cfg(test)]
    fn example() -> NoGrant {
        NoGrant
    }
}

/// Writing a log line: always allowed (the budgets bound it).
pub(crate) struct WriteLog;

impl Check for WriteLog {
    fn kind(&self) -> Option<CapabilityKind> {
        None
    }

    fn decide(&self) -> Result<(), String> {
        Ok(())
    }
}

/// Bytes of one guest message kept in its log line.
pub const MESSAGE_BYTES: usize = 4 * 1024;

/// The provider's side.
pub(crate) struct Log {
    provider: String,
    gate: Arc<Gate>,
    counters: Arc<BudgetCounters>,
    lines_per_call: u64,
    bytes_per_call: u64,
    minute: Mutex<MinuteWindow>,
    /// Warnings and errors the provider logged (for metrics: e.g. a node it skipped),
    /// counted even when the minute's budget drops the line itself.
    warnings: AtomicU64,
}

impl Log {
    pub(crate) fn new(
        provider: String,
        gate: Arc<Gate>,
        counters: Arc<BudgetCounters>,
        limits: &Limits,
    ) -> Log {
        Log {
            provider,
            gate,
            counters,
            lines_per_call: u64::from(limits.log_lines_per_call),
            bytes_per_call: limits.log_bytes_per_call,
            minute: Mutex::new(MinuteWindow::new(
                u64::from(limits.log_lines_per_minute),
                limits.log_bytes_per_minute,
                Instant::now(),
            )),
            warnings: AtomicU64::new(0),
        }
    }

    /// Warnings and errors logged so far.
    pub(crate) fn warnings(&self) -> u64 {
        self.warnings.load(Ordering::Relaxed)
    }
}

/// A guest's log message as it appears in our log line: clipped, then quoted and
/// escaped as Rust's `Debug` does (no control or invisible character, its own quotes and
/// backslashes escaped), so
/// that no text of the guest's can pass for a field of the line in a text log
/// (`provider=...` after the message is ours).
fn quoted_message(message: &str) -> String {
    let kept = clip(message, MESSAGE_BYTES);
    // Debug quoting escapes quotes, backslashes, control and format characters.
    let mut line = format!("{kept:?}");
    if kept.len() < message.len() {
        line.push_str(&format!(
            "… [{} more bytes cut]",
            message.len() - kept.len()
        ));
    }
    line
}

fn level_name(level: wit::Level) -> &'static str {
    match level {
        wit::Level::Trace => "trace",
        wit::Level::Debug => "debug",
        wit::Level::Info => "info",
        wit::Level::Warn => "warn",
        wit::Level::Error => "error",
    }
}

/// One call's side: what it has written so far.
pub(crate) struct LogCall {
    shared: Arc<Log>,
    lines: u64,
    bytes: u64,
}

impl LogCall {
    pub(crate) fn new(shared: Arc<Log>) -> LogCall {
        LogCall {
            shared,
            lines: 0,
            bytes: 0,
        }
    }
}

impl wit::Host for LogCall {
    fn log(&mut self, level: wit::Level, message: String) -> wasmtime::Result<()> {
        let shared = &self.shared;
        if shared.gate.check(&WriteLog).is_err() {
            return Ok(());
        }
        let line = quoted_message(&message);
        // Free the guest's copy now: it may be as large as the host-call budget.
        drop(message);
        self.lines += 1;
        self.bytes += line.len() as u64;
        let over = if self.lines > shared.lines_per_call {
            Some((Budget::LogLines, shared.lines_per_call))
        } else if self.bytes > shared.bytes_per_call {
            Some((Budget::LogBytes, shared.bytes_per_call))
        } else {
            None
        };
        if let Some((budget, limit)) = over {
            shared.counters.hit(budget);
            return Err(wasmtime::Error::new(BudgetExceeded { budget, limit }));
        }
        if matches!(level, wit::Level::Warn | wit::Level::Error) {
            shared.warnings.fetch_add(1, Ordering::Relaxed);
        }
        // A tool's trace shows every line within the call's budget, even those the
        // per-minute rate keeps out of the host's log.
        shared.gate.logged(level_name(level), &line);
        let admit = shared
            .minute
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .admit(line.len() as u64, Instant::now());
        let provider = shared.provider.as_str();
        match admit {
            Admit::Yes { dropped_before } => {
                if dropped_before > 0 {
                    tracing::warn!(
                        target: "cro_provider",
                        provider,
                        "{dropped_before} log lines of the provider were dropped in the last minute (limits.log_lines_per_minute/log_bytes_per_minute)"
                    );
                }
            }
            Admit::No { first } => {
                if first {
                    shared.counters.hit(Budget::LogRate);
                    tracing::warn!(
                        target: "cro_provider",
                        provider,
                        "the provider is over its log budget for this minute (limits.log_lines_per_minute/log_bytes_per_minute): its further lines are dropped until the minute is over"
                    );
                }
                return Ok(());
            }
        }
        match level {
            wit::Level::Trace => tracing::trace!(target: "cro_provider", provider, "{line}"),
            wit::Level::Debug => tracing::debug!(target: "cro_provider", provider, "{line}"),
            wit::Level::Info => tracing::info!(target: "cro_provider", provider, "{line}"),
            wit::Level::Warn => tracing::warn!(target: "cro_provider", provider, "{line}"),
            wit::Level::Error => tracing::error!(target: "cro_provider", provider, "{line}"),
        }
        Ok(())
    }
}
