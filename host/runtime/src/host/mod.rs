//! The host side of one call: the store's data and the capability imports. Every import
//! asks the provider's [`Gate`] first.

pub(crate) mod capture;
pub(crate) mod http;
pub(crate) mod limiter;
pub(crate) mod state;
pub(crate) mod wasi;

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use wasmtime::component::ResourceTable;
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

use crate::bindings::cro::provider::{config, http as wit_http, log, lookup, secrets, types};
use crate::cluster::{ClusterError, ClusterReader};
use crate::gate::{Capability, Gate};

/// Raised (as a trap) when the call's deadline passes, in a host import or by the epoch
/// callback; the call then fails with `CallError::Timeout`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the call's deadline passed")]
pub(crate) struct DeadlineExceeded;

/// Log messages longer than this are cut.
const MAX_LOG_MESSAGE: usize = 8 * 1024;

/// What a provider's calls share (owned by the `Provider` handle).
pub(crate) struct ProviderShared {
    pub(crate) name: String,
    pub(crate) config: BTreeMap<String, String>,
    pub(crate) gate: Arc<Gate>,
    pub(crate) state: state::StateStore,
    pub(crate) http: http::HttpEgress,
    pub(crate) cluster: Arc<dyn ClusterReader>,
    /// Warnings and errors the provider logged (for metrics: e.g. a node it skipped).
    pub(crate) warnings: std::sync::atomic::AtomicU64,
}

/// The store data of one call.
pub(crate) struct CallCtx {
    pub(crate) shared: Arc<ProviderShared>,
    pub(crate) deadline: Instant,
    pub(crate) limiter: limiter::MemoryLimiter,
    wasi: WasiCtx,
    table: ResourceTable,
}

impl CallCtx {
    pub(crate) fn new(
        shared: Arc<ProviderShared>,
        deadline: Instant,
        memory_limit: usize,
        wasi: WasiCtx,
    ) -> CallCtx {
        CallCtx {
            shared,
            deadline,
            limiter: limiter::MemoryLimiter::new(memory_limit),
            wasi,
            table: ResourceTable::new(),
        }
    }

    fn remaining(&self) -> Duration {
        self.deadline.saturating_duration_since(Instant::now())
    }

    /// Runs host I/O, ending the call if the deadline passes first.
    async fn until_deadline<F: Future>(deadline: Instant, io: F) -> wasmtime::Result<F::Output> {
        tokio::time::timeout_at(tokio::time::Instant::from_std(deadline), io)
            .await
            .map_err(|_| wasmtime::Error::new(DeadlineExceeded))
    }
}

impl WasiView for CallCtx {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

impl types::Host for CallCtx {}

impl wit_http::Host for CallCtx {
    async fn send(
        &mut self,
        request: wit_http::Request,
    ) -> wasmtime::Result<Result<wit_http::Response, wit_http::HttpError>> {
        let shared = self.shared.clone();
        let remaining = self.remaining();
        let deadline = self.deadline;
        let sent =
            Self::until_deadline(deadline, shared.http.send(&shared.gate, request, remaining))
                .await?;
        sent.map_err(wasmtime::Error::new)
    }
}

fn secret_error(e: ClusterError) -> secrets::SecretError {
    match e {
        ClusterError::NotFound(_) => secrets::SecretError::NotFound(e.to_string()),
        _ => secrets::SecretError::Other(e.to_string()),
    }
}

impl secrets::Host for CallCtx {
    async fn get(&mut self, key: String) -> wasmtime::Result<Result<String, secrets::SecretError>> {
        let shared = self.shared.clone();
        if let Err(denial) = shared.gate.check(Capability::SecretKey(&key)) {
            return Ok(Err(secrets::SecretError::Denied(denial.0)));
        }
        let Some(grant) = shared.gate.grants().secret.as_ref() else {
            return Ok(Err(secrets::SecretError::Denied("no secret grant".into())));
        };
        let data = Self::until_deadline(
            self.deadline,
            shared.cluster.get_secret(&grant.namespace, &grant.name),
        )
        .await?;
        Ok(data.map_err(secret_error).and_then(|mut data| {
            let value = data.remove(&key).ok_or_else(|| {
                secrets::SecretError::NotFound(format!(
                    "key `{key}` is not in Secret {}/{}",
                    grant.namespace, grant.name
                ))
            })?;
            String::from_utf8(value).map_err(|_| {
                secrets::SecretError::Other(format!("the value of key `{key}` is not UTF-8"))
            })
        }))
    }
}

fn lookup_error(e: ClusterError) -> lookup::LookupError {
    match e {
        ClusterError::NotFound(_) => lookup::LookupError::NotFound(e.to_string()),
        _ => lookup::LookupError::Other(e.to_string()),
    }
}

fn json_text(v: &serde_json::Value) -> Result<String, lookup::LookupError> {
    serde_json::to_string(v).map_err(|e| lookup::LookupError::Other(e.to_string()))
}

impl CallCtx {
    fn gate_lookup(&self, api_version: &str, kind: &str) -> Result<(), lookup::LookupError> {
        self.shared
            .gate
            .check(Capability::Lookup { api_version, kind })
            .map_err(|d| lookup::LookupError::Denied(d.0))
    }
}

impl lookup::Host for CallCtx {
    async fn get_node(
        &mut self,
        name: String,
    ) -> wasmtime::Result<Result<String, lookup::LookupError>> {
        if let Err(e) = self.gate_lookup("v1", "Node") {
            return Ok(Err(e));
        }
        let shared = self.shared.clone();
        let found = Self::until_deadline(
            self.deadline,
            shared.cluster.get_object("v1", "Node", None, &name),
        )
        .await?;
        Ok(found.map_err(lookup_error).and_then(|v| json_text(&v)))
    }

