//! Running the suite against the simulator of the provider's fabric: the table of its
//! checks, what they need, and the state they hand on (the devices attached).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use cro_runtime::{AttachedDevice, Claim, ProviderInfo, RuntimeOptions};
use serde_json::{Value, json};

use crate::SuiteError;
use crate::attached::{self, Target};
use crate::checks::{declared_verdict, denied_verdict, describe_verdict, resources_verdict};
use crate::control::RemoteFabric;
use crate::fabric::{Fabric, FabricKind, FaultKind};
use crate::faults;
use crate::fti::{FtiApi, FtiFabric};
use crate::nec::NecFabric;
use crate::pool;
use crate::redfish::RedfishFabric;
use crate::report::Report;
use crate::run::{
    Component, NODE, Run, Verdict, claim, resource, spec_for, wanted_device, who, with_device,
};
use crate::table::{CheckId, Need, Row, Suite, run_table};

/// How the suite runs.
#[derive(Debug, Clone)]
pub struct SuiteOptions {
    pub component: PathBuf,
    /// The fabric; `None`: chosen from `describe()`.
    pub fabric: Option<FabricKind>,
    /// A simulator elsewhere that speaks the control protocol ([`crate::control`]):
    /// the suite runs against it, whatever the provider's fabric.
    pub fabric_sim: Option<String>,
    /// The FTI API to run an FTI provider against; `None`: the Cluster Manager when the
    /// provider declares the config key `cluster_id`, else the Fabric Manager.
    pub fti_api: Option<FtiApi>,
    /// Configuration keys set on top of what the fabric's driver configures.
    pub config: BTreeMap<String, String>,
    /// The provider's `limits.call_timeout_ms`.
    pub call_timeout_ms: u64,
    /// The shorter deadline of the `deadline` check.
    pub deadline_ms: u64,
    /// The provider's `limits.memory_bytes`.
    pub memory_bytes: u64,
    pub runtime: RuntimeOptions,
}

impl SuiteOptions {
    pub fn new(component: impl Into<PathBuf>) -> SuiteOptions {
        SuiteOptions {
            component: component.into(),
            fabric: None,
            fabric_sim: None,
            fti_api: None,
            config: BTreeMap::new(),
            call_timeout_ms: 10_000,
            deadline_ms: 2_000,
            memory_bytes: 128 << 20,
            runtime: tool_runtime_options(),
        }
    }
}

/// Runtime options for tools: pool slots large enough for a CPython component (more
/// core instances, memories and tables than a Rust one).
pub fn tool_runtime_options() -> RuntimeOptions {
    RuntimeOptions {
        max_instances: 8,
        max_core_instances_per_component: 32,
        max_memories_per_component: 8,
        max_tables_per_component: 8,
        ..RuntimeOptions::default()
    }
}

/// The FTI API a provider is run against unless one is asked for: the Cluster Manager
/// (asynchronous, with claims) when it can use it (it takes a `cluster_id`), else the
/// Fabric Manager. A provider that supports both is certified on each with `fti_api`.
pub fn default_fti_api(info: Option<&ProviderInfo>) -> FtiApi {
    match info {
        Some(i) if i.config.iter().any(|k| k.name == "cluster_id") => FtiApi::Cm,
        _ => FtiApi::Fm,
    }
}

/// The simulated suite, in the order of the report.
pub(crate) const SIMULATED: &[Row] = &[
    Row::new(CheckId::Describe, &[]),
    Row::new(CheckId::Attach, &[]),
    Row::new(CheckId::Check, ATTACHED),
    Row::new(CheckId::CheckWarning, ATTACHED),
    Row::new(CheckId::GetResources, ATTACHED),
    Row::new(CheckId::Pool, &[]),
    Row::new(CheckId::PoolFollows, &[Need::Passed(CheckId::Pool)]),
    Row::new(CheckId::InProgress, ATTACHED),
    Row::new(CheckId::LostReplyRetry, ATTACHED),
    Row::new(CheckId::Detach, ATTACHED),
    Row::new(
        CheckId::DetachTwice,
        &[Need::Passed(CheckId::Attach), Need::Passed(CheckId::Detach)],
    ),
    Row::new(CheckId::Fault5xxCheck, ATTACHED),
    Row::new(CheckId::FaultMalformedCheck, ATTACHED),
    Row::new(CheckId::FaultLostCheck, ATTACHED),
    Row::new(CheckId::Fault5xxPool, &[]),
    // A faulted attach needs no attached device (it claims it when there is one).
    Row::new(CheckId::Fault5xxAttach, &[]),
    Row::new(CheckId::FaultMalformedAttach, &[]),
    Row::new(CheckId::FaultLostAttach, &[]),
    Row::new(CheckId::Deadline, &[]),
    Row::new(CheckId::Denied, &[]),
    Row::new(CheckId::DeclaredCapabilities, &[]),
    Row::new(CheckId::Resources, &[]),
];

