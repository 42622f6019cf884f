//! Per-provider limits, the `limits` section of a provider spec (see `crate::grants`):
//! everything a provider can make the host spend. A leaf: the capability modules read
//! their budgets here without knowing the spec.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::base::FieldError;

/// Per-provider limits: everything a provider can make the host spend. Each has a
/// default sized for a small operator and a typed outcome when hit (see `crate::budget`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Limits {
    /// Wall-clock deadline of one call, host I/O included.
    pub call_timeout_ms: u64,
    /// Bytes of all linear memories and tables of one call's instance, summed.
    pub memory_bytes: u64,
    /// Calls running at once; more wait for a slot.
    pub max_concurrent_calls: u32,
    /// Largest HTTP reply body.
    pub max_response_bytes: u64,
    /// Bytes the `state` interface keeps: keys plus values plus a fixed overhead per entry.
    pub state_bytes: u64,
    /// Entries the `state` interface keeps.
    pub state_entries: u32,
    /// Bytes wasmtime may copy out of the guest for one host call or one result (strings
    /// and lists, aliases counted each time); at most `memory_bytes` is used.
    pub host_call_bytes: u64,
    /// Log lines (including `log` calls dropped by the per-minute budget) of one call.
    pub log_lines_per_call: u32,
    /// Log bytes of one call.
    pub log_bytes_per_call: u64,
    /// Log lines the provider may write per minute, across its calls; more are dropped.
    pub log_lines_per_minute: u32,
    /// Log bytes the provider may write per minute, across its calls; more are dropped.
    pub log_bytes_per_minute: u64,
    /// Kubernetes API reads (Secret, Node, object, list) of one call; a Secret is read
    /// once per call however many keys the provider asks for.
    pub cluster_reads_per_call: u32,
    /// Kubernetes API reads per second across the provider's calls (bursts of twice that);
    /// faster reads wait for their turn within the call's deadline.
    pub cluster_reads_per_second: u32,
    /// Longest text a provider hands back (an error message, an in-progress note, an id);
    /// longer text is cut.
    pub provider_text_bytes: u32,
    /// HTTP requests of one call: a provider looping on a tiny GET made over a thousand
    /// requests a second for the whole deadline.
    pub http_requests_per_call: u32,
    /// Bytes one call may send over HTTP (URLs, headers and bodies).
    pub http_bytes_sent_per_call: u64,
    /// WASI resource handles (streams, pollables) one call may hold at once: each costs
    /// the host a table entry and the object behind it (100,000 pollables cost 29 MiB).
    pub wasi_handles_per_call: u32,
    /// Longest the component may take to compile when loaded; the compiler (a child
    /// process) is killed then (`crate::compile`).
    pub compile_timeout_ms: u64,
    /// Memory the compiler may use for the component (the child's data limit).
    pub compile_memory_bytes: u64,
    /// Function bodies the component may hold, across its core modules.
    pub compile_max_functions: u64,
    /// Bytes of function bodies the component may hold.
    pub compile_max_code_bytes: u64,
    /// Locals one function may declare.
    pub compile_max_locals: u32,
    /// Nesting depth of blocks, loops, ifs and trys in one function.
    pub compile_max_nesting: u32,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            call_timeout_ms: 30_000,
            memory_bytes: 64 << 20,
            max_concurrent_calls: 16,
            max_response_bytes: 4 << 20,
            // The FTI provider keeps two entries per attach for up to ten minutes (its
            // attempt and its hand-out, to adopt a device a lost reply left): these hold
            // about 2,000 attaches of ten minutes (docs/fti-fabric-api.md, "Lost replies").
            state_bytes: 1 << 20,
            state_entries: 4096,
            host_call_bytes: 8 << 20,
            log_lines_per_call: 256,
            log_bytes_per_call: 64 << 10,
            log_lines_per_minute: 1200,
            log_bytes_per_minute: 1 << 20,
            cluster_reads_per_call: 512,
            cluster_reads_per_second: 50,
            provider_text_bytes: 4096,
            http_requests_per_call: 256,
            http_bytes_sent_per_call: 16 << 20,
            wasi_handles_per_call: 4096,
            compile_timeout_ms: 120_000,
            compile_memory_bytes: 1 << 30,
            // About four times the largest components known: the CPython example (13,381
            // functions, 6.3 MiB of code, 271 locals, 781 nested blocks) and the
            // JavaScript engine componentize-js embeds (12,584 functions, 8.8 MiB).
            compile_max_functions: 50_000,
            compile_max_code_bytes: 32 << 20,
            compile_max_locals: 10_000,
            compile_max_nesting: 10_000,
        }
    }
}

