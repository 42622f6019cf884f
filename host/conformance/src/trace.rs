//! What a provider's calls did, as the runtime's capability observer reports it: the
//! trace `cro provider call` prints and the record the suite's checks read.

use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use cro_runtime::{
    CallStats, CapabilityKind, CapabilityObserver, CapabilityUse, UseOutcome, escape_line,
};
use serde::Serialize;

use crate::redact::{ExchangeRecord, Redactor};

/// Uses kept per recorder; a provider looping on a capability cannot grow it further
/// (what is left out is counted).
const MAX_USES: usize = 10_000;
/// Bytes of text (targets and reasons) kept per recorder, whatever the observer was
/// handed: a trace printed to a vendor's terminal or CI log stays readable.
const MAX_TEXT_BYTES: usize = 2 << 20;
/// Bytes of one use's target or reason kept (before escaping).
const USE_TEXT_BYTES: usize = 512;

/// Collects every capability use and call end of one provider.
#[derive(Debug, Default)]
pub struct Recorder {
    inner: Mutex<Recorded>,
    /// Set: HTTP uses carry their headers and bodies, redacted by this.
    exchanges: Option<Redactor>,
}

#[derive(Debug, Default)]
struct Recorded {
    logs: Vec<LogRecord>,
    logs_dropped: u64,
    pending: Vec<(CapabilityUse, Option<ExchangeRecord>)>,
    /// Text bytes of `pending`.
    text_bytes: usize,
    calls: Vec<CallStats>,
    dropped: u64,
}

/// One provider call as the suite and `cro provider call` report it.
#[derive(Debug, Clone, Serialize)]
pub struct CallTrace {
    pub operation: String,
    /// `ok: ...` or the error.
    pub outcome: String,
    pub duration_ms: f64,
    pub peak_memory_bytes: u64,
    pub uses: Vec<UseRecord>,
    /// Uses left out because the recorder was full.
    #[serde(skip_serializing_if = "is_zero")]
    pub uses_dropped: u64,
    /// What the provider logged during the call, in order.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub logs: Vec<LogRecord>,
    /// Log lines left out because the recorder was full.
    #[serde(skip_serializing_if = "is_zero")]
    pub logs_dropped: u64,
}

/// One line the provider logged.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LogRecord {
    pub level: &'static str,
    /// Quoted and escaped as in the host's log line.
    pub message: String,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// One capability use, flattened for text and JSON.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct UseRecord {
    pub capability: CapabilityKind,
    /// `allowed`, `failed` or `denied`.
    pub decision: &'static str,
    pub target: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<u16>,
    pub bytes: u64,
    /// Why it failed or was denied.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    pub duration_ms: f64,
    /// Headers and bodies, redacted (`cro provider call --trace-bodies`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exchange: Option<ExchangeRecord>,
}

impl UseRecord {
    pub fn from_use(u: &CapabilityUse) -> UseRecord {
        let (decision, status, bytes, detail) = match &u.outcome {
            UseOutcome::Allowed { status, bytes } => ("allowed", *status, *bytes, None),
            UseOutcome::Failed(why) => ("failed", None, 0, Some(why.clone())),
            UseOutcome::Denied(why) => ("denied", None, 0, Some(why.clone())),
        };
        UseRecord {
            capability: u.capability,
            decision,
            target: u.target.clone(),
            status,
            bytes,
            detail,
            duration_ms: millis(u.duration),
            exchange: None,
        }
    }

    pub fn denied(&self) -> bool {
        self.decision == "denied"
    }

    /// One line: `http GET https://... -> 200, 512 B, 3.1 ms`.
    pub fn line(&self) -> String {
        let what = match (self.decision, self.status, &self.detail) {
            ("allowed", Some(status), _) => format!("{status}, {} B", self.bytes),
            ("allowed", None, _) => format!("ok, {} B", self.bytes),
            (decision, _, Some(why)) => format!("{}: {why}", decision.to_uppercase()),
            (decision, _, None) => decision.to_uppercase(),
        };
        let kind = match self.capability {
            CapabilityKind::Http => "http",
            CapabilityKind::Secret => "secret",
            CapabilityKind::Lookup => "lookup",
        };
        format!(
            "{kind} {} -> {what}, {:.1} ms",
            self.target, self.duration_ms
        )
    }
}