/// The checks of a fabric whose attaches are jobs it can make fail
/// ([`Fabric::fails_jobs`]), run after the faulted attaches.
const JOBS: &[Row] = &[
    Row::new(CheckId::FailedJob, &[]),
    Row::new(CheckId::RolledBackJob, &[]),
];

/// The simulated table of a run; `jobs`: with the job checks.
pub(crate) fn simulated_table(jobs: bool) -> Vec<Row> {
    let mut table = SIMULATED.to_vec();
    if jobs {
        let at = table
            .iter()
            .position(|r| r.check == CheckId::FaultLostAttach)
            .map_or(table.len(), |i| i + 1);
        table.splice(at..at, JOBS.iter().copied());
    }
    table
}

/// The checks of the device `attach` attached.
const ATTACHED: &[Need] = &[Need::Passed(CheckId::Attach)];

/// Runs the suite against the simulator of the provider's fabric.
pub async fn run_simulated(opts: &SuiteOptions) -> Result<Report, SuiteError> {
    let started = Instant::now();
    let component = Component::open(&opts.component, opts.runtime.clone()).await?;
    if let Some(url) = &opts.fabric_sim {
        return run_remote(opts, component, url, started).await;
    }
    let kind = fabric_kind(opts.fabric, component.info.as_ref())?;
    if let (Some(_), FabricKind::Redfish | FabricKind::Nec) = (opts.fti_api, kind) {
        return Err(SuiteError::FtiApiForOtherFabric(kind.as_str()));
    }
    let fti_api = opts
        .fti_api
        .unwrap_or_else(|| default_fti_api(component.info.as_ref()));
    let fabric: Box<dyn Fabric> = match kind {
        FabricKind::Fti => Box::new(FtiFabric::start(fti_api)?),
        FabricKind::Redfish => Box::new(RedfishFabric::start()?),
        FabricKind::Nec => Box::new(NecFabric::start()?),
        // Neither parsed from --fabric nor read from describe(): only --fabric-sim.
        FabricKind::Remote => return Err(SuiteError::NoFabric(" (pass --fabric-sim URL)".into())),
    };
    let table = simulated_table(fabric.fails_jobs());
    let mut suite = Simulated::start(opts, component, kind, fabric).await?;
    run_table(&mut suite, &table).await?;
    Ok(suite
        .run
        .report(&opts.component, fabric_name(kind, fti_api), started))
}

/// The same suite against a simulator that speaks the control protocol at `url`.
async fn run_remote(
    opts: &SuiteOptions,
    component: Component,
    url: &str,
    started: Instant,
) -> Result<Report, SuiteError> {
    if opts.fabric.is_some() || opts.fti_api.is_some() {
        return Err(SuiteError::FabricWithSimulator);
    }
    // Connecting blocks on the simulator's replies: off the async threads.
    let url = url.to_string();
    let fabric = tokio::task::spawn_blocking(move || RemoteFabric::connect(&url))
        .await
        .map_err(|e| SuiteError::Simulator(e.to_string()))??;
    let name = fabric.name();
    let table = simulated_table(fabric.fails_jobs());
    let mut suite = Simulated::start(opts, component, FabricKind::Remote, Box::new(fabric)).await?;
    run_table(&mut suite, &table).await?;
    Ok(suite.run.report(&opts.component, name, started))
}

/// The fabric: `given`, else the one the provider's `describe()` points at.
fn fabric_kind(
    given: Option<FabricKind>,
    info: Option<&ProviderInfo>,
) -> Result<FabricKind, SuiteError> {
    match (given, info) {
        (Some(k), _) => Ok(k),
        (None, Some(i)) => FabricKind::from_info(i)
            .ok_or_else(|| SuiteError::NoFabric(format!(" from its describe() ({})", who(i)))),
        (None, None) => Err(SuiteError::NoFabric(
            " (contract 0.1.0 has no describe())".into(),
        )),
    }
}