    async fn list_nodes(&mut self) -> wasmtime::Result<Result<Vec<String>, lookup::LookupError>> {
        if let Err(e) = self.gate_lookup("v1", "Node") {
            return Ok(Err(e));
        }
        let shared = self.shared.clone();
        let found =
            Self::until_deadline(self.deadline, shared.cluster.list_objects("v1", "Node")).await?;
        Ok(found
            .map_err(lookup_error)
            .and_then(|nodes| nodes.iter().map(json_text).collect()))
    }

    async fn get_object(
        &mut self,
        api_version: String,
        kind: String,
        namespace: Option<String>,
        name: String,
    ) -> wasmtime::Result<Result<String, lookup::LookupError>> {
        if let Err(e) = self.gate_lookup(&api_version, &kind) {
            return Ok(Err(e));
        }
        let shared = self.shared.clone();
        let found = Self::until_deadline(
            self.deadline,
            shared
                .cluster
                .get_object(&api_version, &kind, namespace.as_deref(), &name),
        )
        .await?;
        Ok(found.map_err(lookup_error).and_then(|v| json_text(&v)))
    }
}

impl config::Host for CallCtx {
    fn get(&mut self, key: String) -> Option<String> {
        self.shared.gate.check(Capability::Config).ok()?;
        self.shared.config.get(&key).cloned()
    }

    fn entries(&mut self) -> Vec<(String, String)> {
        if self.shared.gate.check(Capability::Config).is_err() {
            return Vec::new();
        }
        self.shared
            .config
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }
}

fn truncate(message: &str) -> &str {
    if message.len() <= MAX_LOG_MESSAGE {
        return message;
    }
    let mut end = MAX_LOG_MESSAGE;
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    &message[..end]
}

impl log::Host for CallCtx {
    fn log(&mut self, level: log::Level, message: String) {
        if self.shared.gate.check(Capability::Log).is_err() {
            return;
        }
        let provider = self.shared.name.as_str();
        let message = truncate(&message);
        if matches!(level, log::Level::Warn | log::Level::Error) {
            self.shared
                .warnings
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        match level {
            log::Level::Trace => tracing::trace!(target: "cro_provider", provider, "{message}"),
            log::Level::Debug => tracing::debug!(target: "cro_provider", provider, "{message}"),
            log::Level::Info => tracing::info!(target: "cro_provider", provider, "{message}"),
            log::Level::Warn => tracing::warn!(target: "cro_provider", provider, "{message}"),
            log::Level::Error => tracing::error!(target: "cro_provider", provider, "{message}"),
        }
    }
}

impl crate::bindings::cro::provider::state::Host for CallCtx {
    fn get(&mut self, key: String) -> Option<Vec<u8>> {
        self.shared.gate.check(Capability::State).ok()?;
        self.shared.state.get(&key)
    }

    fn set(&mut self, key: String, value: Vec<u8>, ttl_ms: Option<u64>) -> bool {
        self.shared.gate.check(Capability::State).is_ok()
            && self.shared.state.set(key, value, ttl_ms)
    }

    fn remove(&mut self, key: String) {
        if self.shared.gate.check(Capability::State).is_ok() {
            self.shared.state.remove(&key);
        }
    }
}