impl Limits {
    pub const MAX_CALL_TIMEOUT_MS: u64 = 10 * 60 * 1000;
    pub const MIN_MEMORY_BYTES: u64 = 1 << 20;
    pub const MAX_MEMORY_BYTES: u64 = 4 << 30;
    pub const MAX_CONCURRENT_CALLS: u32 = 1024;
    pub const MAX_RESPONSE_BYTES: u64 = 1 << 30;
    pub const MAX_STATE_BYTES: u64 = 64 << 20;
    pub const MAX_STATE_ENTRIES: u32 = 1 << 16;
    pub const MIN_HOST_CALL_BYTES: u64 = 64 << 10;
    pub const MAX_LOG_LINES: u32 = 1 << 20;
    pub const MAX_LOG_BYTES: u64 = 1 << 30;
    pub const MAX_CLUSTER_READS_PER_CALL: u32 = 1 << 16;
    pub const MAX_HTTP_REQUESTS_PER_CALL: u32 = 1 << 16;
    pub const MIN_HTTP_BYTES_SENT_PER_CALL: u64 = 1 << 10;
    pub const MAX_HTTP_BYTES_SENT_PER_CALL: u64 = 1 << 30;
    pub const MAX_CLUSTER_READS_PER_SECOND: u32 = 10_000;
    pub const MIN_PROVIDER_TEXT_BYTES: u32 = 256;
    pub const MAX_PROVIDER_TEXT_BYTES: u32 = 1 << 20;
    pub const MIN_WASI_HANDLES_PER_CALL: u32 = 16;
    pub const MAX_WASI_HANDLES_PER_CALL: u32 = 1 << 20;
    pub const MAX_COMPILE_TIMEOUT_MS: u64 = 30 * 60 * 1000;
    /// Below this the compiler cannot even start (its own code and threads).
    pub const MIN_COMPILE_MEMORY_BYTES: u64 = 32 << 20;
    pub const MAX_COMPILE_MEMORY_BYTES: u64 = 64 << 30;

    pub fn call_timeout(&self) -> Duration {
        Duration::from_millis(self.call_timeout_ms)
    }

    /// The hostcall fuel a call gets: `host_call_bytes`, never more than the memory cap
    /// (the guest cannot hold more than that, so more is only ever aliases).
    pub fn effective_host_call_bytes(&self) -> u64 {
        self.host_call_bytes.min(self.memory_bytes)
    }

    /// Checks every limit is within its range (the spec's parsers call it).
    pub(crate) fn validate(&self) -> Result<(), FieldError> {
        self.validate_call()?;
        self.validate_host()?;
        self.validate_logs()?;
        self.validate_cluster()?;
        self.validate_http()?;
        self.validate_compile()?;
        range(
            "wasi_handles_per_call",
            u64::from(self.wasi_handles_per_call),
            u64::from(Self::MIN_WASI_HANDLES_PER_CALL),
            u64::from(Self::MAX_WASI_HANDLES_PER_CALL),
        )?;
        range(
            "provider_text_bytes",
            u64::from(self.provider_text_bytes),
            u64::from(Self::MIN_PROVIDER_TEXT_BYTES),
            u64::from(Self::MAX_PROVIDER_TEXT_BYTES),
        )
    }

    /// What one call may take: time, memory, concurrency, reply sizes.
    fn validate_call(&self) -> Result<(), FieldError> {
        range(
            "call_timeout_ms",
            self.call_timeout_ms,
            1,
            Self::MAX_CALL_TIMEOUT_MS,
        )?;
        range(
            "memory_bytes",
            self.memory_bytes,
            Self::MIN_MEMORY_BYTES,
            Self::MAX_MEMORY_BYTES,
        )?;
        range(
            "max_concurrent_calls",
            u64::from(self.max_concurrent_calls),
            1,
            u64::from(Self::MAX_CONCURRENT_CALLS),
        )?;
        range(
            "max_response_bytes",
            self.max_response_bytes,
            1,
            Self::MAX_RESPONSE_BYTES,
        )
    }

