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
//! Any other fabric is certified against its vendor's simulator through the control
//! protocol ([`control`], docs/fabric-sim-protocol.md): the same checks, judged by that
//! simulator's oracle.
//!
//! Contract 0.1.0 components have no `describe()`: the suite runs every check that
//! does not need it (the fabric must then be given) and reports the two that do
//! (`describe`, `declared-capabilities`) as skipped.
//!
//! Each suite is a table of rows (a check and what it needs first: an earlier check
//! that passed, or leave to attach on a lab fabric); one loop runs the rows in order
//! and records a skip that names the unmet need instead of running a row that cannot
//! run. Every check's name is written once, in `table`.

mod attached;
mod checks;
pub mod control;
mod error;
pub mod fabric;
mod faults;
pub mod fti;
mod lab;
pub mod nec;
mod pool;
pub mod redact;
pub mod redfish;
pub mod report;
mod run;
mod suite;
mod table;
pub mod trace;

pub use error::SuiteError;
pub use fabric::{Fabric, FabricDevice, FabricKind, FaultKind, Op};
pub use fti::FtiApi;
pub use lab::{LabAttach, LabTarget, lab_attach as suite_lab_attach, run_lab};
pub use report::{CheckResult, Report, Status, Summary};
pub use suite::{SuiteOptions, default_fti_api, run_simulated, tool_runtime_options};
pub use trace::{CallTrace, Recorder, UseRecord};
