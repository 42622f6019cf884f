//! What a provider may spend, and the bookkeeping when it spends too much.
//!
//! Every budget has a name ([`Budget`]), a limit in the provider spec's `limits`, a typed
//! outcome when hit (a [`crate::CallError::Budget`], a refused `state.set`, a dropped log
//! line) and a per-provider counter exported as
//! `cro_provider_budget_exceeded_total{provider,budget}`. The capability modules own the
//! checks; this module holds only the shared vocabulary and the two rate-limiting cores
//! (pure, with time passed in, so they are unit-tested without sleeping).

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// One thing a provider can spend.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Budget {
    /// Bytes of all linear memories and tables of one call (`limits.memory_bytes`).
    Memory,
    /// Bytes wasmtime copies out of the guest for one host call or result
    /// (`limits.host_call_bytes`).
    HostCallBytes,
    /// Log lines of one call (`limits.log_lines_per_call`).
    LogLines,
    /// Log bytes of one call (`limits.log_bytes_per_call`).
    LogBytes,
    /// Log lines or bytes of the provider per minute (`limits.log_lines_per_minute`,
    /// `limits.log_bytes_per_minute`): further lines are dropped, the call goes on.
    LogRate,
    /// API-server reads of one call (`limits.cluster_reads_per_call`).
    ClusterReads,
    /// API-server reads of the provider per second (`limits.cluster_reads_per_second`):
    /// reads wait for their turn, within the call's deadline.
    ClusterRate,
    /// The `state` map's bytes or entries (`limits.state_bytes`, `limits.state_entries`):
    /// `set` returns false.
    State,
    /// A provider string longer than `limits.provider_text_bytes`: it is cut.
    ProviderText,
    /// HTTP requests of one call (`limits.http_requests_per_call`).
    HttpRequests,
    /// Bytes sent over HTTP by one call (`limits.http_bytes_sent_per_call`).
    HttpBytesSent,
    /// WASI resource handles one call holds at once (`limits.wasi_handles_per_call`).
    WasiHandles,
}

impl Budget {
    pub const ALL: [Budget; 12] = [
        Budget::Memory,
        Budget::HostCallBytes,
        Budget::LogLines,
        Budget::LogBytes,
        Budget::LogRate,
        Budget::ClusterReads,
        Budget::ClusterRate,
        Budget::State,
        Budget::ProviderText,
        Budget::HttpRequests,
        Budget::HttpBytesSent,
        Budget::WasiHandles,
    ];

    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Budget::Memory => "memory",
            Budget::HostCallBytes => "host_call_bytes",
            Budget::LogLines => "log_lines",
            Budget::LogBytes => "log_bytes",
            Budget::LogRate => "log_rate",
            Budget::ClusterReads => "cluster_reads",
            Budget::ClusterRate => "cluster_rate",
            Budget::State => "state",
            Budget::ProviderText => "provider_text",
            Budget::HttpRequests => "http_requests",
            Budget::HttpBytesSent => "http_bytes_sent",
            Budget::WasiHandles => "wasi_handles",
        }
    }

    /// The `limits` field that sets it.
    pub fn limit_field(self) -> &'static str {
        match self {
            Budget::Memory => "memory_bytes",
            Budget::HostCallBytes => "host_call_bytes",
            Budget::LogLines => "log_lines_per_call",
            Budget::LogBytes => "log_bytes_per_call",
            Budget::LogRate => "log_lines_per_minute/log_bytes_per_minute",
            Budget::ClusterReads => "cluster_reads_per_call",
            Budget::ClusterRate => "cluster_reads_per_second",
            Budget::State => "state_bytes/state_entries",
            Budget::ProviderText => "provider_text_bytes",
            Budget::HttpRequests => "http_requests_per_call",
            Budget::HttpBytesSent => "http_bytes_sent_per_call",
            Budget::WasiHandles => "wasi_handles_per_call",
        }
    }

    fn index(self) -> usize {
        Budget::ALL.iter().position(|b| *b == self).unwrap_or(0)
    }
}

impl fmt::Display for Budget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A call stopped because it spent more than a budget allows. Raised as a trap from a
/// host import and found again when the call ends; also the payload of
/// `CallError::Budget`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{}", describe(*.budget, *.limit))]
pub struct BudgetExceeded {
    pub budget: Budget,
    pub limit: u64,
}

/// What a cluster operator reads in `status.error` and Events.
fn describe(budget: Budget, limit: u64) -> String {
    let what = match budget {
        Budget::Memory => format!("used more than {limit} bytes of memory in one call"),
        Budget::HostCallBytes => {
            format!("handed the host more than {limit} bytes in one host call or reply")
        }
        Budget::LogLines => format!("wrote more than {limit} log lines in one call"),
        Budget::LogBytes => format!("wrote more than {limit} bytes of logs in one call"),
        Budget::LogRate => format!("logged more than {limit} per minute"),
        Budget::ClusterReads => {
            format!("made more than {limit} Kubernetes API reads in one call")
        }
        Budget::ClusterRate => {
            format!("read the Kubernetes API faster than {limit} reads per second")
        }
        Budget::State => format!("filled its state store ({limit})"),
        Budget::ProviderText => format!("returned text longer than {limit} bytes"),
        Budget::HttpRequests => format!("made more than {limit} HTTP requests in one call"),
        Budget::HttpBytesSent => format!("sent more than {limit} bytes over HTTP in one call"),
        Budget::WasiHandles => {
            format!("held more than {limit} WASI resources (streams, pollables) at once")
        }
    };
    format!(
        "the provider {what}; the host stopped it (raise limits.{} in the provider spec if \
         this is expected)",
        budget.limit_field()
    )
}