    /// What the host keeps or copies for the provider: state, host-call bytes.
    fn validate_host(&self) -> Result<(), FieldError> {
        range("state_bytes", self.state_bytes, 0, Self::MAX_STATE_BYTES)?;
        range(
            "state_entries",
            u64::from(self.state_entries),
            0,
            u64::from(Self::MAX_STATE_ENTRIES),
        )?;
        range(
            "host_call_bytes",
            self.host_call_bytes,
            Self::MIN_HOST_CALL_BYTES,
            Self::MAX_MEMORY_BYTES,
        )
    }

    /// The log budgets, per call and per minute.
    fn validate_logs(&self) -> Result<(), FieldError> {
        range(
            "log_lines_per_call",
            u64::from(self.log_lines_per_call),
            0,
            u64::from(Self::MAX_LOG_LINES),
        )?;
        range(
            "log_bytes_per_call",
            self.log_bytes_per_call,
            0,
            Self::MAX_LOG_BYTES,
        )?;
        range(
            "log_lines_per_minute",
            u64::from(self.log_lines_per_minute),
            0,
            u64::from(Self::MAX_LOG_LINES),
        )?;
        range(
            "log_bytes_per_minute",
            self.log_bytes_per_minute,
            0,
            Self::MAX_LOG_BYTES,
        )
    }

    /// The HTTP budgets of one call.
    fn validate_http(&self) -> Result<(), FieldError> {
        range(
            "http_requests_per_call",
            u64::from(self.http_requests_per_call),
            1,
            u64::from(Self::MAX_HTTP_REQUESTS_PER_CALL),
        )?;
        range(
            "http_bytes_sent_per_call",
            self.http_bytes_sent_per_call,
            Self::MIN_HTTP_BYTES_SENT_PER_CALL,
            Self::MAX_HTTP_BYTES_SENT_PER_CALL,
        )
    }

    /// What compiling the component may take (`crate::compile`).
    fn validate_compile(&self) -> Result<(), FieldError> {
        range(
            "compile_timeout_ms",
            self.compile_timeout_ms,
            1,
            Self::MAX_COMPILE_TIMEOUT_MS,
        )?;
        range(
            "compile_memory_bytes",
            self.compile_memory_bytes,
            Self::MIN_COMPILE_MEMORY_BYTES,
            Self::MAX_COMPILE_MEMORY_BYTES,
        )?;
        range(
            "compile_max_functions",
            self.compile_max_functions,
            1,
            u64::from(u32::MAX),
        )?;
        range(
            "compile_max_code_bytes",
            self.compile_max_code_bytes,
            1,
            u64::from(u32::MAX),
        )?;
        range(
            "compile_max_locals",
            u64::from(self.compile_max_locals),
            0,
            u64::from(u32::MAX),
        )?;
        range(
            "compile_max_nesting",
            u64::from(self.compile_max_nesting),
            0,
            u64::from(u32::MAX),
        )
    }

    /// The cluster-read budgets.
    fn validate_cluster(&self) -> Result<(), FieldError> {
        range(
            "cluster_reads_per_call",
            u64::from(self.cluster_reads_per_call),
            0,
            u64::from(Self::MAX_CLUSTER_READS_PER_CALL),
        )?;
        range(
            "cluster_reads_per_second",
            u64::from(self.cluster_reads_per_second),
            1,
            u64::from(Self::MAX_CLUSTER_READS_PER_SECOND),
        )
    }
}

/// `limits.<field>` must be within `min..=max`.
fn range(field: &str, v: u64, min: u64, max: u64) -> Result<(), FieldError> {
    if (min..=max).contains(&v) {
        Ok(())
    } else {
        Err(FieldError::new(
            format!("limits.{field}"),
            format!("{v} is outside {min}..={max}"),
        ))
    }
}
