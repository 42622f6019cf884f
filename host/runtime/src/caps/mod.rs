//! One module per capability a provider can use, the way Spin's factors each own one
//! capability: each owns its grant type and parsing (`<cap>::grant`), its check (asked
//! through the [`crate::gate::Gate`], still the one choke point), its budget, and its host
//! functions on a per-call struct that `crate::call` gathers into the store.
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
//! [`reads`] is the cluster-read budget `secrets` and `lookup` share.

pub(crate) mod clocks;
pub(crate) mod config;
pub mod http;
pub(crate) mod log;
pub mod lookup;
pub(crate) mod memory;
pub(crate) mod reads;
pub mod secrets;
pub mod state;
pub mod wasi;
