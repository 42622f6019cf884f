//! `cro-conformance`: the suite behind `cro provider test`.
//!
//! It loads a provider component in the real sandbox ([`cro_runtime`]) with a
//! capability observer, starts the simulator of the provider's fabric (chosen from its
//! `describe()`, or given), and runs checks of the contract's semantics against it:
//! attach, check, detach and get-resources; in-progress handling; idempotency (a
//! repeated attach, a double detach, a retried attach after a lost reply); a typed error
//! for every injected fault; the behaviour at the deadline; a denied capability reported
//! as `denied`; every capability used declared in `describe()`; and what the calls cost.
//! Against a vendor's lab fabric ([`LabTarget`]) only the non-destructive checks run,
//! unless attaching is allowed. `docs/vendors.md` explains every check.
//!
//! Contract 0.1.0 components have no `describe()`: the suite runs every check that
//! does not need it (the fabric must then be given) and reports the two that do
//! (`describe`, `declared-capabilities`) as skipped.

mod checks;
pub mod fabric;
pub mod fti;
mod lab;
pub mod redfish;
pub mod report;
mod run;
mod suite;
pub mod trace;

pub use fabric::{Fabric, FabricDevice, FabricKind, FaultKind, Op};
pub use fti::FtiApi;
pub use lab::{LabAttach, LabTarget, lab_attach as suite_lab_attach, run_lab};
pub use report::{CheckResult, Report, Status, Summary};
pub use suite::{SuiteOptions, default_fti_api, run_simulated, tool_runtime_options};
pub use trace::{CallTrace, Recorder, UseRecord};

/// Why the suite could not run at all (a check failing is a [`Report`], not this).
#[derive(Debug, thiserror::Error)]
pub enum SuiteError {
    #[error("cannot read the component {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("cannot load the component: {0}")]
    Load(String),
    #[error("cannot start the simulator: {0}")]
    Simulator(String),
    #[error(
        "cannot tell which fabric the provider is for{0}: pass --fabric fti or --fabric redfish"
    )]
    NoFabric(String),
    #[error("provider spec: {0}")]
    Spec(String),
    #[error("an FTI API (--fti-api) was chosen for a {0} provider; it applies to FTI only")]
    FtiApiForOtherFabric(&'static str),
}
