//! What every capability module implements, and what the host hands it: at load
//! ([`Load`]), at the start of each call ([`CallSetup`]) and when the capability report is
//! made ([`Declared`], [`Findings`]). The list in `crate::caps` registers the
//! implementations, and everything else iterates over it: nothing else names one.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use serde::{Deserialize, Serialize};
use wasmtime::component::Linker;
use wasmtime_wasi::WasiView;

use super::reads::CallReads;
use crate::base::{FieldError, WallClock};
use crate::budget::BudgetCounters;
use crate::cluster::ClusterReader;
use crate::domain::ProviderInfo;
use crate::gate::Gate;
use crate::limits::Limits;

/// One host capability, the way one of Spin's factors owns one: its grant and the
/// validation of it, its checks (asked through the [`Gate`], the one choke point), its
/// budgets, its provider-level and per-call state, its host functions in the linker, and
/// its part of the capability report.
pub(crate) trait Capability {
    /// Names the capability in the registration and its tests.
    const NAME: &'static str;
    /// What the administrator writes for it under `grants` ([`NoGrant`] when it is
    /// always granted and has no section there).
    type Grant;
    /// The provider's side, built once at load and shared by its calls.
    type Shared: Send + Sync + 'static;
    /// One call's side, part of the call's store.
    type Call: Send + 'static;

    /// Checks what the types of the grant alone do not (the spec's parsers call it).
    fn validate(grant: &Self::Grant) -> Result<(), FieldError>;

    /// The provider's side, from its grant.
    fn load(grant: &Self::Grant, load: &Load<'_>) -> Result<Self::Shared, SetupError>;

    /// A new call's side.
    fn call(shared: &Arc<Self::Shared>, setup: &CallSetup) -> Self::Call;

    /// Its host functions in the linker; `get` finds the call's side in the store.
    fn add_to_linker<T: WasiView + 'static>(
        linker: &mut Linker<T>,
        get: fn(&mut T) -> &mut Self::Call,
    ) -> wasmtime::Result<()>;

    /// What it wants that is not granted and what is granted but never wanted.
    fn report(grant: &Self::Grant, declared: &Declared<'_>, findings: &mut Findings);

    /// A valid grant that gives something (tests: the registration test checks that every
    /// capability with a grant parses it and reports it when unwanted).
    #[cfg(test)]
    fn example() -> Self::Grant;
}

/// The grant of a capability that is always granted: nothing to write, nothing to check.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct NoGrant;

/// What a capability may use to set up its provider-level side.
pub(crate) struct Load<'a> {
    pub(crate) provider: &'a str,
    pub(crate) config: &'a BTreeMap<String, String>,
    pub(crate) limits: &'a Limits,
    pub(crate) gate: &'a Arc<Gate>,
    pub(crate) budgets: &'a Arc<BudgetCounters>,
    pub(crate) cluster: &'a Arc<dyn ClusterReader>,
    pub(crate) clock: &'a WallClock,
    /// Bytes of stdout and stderr kept per call.
    pub(crate) guest_output_bytes: usize,
}

/// Why a capability's provider-level side could not be set up.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SetupError {
    /// A limit this platform cannot honour.
    #[error("{0}")]
    Limits(String),
    /// The capability's client could not be built (the HTTP client and its CAs).
    #[error("{0}")]
    Client(String),
}

/// What a capability may use to set up one call's side.
pub(crate) struct CallSetup {
    pub(crate) deadline: Instant,
    /// The call's cluster reads, shared by every capability that reads the cluster.
    pub(crate) reads: Arc<CallReads>,
}

/// What the capability report compares a capability's grant with.
pub(crate) struct Declared<'a> {
    /// What the provider said it needs (`describe`).
    pub(crate) info: &'a ProviderInfo,
    /// The configuration its spec sets.
    pub(crate) config: &'a BTreeMap<String, String>,
}

/// The capability report's lines, as each capability adds its own.
#[derive(Debug, Default)]
pub(crate) struct Findings {
    pub(crate) wanted_not_granted: Vec<String>,
    pub(crate) granted_not_wanted: Vec<String>,
    pub(crate) unknown_config: Vec<String>,
    pub(crate) missing_config: Vec<String>,
}