pub fn millis(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

impl Recorder {
    pub fn new() -> Recorder {
        Recorder::default()
    }

    /// A recorder whose HTTP uses carry their headers and bodies, with credentials taken
    /// out by `redactor`.
    pub fn with_exchanges(redactor: Redactor) -> Recorder {
        Recorder {
            inner: Mutex::default(),
            exchanges: Some(redactor),
        }
    }

    /// Everything recorded since the last take, as one call's trace.
    pub fn take_call(&self, operation: &str, outcome: String) -> CallTrace {
        let mut r = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        let uses = std::mem::take(&mut r.pending);
        r.text_bytes = 0;
        let calls = std::mem::take(&mut r.calls);
        let dropped = std::mem::take(&mut r.dropped);
        CallTrace {
            operation: operation.to_string(),
            outcome,
            duration_ms: calls.iter().map(|c| millis(c.duration)).sum(),
            peak_memory_bytes: calls.iter().map(|c| c.peak_memory_bytes).max().unwrap_or(0),
            uses: uses
                .into_iter()
                .map(|(u, exchange)| UseRecord {
                    exchange,
                    ..UseRecord::from_use(&u)
                })
                .collect(),
            uses_dropped: dropped,
            logs: std::mem::take(&mut r.logs),
            logs_dropped: std::mem::take(&mut r.logs_dropped),
        }
    }
}

impl CapabilityObserver for Recorder {
    fn capability_used(&self, mut event: CapabilityUse) {
        // Guest text: escaped and bounded here too, whoever built the event.
        event.target = escape_line(&event.target, USE_TEXT_BYTES);
        let bytes = event.target.len();
        event.outcome = event.outcome.bounded(USE_TEXT_BYTES);
        let bytes = bytes
            + match &event.outcome {
                UseOutcome::Failed(why) | UseOutcome::Denied(why) => why.len(),
                UseOutcome::Allowed { .. } => 0,
            };
        // Redacted now: the raw exchange (credentials included) is not kept.
        let exchange = match (event.exchange.take(), &self.exchanges) {
            (Some(e), Some(redactor)) => Some(redactor.exchange(&e)),
            _ => None,
        };
        let bytes = bytes + exchange.as_ref().map_or(0, ExchangeRecord::text_bytes);
        let mut r = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        if r.pending.len() < MAX_USES && r.text_bytes + bytes <= MAX_TEXT_BYTES {
            r.text_bytes += bytes;
            r.pending.push((event, exchange));
        } else {
            r.dropped += 1;
        }
    }

    fn wants_http_exchanges(&self) -> bool {
        self.exchanges.is_some()
    }

    fn provider_logged(&self, level: &'static str, message: &str) {
        // The runtime quoted and escaped it; bounded again here like every guest text.
        let message = escape_line(message, USE_TEXT_BYTES);
        let mut r = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        if r.logs.len() < MAX_USES && r.text_bytes + message.len() <= MAX_TEXT_BYTES {
            r.text_bytes += message.len();
            r.logs.push(LogRecord { level, message });
        } else {
            r.logs_dropped += 1;
        }
    }

    fn call_finished(&self, stats: CallStats) {
        let mut r = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        if r.calls.len() < MAX_USES {
            r.calls.push(stats);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn denied_secret(key: &str) -> CapabilityUse {
        CapabilityUse {
            capability: CapabilityKind::Secret,
            target: key.to_owned(),
            outcome: UseOutcome::Denied(format!("key {key} is not granted")),
            duration: Duration::from_micros(3),
            exchange: None,
        }
    }

    /// A provider looping on denied `secrets.get` with huge key names full of terminal
    /// escapes: the trace stays within its bytes, counts what it left out, and every line
    /// prints without a control or invisible format character.
    #[test]
    fn a_looping_provider_cannot_grow_the_trace_or_write_to_the_terminal() {
        let recorder = Recorder::new();
        let key = format!("\u{1b}[2J\u{1b}[31m\n\u{202e}{}", "k".repeat(64 << 10));
        for _ in 0..3_000 {
            recorder.capability_used(denied_secret(&key));
        }
        let trace = recorder.take_call("get-resources", "ok".into());
        let text: usize = trace
            .uses
            .iter()
            .map(|u| u.target.len() + u.detail.as_ref().map_or(0, String::len))
            .sum();
        assert!(text <= MAX_TEXT_BYTES, "{text} bytes of text kept");
        assert!(trace.uses_dropped > 0);
        assert_eq!(trace.uses.len() as u64 + trace.uses_dropped, 3_000);
        for u in &trace.uses {
            let line = u.line();
            assert!(
                !line
                    .chars()
                    .any(|c| c.is_control() || cro_runtime::is_invisible_format(c)),
                "{line:?}"
            );
            assert!(line.contains("\\u{1b}[2J"), "{line}");
        }
        // The next call starts with an empty budget.
        recorder.capability_used(denied_secret("password"));
        let next = recorder.take_call("get-resources", "ok".into());
        assert_eq!(next.uses.len(), 1);
        assert_eq!(next.uses[0].target, "password");
    }
}