/// The fabric as the report names it.
fn fabric_name(kind: FabricKind, fti_api: FtiApi) -> String {
    match (kind, fti_api) {
        (FabricKind::Fti, FtiApi::Fm) => "fti (Fabric Manager API)".to_string(),
        (FabricKind::Fti, FtiApi::Cm) => "fti (Cluster Manager API)".to_string(),
        (k, _) => k.as_str().to_string(),
    }
}

/// One simulated run: the component, the fabric and what the checks hand on.
struct Simulated<'a> {
    opts: &'a SuiteOptions,
    component: Component,
    kind: FabricKind,
    /// The provider's configuration: the fabric's, with `opts.config` on top.
    config: BTreeMap<String, String>,
    grants: Value,
    target: Target,
    run: Run,
    /// The device of `attach`, when it passed.
    dev1: Option<AttachedDevice>,
    /// The device `lost-reply-retry` attached, when its retry reported one.
    dev3: Option<AttachedDevice>,
}

impl<'a> Simulated<'a> {
    /// Loads the provider against `fabric`, seeded with a node and free devices.
    async fn start(
        opts: &'a SuiteOptions,
        component: Component,
        kind: FabricKind,
        fabric: Box<dyn Fabric>,
    ) -> Result<Simulated<'a>, SuiteError> {
        let mut config = fabric.config();
        config.extend(opts.config.clone());
        let grants = fabric.grants();
        let spec = spec_for(
            "conformance",
            &opts.component,
            &config,
            &grants,
            opts.call_timeout_ms,
            opts.memory_bytes,
        )?;
        let main = component.load(&spec, fabric.cluster().clone()).await?;
        let run = Run::new(
            main,
            component.info.clone(),
            config.clone(),
            opts.memory_bytes,
        );
        let machine = fabric.add_node(NODE);
        let (device_type, declared_model) = wanted_device(component.info.as_ref());
        let model = fabric.add_free_devices(device_type, declared_model.as_deref(), 8);
        let r1 = resource("conformance-dev-1", NODE, device_type, &model);
        let target = Target {
            fabric,
            machine,
            model,
            r1,
        };
        Ok(Simulated {
            opts,
            component,
            kind,
            config,
            grants,
            target,
            run,
            dev1: None,
            dev3: None,
        })
    }

    /// The checks of the attached device (the table runs them only after `attach`
    /// passed).
    async fn attached_verdict(&mut self, check: CheckId) -> Verdict {
        let Some(dev1) = self.dev1.clone() else {
            return Need::Passed(CheckId::Attach).skip();
        };
        let (run, t) = (&mut self.run, &self.target);
        match check {
            CheckId::Check => attached::healthy(run, t, &dev1).await,
            CheckId::CheckWarning => attached::warning(run, t, &dev1).await,
            CheckId::GetResources => attached::listed(run, t, &dev1).await,
            CheckId::InProgress => attached::in_progress(run, t, &dev1).await,
            CheckId::LostReplyRetry => {
                let (verdict, dev3) = attached::lost_reply_retry(run, t, &dev1).await;
                self.dev3 = dev3;
                verdict
            }
            CheckId::Detach => match &self.dev3 {
                Some(d3) => attached::detach(run, t, d3).await,
                None => skip_without_dev3(),
            },
            CheckId::DetachTwice => match &self.dev3 {
                Some(d3) => attached::detach_twice(run, t, d3).await,
                None => Need::Passed(CheckId::Detach).skip(),
            },
            CheckId::Fault5xxCheck => {
                faults::fault_on_check(run, t, FaultKind::ServerError, &dev1).await
            }
            CheckId::FaultMalformedCheck => {
                faults::fault_on_check(run, t, FaultKind::MalformedBody, &dev1).await
            }
            CheckId::FaultLostCheck => {
                faults::fault_on_check(run, t, FaultKind::LostRequest, &dev1).await
            }
            other => unknown(other),
        }
    }

    /// `fault-*-attach`: `fault` on the attach of a resource named after `check`.
    async fn fault_on_attach(&mut self, check: CheckId, fault: FaultKind) -> Verdict {
        let (run, t) = (&mut self.run, &self.target);
        faults::fault_on_attach(run, t, fault, check.name(), self.dev1.as_ref()).await
    }

    /// `deadline`: a provider whose deadline is short, against a reply that comes later.
    async fn deadline(&mut self) -> Result<Verdict, SuiteError> {
        let opts = self.opts;
        let short_spec = spec_for(
            "conformance-deadline",
            &opts.component,
            &self.config,
            &self.grants,
            opts.deadline_ms,
            opts.memory_bytes,
        )?;
        let cluster = self.target.fabric.cluster().clone();
        let short = self.component.load(&short_spec, cluster).await?;
        let probe = match &self.dev1 {
            Some(d) => with_device(&self.target.r1, d),
            None => self.target.r1.clone(),
        };
        let deadline = Duration::from_millis(opts.deadline_ms);
        let attached = self.dev1.is_some();
        let (run, t) = (&mut self.run, &self.target);
        Ok(faults::deadline(run, t, &short, &probe, deadline, attached).await)
    }

    /// `denied`: the same provider with no HTTP grant.
    async fn denied(&mut self) -> Result<Verdict, SuiteError> {
        let opts = self.opts;
        let mut no_http = self.grants.clone();
        no_http["http"] = json!([]);
        let denied_spec = spec_for(
            "conformance-denied",
            &opts.component,
            &self.config,
            &no_http,
            opts.call_timeout_ms,
            opts.memory_bytes,
        )?;
        let cluster = self.target.fabric.cluster().clone();
        let denied = self.component.load(&denied_spec, cluster).await?;
        let claims: Vec<Claim> = self
            .dev1
            .iter()
            .map(|d| claim(&self.target.r1, d))
            .collect();
        Ok(denied_verdict(&mut self.run, &denied, &claims).await)
    }
}

