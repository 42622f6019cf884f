//! One module per capability a provider can use, the way Spin's factors each own one:
//! each implements [`capability::Capability`]: its grant type and its validation, its
//! checks (asked through the [`crate::gate::Gate`], still the one choke point), its
//! budget, its provider-level and per-call state, its import bindings and host functions,
//! and its part of the capability report. The list below names each once; the spec's
//! [`Grants`], the call's store, the linker and the report are made from it
//! (`registry`), and the tests (`tests`) fail for a capability half registered.
//!
//! | module | imports | grant | budget |
//! |---|---|---|---|
//! | [`http`] | `cro:provider/http` | `grants.http` | deadline, `max_response_bytes`, refused headers |
//! | [`secrets`] | `cro:provider/secrets` | `grants.secret` | `cluster_reads_*` (one read per call) |
//! | [`lookup`] | `cro:provider/lookup` | `grants.lookup` | `cluster_reads_*`, Kubernetes names only |
//! | [`config`] | `cro:provider/config` | always | — |
//! | [`log`] | `cro:provider/log` | always | `log_*` |
//! | [`state`] | `cro:provider/state` | always | `state_bytes`, `state_entries` |
//! | [`wasi`] | `wasi:*` | `grants.wasi` | bounded stdout/stderr |
//! | [`clocks`] | `wasi:clocks` | `grants.wasi.clocks` | — |
//! | [`memory`] | linear memories, tables | — | `memory_bytes`, pool slot sizes |
//!
//! [`reads`] is the cluster-read budget `secrets` and `lookup` share; [`clocks`] is part
//! of `wasi`, and [`memory`] is the store's limiter rather than an import.

// Machinery: the trait, the list's macro, the cluster-read budget, the store's limiter.
pub(crate) mod capability;
pub(crate) mod memory;
pub(crate) mod reads;
pub(crate) mod registry;

// The capabilities.
pub(crate) mod clocks;
pub(crate) mod config;
pub mod http;
pub(crate) mod log;
pub mod lookup;
pub mod secrets;
pub mod state;
pub mod wasi;

// The registration: one entry per capability, in the order the report lists findings.
registry::capabilities! {
    http: http::HttpCap {
        /// Endpoints the `http` interface may reach.
        http: Vec<http::grant::HttpGrant>
    },
    secrets: secrets::SecretsCap {
        /// The one Secret (and its keys) the `secrets` interface may read.
        secret: Option<secrets::grant::SecretGrant>
    },
    lookup: lookup::LookupCap {
        /// Kinds the `lookup` interface may read (`v1 Node` for `get-node`/`list-nodes`).
        lookup: Vec<lookup::grant::LookupGrant>
    },
    config: config::ConfigCap,
    log: log::LogCap,
    state: state::StateCap,
    wasi: wasi::WasiCap {
        /// WASI features beyond the deny-everything default.
        wasi: wasi::grant::WasiGrant
    },
}

#[cfg(test)]
mod tests;