/// How often each budget was hit, per provider (for metrics).
#[derive(Debug, Default)]
pub struct BudgetCounters {
    counts: [AtomicU64; Budget::ALL.len()],
}

impl BudgetCounters {
    pub(crate) fn hit(&self, budget: Budget) {
        self.counts[budget.index()].fetch_add(1, Ordering::Relaxed);
    }

    /// Every budget with its count (zeros included).
    pub fn snapshot(&self) -> Vec<(Budget, u64)> {
        Budget::ALL
            .iter()
            .map(|b| (*b, self.counts[b.index()].load(Ordering::Relaxed)))
            .collect()
    }

    pub fn get(&self, budget: Budget) -> u64 {
        self.counts[budget.index()].load(Ordering::Relaxed)
    }
}

/// A token bucket: `rate` tokens a second up to `burst`. Pure: time is passed in.
#[derive(Debug)]
pub(crate) struct TokenBucket {
    rate: f64,
    burst: f64,
    tokens: f64,
    last: Instant,
}

impl TokenBucket {
    pub(crate) fn new(rate_per_second: u32, burst: u32, now: Instant) -> TokenBucket {
        let burst = f64::from(burst.max(1));
        TokenBucket {
            rate: f64::from(rate_per_second.max(1)),
            burst,
            tokens: burst,
            last: now,
        }
    }

    /// Takes a token now (`Ok`), or says how long until one is free (`Err`). A caller
    /// that waits must ask again: other callers may take it first.
    pub(crate) fn take(&mut self, now: Instant) -> Result<(), Duration> {
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.rate).min(self.burst);
        self.last = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            Ok(())
        } else {
            Err(Duration::from_secs_f64((1.0 - self.tokens) / self.rate))
        }
    }
}

/// Lines and bytes within a fixed one-minute window. Pure: time is passed in.
#[derive(Debug)]
pub(crate) struct MinuteWindow {
    lines: u64,
    bytes: u64,
    max_lines: u64,
    max_bytes: u64,
    started: Instant,
    /// Lines refused in this window, reported once the window turns.
    dropped: u64,
}

/// What the window says about one line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Admit {
    /// Write it; `dropped_before` lines were refused in the previous window.
    Yes { dropped_before: u64 },
    /// Over the window's budget: drop it. `first` is true for the first one refused
    /// in this window (the moment to say so once).
    No { first: bool },
}

impl MinuteWindow {
    pub(crate) fn new(max_lines: u64, max_bytes: u64, now: Instant) -> MinuteWindow {
        MinuteWindow {
            lines: 0,
            bytes: 0,
            max_lines,
            max_bytes,
            started: now,
            dropped: 0,
        }
    }

    pub(crate) fn admit(&mut self, bytes: u64, now: Instant) -> Admit {
        let mut dropped_before = 0;
        if now.saturating_duration_since(self.started) >= Duration::from_secs(60) {
            dropped_before = self.dropped;
            self.lines = 0;
            self.bytes = 0;
            self.dropped = 0;
            self.started = now;
        }
        if self.lines < self.max_lines && self.bytes.saturating_add(bytes) <= self.max_bytes {
            self.lines += 1;
            self.bytes += bytes;
            Admit::Yes { dropped_before }
        } else {
            self.dropped += 1;
            Admit::No {
                first: self.dropped == 1,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_bucket_refills_at_its_rate() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(10, 2, t0);
        assert_eq!(b.take(t0), Ok(()));
        assert_eq!(b.take(t0), Ok(()));
        let wait = b.take(t0).unwrap_err();
        assert!(wait > Duration::from_millis(90) && wait <= Duration::from_millis(100));
        assert_eq!(b.take(t0 + Duration::from_millis(100)), Ok(()));
        assert!(b.take(t0 + Duration::from_millis(100)).is_err());
        // Never more than the burst, however long it rested.
        let later = t0 + Duration::from_secs(3600);
        assert_eq!(b.take(later), Ok(()));
        assert_eq!(b.take(later), Ok(()));
        assert!(b.take(later).is_err());
    }

    #[test]
    fn minute_window_caps_lines_and_bytes() {
        let t0 = Instant::now();
        let mut w = MinuteWindow::new(3, 100, t0);
        assert_eq!(w.admit(10, t0), Admit::Yes { dropped_before: 0 });
        assert_eq!(w.admit(80, t0), Admit::Yes { dropped_before: 0 });
        assert_eq!(w.admit(20, t0), Admit::No { first: true });
        assert_eq!(w.admit(5, t0), Admit::Yes { dropped_before: 0 });
        assert_eq!(w.admit(1, t0), Admit::No { first: false });
        let next = t0 + Duration::from_secs(60);
        assert_eq!(w.admit(1, next), Admit::Yes { dropped_before: 2 });
    }

    #[test]
    fn counters_count_per_budget() {
        let c = BudgetCounters::default();
        c.hit(Budget::LogLines);
        c.hit(Budget::LogLines);
        c.hit(Budget::State);
        assert_eq!(c.get(Budget::LogLines), 2);
        assert_eq!(c.get(Budget::State), 1);
        assert_eq!(c.snapshot().len(), Budget::ALL.len());
        let e = BudgetExceeded {
            budget: Budget::ClusterReads,
            limit: 5,
        };
        assert!(
            e.to_string().contains("more than 5 Kubernetes API reads"),
            "{e}"
        );
        assert!(
            e.to_string().contains("limits.cluster_reads_per_call"),
            "{e}"
        );
    }
}