impl Suite for Simulated<'_> {
    fn run(&mut self) -> &mut Run {
        &mut self.run
    }

    fn attach_allowed(&self) -> bool {
        // The simulator is the suite's own.
        true
    }

    async fn verdict(&mut self, check: CheckId) -> Result<Verdict, SuiteError> {
        let verdict = self.judge(check).await?;
        match self.target.fabric.broken() {
            Some(why) => Err(SuiteError::Simulator(format!(
                "during `{}`, the simulator failed: {why}",
                check.name()
            ))),
            None => Ok(verdict),
        }
    }
}

impl Simulated<'_> {
    async fn judge(&mut self, check: CheckId) -> Result<Verdict, SuiteError> {
        Ok(match check {
            CheckId::Describe => {
                let how = match (self.kind, self.opts.fabric) {
                    (FabricKind::Remote, _) => "given with --fabric-sim",
                    (_, Some(_)) => "given with --fabric",
                    (_, None) => "chosen from describe()",
                };
                let fabric = match self.kind {
                    FabricKind::Remote => "of the simulator",
                    k => k.as_str(),
                };
                describe_verdict(self.component.info.as_ref(), fabric, how)
            }
            CheckId::Attach => {
                let (verdict, dev1) = attached::attach(&mut self.run, &self.target).await;
                self.dev1 = dev1;
                verdict
            }
            CheckId::Fault5xxAttach => self.fault_on_attach(check, FaultKind::ServerError).await,
            CheckId::FaultMalformedAttach => {
                self.fault_on_attach(check, FaultKind::MalformedBody).await
            }
            CheckId::FaultLostAttach => self.fault_on_attach(check, FaultKind::LostRequest).await,
            CheckId::FailedJob | CheckId::RolledBackJob => {
                let rollback = check == CheckId::RolledBackJob;
                let (run, t) = (&mut self.run, &self.target);
                faults::job_fails(run, t, rollback, check.name(), self.dev1.as_ref()).await
            }
            CheckId::Deadline => self.deadline().await?,
            CheckId::Denied => self.denied().await?,
            CheckId::Pool => pool::pool(&mut self.run, &self.target).await,
            CheckId::PoolFollows => pool::follows(&mut self.run, &self.target).await,
            CheckId::Fault5xxPool => pool::fault(&mut self.run, &self.target).await,
            CheckId::DeclaredCapabilities => declared_verdict(&self.run),
            CheckId::Resources => resources_verdict(&self.run),
            attached => self.attached_verdict(attached).await,
        })
    }
}

/// `detach` detaches the device `lost-reply-retry` attached; without one it is skipped.
fn skip_without_dev3() -> Verdict {
    crate::run::skip(format!(
        "needs the device of `{}`",
        CheckId::LostReplyRetry.name()
    ))
}

/// A check the simulated table does not list reaching its dispatch: a mistake of the
/// suite, reported as a failure so that it cannot pass unnoticed.
fn unknown(check: CheckId) -> Verdict {
    crate::run::fail(format!(
        "the simulated suite has no function for `{}`",
        check.name()
    ))
}
