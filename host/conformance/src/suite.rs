//! The checks, in the order they run, against a simulated fabric or a lab fabric.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cro_runtime::cluster::StaticCluster;
use cro_runtime::{
    AddOutcome, AddRequest, AttachedDevice, CallError, Claim, ComposableResource, DeviceInfo,
    DeviceType, Provider, ProviderError, ProviderInfo, ProviderSpec, RemoveOutcome, Runtime,
    RuntimeOptions,
};
use serde_json::{Value, json};

use crate::SuiteError;
use crate::fabric::{Fabric, FabricKind, FaultKind, Op};
use crate::fti::{FtiApi, FtiFabric};
use crate::redfish::RedfishFabric;
use crate::report::{CheckResult, Report, Status};
use crate::trace::{CallTrace, Recorder, UseRecord, millis};

/// How long an attach or detach may stay in progress before the check gives up.
const SETTLE: Duration = Duration::from_secs(30);
/// How often an in-progress operation is asked again.
const POLL: Duration = Duration::from_millis(200);
/// How far past its deadline a call may return (the runtime's grace is 250 ms).
const DEADLINE_SLACK: Duration = Duration::from_millis(1000);
/// The node every simulated check attaches to.
const NODE: &str = "conformance-0";

/// How the suite runs.
#[derive(Debug, Clone)]
pub struct SuiteOptions {
    pub component: PathBuf,
    /// The fabric; `None`: chosen from `describe()`.
    pub fabric: Option<FabricKind>,
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

/// A vendor's own fabric: the spec (grants, config, limits) and the cluster objects
/// the provider may look up, given by the vendor.
#[derive(Debug, Clone)]
pub struct LabTarget {
    pub spec: ProviderSpec,
    pub cluster: StaticCluster,
    /// Shown in the report (`lab <endpoint>`).
    pub endpoint: String,
    /// Attach, check and detach a device on this node (destructive): only with it.
    pub attach: Option<LabAttach>,
}

/// What `--allow-attach` attaches on a lab fabric.
#[derive(Debug, Clone)]
pub struct LabAttach {
    pub node: String,
    pub device_type: DeviceType,
    pub model: String,
}

/// A [`LabAttach`] (its fields are public; this keeps callers' code short).
pub fn lab_attach(node: &str, device_type: DeviceType, model: String) -> LabAttach {
    LabAttach {
        node: node.to_string(),
        device_type,
        model,
    }
}

/// One loaded provider with its recorder, and the calls of the running check.
struct Subject {
    provider: Provider,
    recorder: Arc<Recorder>,
}

struct Run {
    main: Subject,
    info: Option<ProviderInfo>,
    config: BTreeMap<String, String>,
    /// The calls of the check running now.
    calls: Vec<CallTrace>,
    /// Every capability use of the main provider during the run.
    uses: Vec<UseRecord>,
    /// Every call of the main provider during the run.
    all_calls: Vec<CallTrace>,
    /// Calls the sandbox stopped for memory or another budget.
    over_budget: Vec<String>,
    memory_limit: u64,
    checks: Vec<CheckResult>,
}

type Verdict = (Status, String);

fn pass(why: impl Into<String>) -> Verdict {
    (Status::Pass, why.into())
}

fn fail(why: impl Into<String>) -> Verdict {
    (Status::Fail, why.into())
}

fn skip(why: impl Into<String>) -> Verdict {
    (Status::Skip, why.into())
}

fn outcome_text<T: std::fmt::Debug>(r: &Result<T, CallError>) -> String {
    match r {
        Ok(v) => format!("ok: {v:?}"),
        Err(e) => format!("error: {e}"),
    }
}

impl Run {
    fn note<T: std::fmt::Debug>(
        &mut self,
        recorder: &Recorder,
        op: &str,
        r: &Result<T, CallError>,
        main: bool,
    ) {
        let trace = recorder.take_call(op, outcome_text(r));
        if let Err(e @ (CallError::OutOfMemory { .. } | CallError::Budget(_))) = r {
            self.over_budget.push(format!("{op}: {e}"));
        }
        if main {
            self.uses.extend(trace.uses.iter().cloned());
            self.all_calls.push(trace.clone());
        }
        self.calls.push(trace);
    }

    async fn add(&mut self, req: &AddRequest) -> Result<AddOutcome, CallError> {
        let r = self.main.provider.add(req).await;
        let rec = self.main.recorder.clone();
        self.note(&rec, "add-resource", &r, true);
        r
    }

    async fn remove(&mut self, res: &ComposableResource) -> Result<RemoveOutcome, CallError> {
        let r = self.main.provider.remove_resource(res).await;
        let rec = self.main.recorder.clone();
        self.note(&rec, "remove-resource", &r, true);
        r
    }

    async fn check(&mut self, res: &ComposableResource) -> Result<(), CallError> {
        let r = self.main.provider.check_resource(res).await;
        let rec = self.main.recorder.clone();
        self.note(&rec, "check-resource", &r, true);
        r
    }

    async fn list(&mut self, claims: &[Claim]) -> Result<Vec<DeviceInfo>, CallError> {
        let r = self.main.provider.list(claims).await;
        let rec = self.main.recorder.clone();
        self.note(&rec, "get-resources", &r, true);
        r
    }

    /// Attaches, asking again while the provider says it is in progress.
    async fn attach(&mut self, req: &AddRequest) -> Result<AttachedDevice, String> {
        let end = Instant::now() + SETTLE;
        loop {
            match self.add(req).await {
                Ok(AddOutcome::Attached(d)) => return Ok(d),
                Ok(AddOutcome::InProgress(why)) if Instant::now() < end => {
                    let _ = why;
                    tokio::time::sleep(POLL).await;
                }
                Ok(AddOutcome::InProgress(why)) => {
                    return Err(format!(
                        "still in progress after {} s ({why})",
                        SETTLE.as_secs()
                    ));
                }
                Err(e) => return Err(e.to_string()),
            }
        }
    }

    /// Detaches, asking again while in progress.
    async fn detach(&mut self, res: &ComposableResource) -> Result<(), String> {
        let end = Instant::now() + SETTLE;
        loop {
            match self.remove(res).await {
                Ok(RemoveOutcome::Removed) => return Ok(()),
                Ok(RemoveOutcome::InProgress(_)) if Instant::now() < end => {
                    tokio::time::sleep(POLL).await;
                }
                Ok(RemoveOutcome::InProgress(why)) => {
                    return Err(format!(
                        "still in progress after {} s ({why})",
                        SETTLE.as_secs()
                    ));
                }
                Err(e) => return Err(e.to_string()),
            }
        }
    }

    fn record(&mut self, name: &str, started: Instant, verdict: Verdict) {
        self.checks.push(CheckResult {
            name: name.to_string(),
            status: verdict.0,
            why: verdict.1,
            duration_ms: millis(started.elapsed()),
            calls: std::mem::take(&mut self.calls),
        });
    }
}

/// A resource of the suite: `name` on `node`.
fn resource(name: &str, node: &str, device_type: DeviceType, model: &str) -> ComposableResource {
    ComposableResource {
        name: name.to_string(),
        device_type,
        model: model.to_string(),
        target_node: node.to_string(),
        device_id: None,
        fabric_device_id: None,
        machine_id: None,
        force_detach: false,
    }
}

fn with_device(r: &ComposableResource, d: &AttachedDevice) -> ComposableResource {
    let mut r = r.clone();
    r.device_id = Some(d.device_id.clone());
    r.fabric_device_id = Some(d.fabric_device_id.clone());
    r.machine_id = d.machine_id.clone();
    r
}

fn claim(r: &ComposableResource, d: &AttachedDevice) -> Claim {
    Claim {
        resource: r.name.clone(),
        device_id: Some(d.device_id.clone()),
        fabric_device_id: Some(d.fabric_device_id.clone()),
    }
}

fn request(r: &ComposableResource, key: &str, claims: Vec<Claim>) -> AddRequest {
    AddRequest {
        resource: r.clone(),
        attempt_key: key.to_string(),
        size_bytes: match r.device_type {
            DeviceType::CxlMemory => Some(1 << 30),
            DeviceType::Gpu => None,
        },
        claims,
    }
}

/// Whether `result` is the typed error a provider owes for `fault`; `Err` says why not.
///
/// `may_succeed`: the fabric acted before the fault (a mutation whose reply body the
/// provider need not read), so success is fine too; what matters then is the retry.
pub(crate) fn typed_for(
    fault: FaultKind,
    result: &Result<String, CallError>,
    may_succeed: bool,
) -> Result<String, String> {
    let e = match result {
        Ok(ok) if may_succeed => {
            return Ok(format!("{} still gave a result ({ok})", fault.describe()));
        }
        Ok(ok) => return Err(format!("succeeded despite {} ({ok})", fault.describe())),
        Err(e) => e,
    };
    let fits = match (fault, e) {
        (_, CallError::Provider(ProviderError::Other(m))) => {
            return Err(format!(
                "reported {} as the untyped `other` error ({m}); use fabric, malformed-reply or unavailable",
                fault.describe()
            ));
        }
        (FaultKind::ServerError, CallError::Provider(ProviderError::Fabric(f))) => {
            (500..600).contains(&f.status)
        }
        (FaultKind::ServerError, CallError::Provider(ProviderError::Unavailable(_))) => true,
        (FaultKind::MalformedBody, CallError::Provider(ProviderError::MalformedReply(_))) => true,
        (
            FaultKind::LostRequest | FaultKind::LostReply,
            CallError::Provider(ProviderError::Unavailable(_)),
        ) => true,
        (FaultKind::Slow(_), CallError::Timeout(_)) => true,
        (FaultKind::Slow(_), CallError::Provider(ProviderError::Unavailable(_))) => true,
        _ => false,
    };
    if fits {
        Ok(format!("{} gave `{e}`", fault.describe()))
    } else {
        Err(format!(
            "{} gave `{e}`; expected {}",
            fault.describe(),
            match fault {
                FaultKind::ServerError => "a fabric error with the 5xx status or unavailable",
                FaultKind::MalformedBody => "malformed-reply",
                FaultKind::LostRequest | FaultKind::LostReply => "unavailable",
                FaultKind::Slow(_) => "the call's deadline (or unavailable)",
            }
        ))
    }
}

fn spec_for(
    name: &str,
    component: &std::path::Path,
    config: &BTreeMap<String, String>,
    grants: &Value,
    timeout_ms: u64,
    memory_bytes: u64,
) -> Result<ProviderSpec, SuiteError> {
    let spec = json!({
        "name": name,
        "component": component,
        "config": config,
        "grants": grants,
        "limits": {"call_timeout_ms": timeout_ms, "memory_bytes": memory_bytes},
    });
    ProviderSpec::from_json(&spec.to_string(), std::path::Path::new("/"))
        .map_err(|e| SuiteError::Spec(e.to_string()))
}

async fn load(
    runtime: &Runtime,
    spec: &ProviderSpec,
    bytes: &[u8],
    cluster: StaticCluster,
) -> Result<Subject, SuiteError> {
    let recorder = Arc::new(Recorder::new());
    let provider = runtime
        .load_observed(spec, bytes.to_vec(), Arc::new(cluster), recorder.clone())
        .await
        .map_err(|e| SuiteError::Load(e.to_string()))?;
    Ok(Subject { provider, recorder })
}

fn read_component(path: &std::path::Path) -> Result<Vec<u8>, SuiteError> {
    std::fs::read(path).map_err(|source| SuiteError::Read {
        path: path.display().to_string(),
        source,
    })
}

/// What a provider describes itself as, on one line.
fn who(info: &ProviderInfo) -> String {
    format!("{} {} by {}", info.name, info.version, info.vendor)
}

/// The device type and model the suite asks for: the first the provider declares
/// (a GPU when it declares one).
fn wanted_device(info: Option<&ProviderInfo>) -> (DeviceType, Option<String>) {
    let Some(info) = info else {
        return (DeviceType::Gpu, None);
    };
    let kind = info
        .devices
        .iter()
        .find(|d| d.device_type == DeviceType::Gpu)
        .or_else(|| info.devices.first());
    match kind {
        Some(k) => (k.device_type, k.models.first().cloned()),
        None => (DeviceType::Gpu, None),
    }
}

/// Runs the suite against the simulator of the provider's fabric.
pub async fn run_simulated(opts: &SuiteOptions) -> Result<Report, SuiteError> {
    let started = Instant::now();
    let bytes = read_component(&opts.component)?;
    let runtime =
        Runtime::new(opts.runtime.clone()).map_err(|e| SuiteError::Load(e.to_string()))?;
    let info = runtime
        .describe_bytes(bytes.clone())
        .await
        .map_err(|e| SuiteError::Load(e.to_string()))?;
    let kind = match (opts.fabric, &info) {
        (Some(k), _) => k,
        (None, Some(i)) => FabricKind::from_info(i)
            .ok_or_else(|| SuiteError::NoFabric(format!(" from its describe() ({})", who(i))))?,
        (None, None) => {
            return Err(SuiteError::NoFabric(
                " (contract 0.1.0 has no describe())".into(),
            ));
        }
    };
    // A provider that can use the FTI Cluster Manager (it takes a `cluster_id`) is run
    // against it: asynchronous, with claims; otherwise the Fabric Manager API.
    let fti_api = match &info {
        Some(i) if i.config.iter().any(|k| k.name == "cluster_id") => FtiApi::Cm,
        _ => FtiApi::Fm,
    };
    let fabric: Box<dyn Fabric> = match kind {
        FabricKind::Fti => Box::new(FtiFabric::start(fti_api)?),
        FabricKind::Redfish => Box::new(RedfishFabric::start()?),
    };
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
    let main = load(&runtime, &spec, &bytes, fabric.cluster().clone()).await?;
    let contract = main.provider.contract_version().to_string();
    let mut run = Run {
        main,
        info: info.clone(),
        config: config.clone(),
        calls: Vec::new(),
        uses: Vec::new(),
        all_calls: Vec::new(),
        over_budget: Vec::new(),
        memory_limit: opts.memory_bytes,
        checks: Vec::new(),
    };

    let t = Instant::now();
    let verdict = describe_verdict(info.as_ref(), opts.fabric.is_some(), kind);
    run.record("describe", t, verdict);

    let machine = fabric.add_node(NODE);
    let (device_type, declared_model) = wanted_device(info.as_ref());
    let model = fabric.add_free_devices(device_type, declared_model.as_deref(), 8);
    let r1 = resource("conformance-dev-1", NODE, device_type, &model);

    // attach
    let t = Instant::now();
    let mut dev1 = None;
    let verdict = match run.attach(&request(&r1, "attempt-1", vec![])).await {
        Err(e) => fail(format!("attach failed: {e}")),
        Ok(d) => {
            let held = fabric.attached(&machine);
            let verdict = if !held.iter().any(|f| f.is(&d) && f.ready) {
                fail(format!(
                    "the provider reported device {} (fabric id {}) attached, but the fabric holds {} on machine {machine}",
                    d.device_id,
                    d.fabric_device_id,
                    describe_held(&held)
                ))
            } else if held.len() != 1 {
                fail(format!(
                    "one attach left {} devices on the machine",
                    held.len()
                ))
            } else if d.machine_id.as_deref().is_some_and(|m| m != machine) {
                fail(format!(
                    "the provider reported machine {:?}; the fabric attached the device to {machine}",
                    d.machine_id
                ))
            } else {
                pass(format!(
                    "device {} attached to machine {machine}",
                    d.device_id
                ))
            };
            if verdict.0 == Status::Pass {
                dev1 = Some(d);
            }
            verdict
        }
    };
    run.record("attach", t, verdict);

    let needs = "needs a passing `attach`";
    match &dev1 {
        None => {
            for name in [
                "check",
                "check-warning",
                "get-resources",
                "in-progress",
                "lost-reply-retry",
                "detach",
                "detach-twice",
                "fault-5xx-check",
                "fault-malformed-check",
                "fault-lost-check",
            ] {
                run.record(name, Instant::now(), skip(needs));
            }
        }
        Some(dev1) => {
            attached_checks(&mut run, fabric.as_ref(), &machine, &r1, dev1, &model).await;
        }
    }

    for (name, fault) in [
        ("fault-5xx-attach", FaultKind::ServerError),
        ("fault-malformed-attach", FaultKind::MalformedBody),
        ("fault-lost-attach", FaultKind::LostRequest),
    ] {
        let t = Instant::now();
        let verdict = fault_on_attach(
            &mut run,
            fabric.as_ref(),
            &machine,
            fault,
            name,
            &model,
            dev1.as_ref(),
        )
        .await;
        fabric.clear_faults();
        run.record(name, t, verdict);
    }

    // deadline: a provider whose deadline is short, against a reply that comes later.
    let t = Instant::now();
    let short_spec = spec_for(
        "conformance-deadline",
        &opts.component,
        &config,
        &grants,
        opts.deadline_ms,
        opts.memory_bytes,
    )?;
    let short = load(&runtime, &short_spec, &bytes, fabric.cluster().clone()).await?;
    let deadline = Duration::from_millis(opts.deadline_ms);
    let probe = match &dev1 {
        Some(d) => with_device(&r1, d),
        None => r1.clone(),
    };
    fabric.inject(
        FaultKind::Slow(deadline + Duration::from_millis(1500)),
        Op::First,
    );
    let called = Instant::now();
    let r = short.provider.check_resource(&probe).await;
    let took = called.elapsed();
    run.note(
        &short.recorder,
        "check-resource (short deadline)",
        &r,
        false,
    );
    fabric.clear_faults();
    let slow = FaultKind::Slow(deadline + Duration::from_millis(1500));
    let verdict = match typed_for(slow, &r.map(|()| "ok".to_string()), false) {
        Err(why) => fail(why),
        Ok(_) if took > deadline + DEADLINE_SLACK => fail(format!(
            "the call returned {} ms after it started; its deadline was {} ms",
            took.as_millis(),
            deadline.as_millis()
        )),
        Ok(why) => {
            // The provider must still work after a call that ran out of time.
            let after = match &dev1 {
                Some(_) => run.check(&probe).await.map(|_| ()),
                None => Ok(()),
            };
            match after {
                Ok(()) => pass(format!(
                    "{why} after {} ms (deadline {} ms); the next call works",
                    took.as_millis(),
                    deadline.as_millis()
                )),
                Err(e) => fail(format!(
                    "after a call hit its deadline the next check failed: {e}"
                )),
            }
        }
    };
    run.record("deadline", t, verdict);

    // denied: the same provider with no HTTP grant.
    let t = Instant::now();
    let mut no_http = grants.clone();
    no_http["http"] = json!([]);
    let denied_spec = spec_for(
        "conformance-denied",
        &opts.component,
        &config,
        &no_http,
        opts.call_timeout_ms,
        opts.memory_bytes,
    )?;
    let denied = load(&runtime, &denied_spec, &bytes, fabric.cluster().clone()).await?;
    let claims: Vec<Claim> = dev1.iter().map(|d| claim(&r1, d)).collect();
    let verdict = denied_verdict(&mut run, &denied, &claims).await;
    run.record("denied", t, verdict);

    let fabric_name = match (kind, fti_api) {
        (FabricKind::Fti, FtiApi::Fm) => "fti (Fabric Manager API)".to_string(),
        (FabricKind::Fti, FtiApi::Cm) => "fti (Cluster Manager API)".to_string(),
        (k, _) => k.as_str().to_string(),
    };
    finish(run, opts, fabric_name, contract, started)
}

fn describe_held(held: &[crate::fabric::FabricDevice]) -> String {
    if held.is_empty() {
        return "no device".into();
    }
    let ids: Vec<String> = held
        .iter()
        .map(|d| {
            format!(
                "{}{}",
                d.ids.join("/"),
                if d.ready { "" } else { " (not ready)" }
            )
        })
        .collect();
    ids.join(", ")
}

fn describe_verdict(info: Option<&ProviderInfo>, given: bool, kind: FabricKind) -> Verdict {
    match info {
        None => skip("contract 0.1.0 has no describe()"),
        Some(i) if i.devices.is_empty() => fail(format!("{} declares no device kinds", who(i))),
        Some(i) if i.name.trim().is_empty() || i.vendor.trim().is_empty() => {
            fail("describe() must name the provider and its vendor")
        }
        Some(i) => {
            let how = if given {
                "given with --fabric"
            } else {
                "chosen from describe()"
            };
            pass(format!("{}; fabric {} ({how})", who(i), kind.as_str()))
        }
    }
}

async fn denied_verdict(run: &mut Run, denied: &Subject, claims: &[Claim]) -> Verdict {
    let r = denied.provider.list(claims).await;
    run.note(&denied.recorder, "get-resources (no http grant)", &r, false);
    let traced = run
        .calls
        .last()
        .map(|c| c.uses.iter().any(UseRecord::denied))
        .unwrap_or(false);
    match r {
        Err(CallError::Provider(ProviderError::Denied(m))) if traced => {
            pass(format!("reported `denied` ({m})"))
        }
        Err(CallError::Provider(ProviderError::Denied(m))) => fail(format!(
            "reported `denied` ({m}) although the host refused nothing"
        )),
        Err(e) if traced => fail(format!(
            "the host refused a capability but the provider reported `{e}`, not `denied`"
        )),
        Err(e) => fail(format!(
            "with no HTTP grant the provider failed with `{e}` without asking for HTTP"
        )),
        Ok(devices) => fail(format!(
            "get-resources succeeded with no HTTP grant ({} devices): it did not ask the fabric",
            devices.len()
        )),
    }
}

/// The checks that need the first attached device.
async fn attached_checks(
    run: &mut Run,
    fabric: &dyn Fabric,
    machine: &str,
    r1: &ComposableResource,
    dev1: &AttachedDevice,
    model: &str,
) {
    let held1 = with_device(r1, dev1);
    let claim1 = claim(r1, dev1);

    let t = Instant::now();
    let before = fabric.attached(machine);
    let mut verdict = pass("healthy three times in a row; the fabric unchanged");
    for i in 1..=3 {
        if let Err(e) = run.check(&held1).await {
            verdict = fail(format!(
                "check {i} of a healthy attached device failed: {e}"
            ));
            break;
        }
    }
    if verdict.0 == Status::Pass && fabric.attached(machine) != before {
        verdict = fail("checking changed what the fabric has attached");
    }
    run.record("check", t, verdict);

    let t = Instant::now();
    let verdict = match fabric.set_warning(&dev1.device_id, true) {
        Err(why) => skip(format!("the simulator cannot degrade the device: {why}")),
        Ok(()) => {
            let r = run.check(&held1).await;
            let _ = fabric.set_warning(&dev1.device_id, false);
            match r {
                Err(CallError::Provider(ProviderError::Warning(m))) => {
                    pass(format!("a degraded device is `warning` ({m})"))
                }
                Err(e) => fail(format!("a degraded device gave `{e}`, expected `warning`")),
                Ok(()) => fail("a degraded device was reported healthy"),
            }
        }
    };
    run.record("check-warning", t, verdict);

    let t = Instant::now();
    let verdict = match run.list(std::slice::from_ref(&claim1)).await {
        Err(e) => fail(format!("get-resources failed: {e}")),
        Ok(devices) => {
            match devices.iter().find(|d| {
                d.device_id == dev1.device_id || d.fabric_device_id == dev1.fabric_device_id
            }) {
                None => fail(format!(
                    "the attached device {} is not listed ({} devices listed)",
                    dev1.device_id,
                    devices.len()
                )),
                Some(d) if d.node != NODE => fail(format!(
                    "device {} is listed on node {:?}, not {NODE}",
                    dev1.device_id, d.node
                )),
                Some(d) if d.device_type != r1.device_type => fail(format!(
                    "device {} is listed as {:?}, not {:?}",
                    dev1.device_id, d.device_type, r1.device_type
                )),
                Some(_) => pass(format!(
                    "{} devices listed, the attached one on {NODE}",
                    devices.len()
                )),
            }
        }
    };
    run.record("get-resources", t, verdict);

    // in-progress: a fabric that takes its time.
    let t = Instant::now();
    let verdict = match fabric.set_slow(Some(Duration::from_millis(1500))) {
        Err(why) => skip(why),
        Ok(()) => {
            let v = in_progress(run, fabric, machine, &claim1, model, r1.device_type).await;
            let _ = fabric.set_slow(None);
            v
        }
    };
    run.record("in-progress", t, verdict);

    // lost reply: the fabric attaches, the reply never comes; the retry must find it.
    let t = Instant::now();
    let r3 = resource("conformance-dev-3", NODE, r1.device_type, model);
    let req3 = request(&r3, "attempt-3", vec![claim1.clone()]);
    let base = fabric.attached(machine).len();
    fabric.inject(FaultKind::LostReply, Op::Attach);
    let first = run.add(&req3).await;
    fabric.clear_faults();
    let mut dev3 = None;
    let verdict = match run.attach(&req3).await {
        Err(e) => fail(format!(
            "after a lost reply ({}), the retried attach failed: {e}",
            outcome_text(&first)
        )),
        Ok(d) => {
            let held = fabric.attached(machine).len();
            dev3 = Some(d.clone());
            if held != base + 1 {
                fail(format!(
                    "the retried attach after a lost reply attached a second device: the fabric holds {held} devices on the machine, {} expected (use the attempt key and the claims to find the device the lost reply attached)",
                    base + 1
                ))
            } else if d.device_id == dev1.device_id {
                fail("the retried attach returned the first resource's (claimed) device")
            } else {
                pass(format!(
                    "the retry found device {} the lost reply attached",
                    d.device_id
                ))
            }
        }
    };
    run.record("lost-reply-retry", t, verdict);

    let t = Instant::now();
    let base = fabric.attached(machine).len();
    let verdict = match &dev3 {
        None => skip("needs the device of `lost-reply-retry`"),
        Some(d3) => {
            let held3 = with_device(&r3, d3);
            match run.detach(&held3).await {
                Err(e) => fail(format!("detach failed: {e}")),
                Ok(()) => {
                    let held = fabric.attached(machine);
                    if held.iter().any(|f| f.is(d3)) {
                        fail(format!(
                            "detach said removed but the fabric still holds {}",
                            d3.device_id
                        ))
                    } else if held.len() + 1 != base {
                        fail(format!(
                            "the machine held {base} devices before the detach and {} after, one fewer expected",
                            held.len()
                        ))
                    } else {
                        pass(format!("device {} detached", d3.device_id))
                    }
                }
            }
        }
    };
    let detached = verdict.0 == Status::Pass;
    run.record("detach", t, verdict);

    let t = Instant::now();
    let base = fabric.attached(machine);
    let verdict = match (&dev3, detached) {
        (Some(d3), true) => match run.remove(&with_device(&r3, d3)).await {
            Ok(RemoveOutcome::Removed) if fabric.attached(machine) == base => {
                pass("a second detach is `removed` and changes nothing")
            }
            Ok(RemoveOutcome::Removed) => fail("a second detach changed what the fabric holds"),
            Ok(RemoveOutcome::InProgress(w)) => fail(format!(
                "a second detach of a detached device is in progress ({w}), expected `removed`"
            )),
            Err(e) => fail(format!("a second detach of a detached device failed: {e}")),
        },
        _ => skip("needs a passing `detach`"),
    };
    run.record("detach-twice", t, verdict);

    for (name, fault) in [
        ("fault-5xx-check", FaultKind::ServerError),
        ("fault-malformed-check", FaultKind::MalformedBody),
        ("fault-lost-check", FaultKind::LostRequest),
    ] {
        let t = Instant::now();
        fabric.inject(fault, Op::First);
        let r = run.check(&held1).await;
        fabric.clear_faults();
        let verdict = match typed_for(fault, &r.map(|()| "healthy".to_string()), false) {
            Ok(why) => pass(why),
            Err(why) => fail(why),
        };
        run.record(name, t, verdict);
    }
}

async fn in_progress(
    run: &mut Run,
    fabric: &dyn Fabric,
    machine: &str,
    claim1: &Claim,
    model: &str,
    device_type: DeviceType,
) -> Verdict {
    let r2 = resource("conformance-dev-2", NODE, device_type, model);
    let req2 = request(&r2, "attempt-2", vec![claim1.clone()]);
    let base = fabric.attached(machine).len();
    let first = run.add(&req2).await;
    let mut said_in_progress = matches!(first, Ok(AddOutcome::InProgress(_)));
    if let Err(e) = &first {
        return fail(format!("an attach on a slow fabric failed: {e}"));
    }
    // Asked again while the fabric works: nothing more may be attached.
    let mut dev2 = None;
    let end = Instant::now() + SETTLE;
    while dev2.is_none() {
        if fabric.attached(machine).len() > base + 1 {
            return fail("asking again while the attach was in progress attached another device");
        }
        match run.add(&req2).await {
            Ok(AddOutcome::Attached(d)) => dev2 = Some(d),
            Ok(AddOutcome::InProgress(_)) if Instant::now() < end => {
                said_in_progress = true;
                tokio::time::sleep(POLL).await;
            }
            Ok(AddOutcome::InProgress(w)) => {
                return fail(format!(
                    "still in progress after {} s ({w})",
                    SETTLE.as_secs()
                ));
            }
            Err(e) => return fail(format!("asking again while in progress failed: {e}")),
        }
    }
    let Some(dev2) = dev2 else {
        return fail("no device");
    };
    let held = fabric.attached(machine);
    if held.len() != base + 1 || !held.iter().any(|f| f.is(&dev2) && f.ready) {
        return fail(format!(
            "after the in-progress attach the fabric holds {}, expected the first device and {}",
            describe_held(&held),
            dev2.device_id
        ));
    }
    if let Err(e) = run.detach(&with_device(&r2, &dev2)).await {
        return fail(format!("detaching on a slow fabric failed: {e}"));
    }
    let held = fabric.attached(machine);
    if held.iter().any(|f| f.is(&dev2)) {
        return fail(format!(
            "detach said removed but the fabric still holds {}",
            dev2.device_id
        ));
    }
    pass(if said_in_progress {
        "in progress while the fabric worked, then attached and detached once".to_string()
    } else {
        "the provider waited for the fabric inside the call; one device attached".to_string()
    })
}

async fn fault_on_attach(
    run: &mut Run,
    fabric: &dyn Fabric,
    machine: &str,
    fault: FaultKind,
    name: &str,
    model: &str,
    dev1: Option<&AttachedDevice>,
) -> Verdict {
    let r = resource(
        &format!("conformance-{name}"),
        NODE,
        wanted_type(run),
        model,
    );
    let claims: Vec<Claim> = dev1
        .map(|d| {
            claim(
                &resource("conformance-dev-1", NODE, r.device_type, model),
                d,
            )
        })
        .into_iter()
        .collect();
    let req = request(&r, &format!("attempt-{name}"), claims);
    let before = fabric.attached(machine).len();
    fabric.inject(fault, Op::Attach);
    let first = run.add(&req).await;
    fabric.clear_faults();
    let first = match first {
        Ok(AddOutcome::InProgress(w)) => Ok(format!("in progress ({w})")),
        Ok(AddOutcome::Attached(d)) => Ok(format!("attached {}", d.device_id)),
        Err(e) => Err(e),
    };
    let may_succeed = matches!(fault, FaultKind::MalformedBody | FaultKind::LostReply);
    let typed = match typed_for(fault, &first, may_succeed) {
        Ok(why) => why,
        Err(why) => return fail(why),
    };
    // The retry (same attempt key) attaches exactly one device, then it is detached.
    match run.attach(&req).await {
        Err(e) => fail(format!("{typed}, but the retry failed: {e}")),
        Ok(d) => {
            let after = fabric.attached(machine).len();
            let cleanup = run.detach(&with_device(&r, &d)).await;
            if after != before + 1 {
                fail(format!(
                    "{typed}; the retry left {after} devices on the machine, {} expected",
                    before + 1
                ))
            } else if let Err(e) = cleanup {
                fail(format!("{typed}; detaching the retried device failed: {e}"))
            } else {
                pass(format!("{typed}; the retry attached one device"))
            }
        }
    }
}

fn wanted_type(run: &Run) -> DeviceType {
    wanted_device(run.info.as_ref()).0
}

/// `declared-capabilities` and `resources`, then the report.
fn finish(
    mut run: Run,
    opts: &SuiteOptions,
    fabric: String,
    contract: String,
    started: Instant,
) -> Result<Report, SuiteError> {
    let t = Instant::now();
    let verdict = declared_verdict(&run);
    run.record("declared-capabilities", t, verdict);
    let t = Instant::now();
    let verdict = resources_verdict(&run);
    run.record("resources", t, verdict);
    Ok(Report {
        component: opts.component.display().to_string(),
        provider: run.info.as_ref().map(who),
        contract,
        fabric,
        checks: run.checks,
        duration_ms: millis(started.elapsed()),
    })
}

/// The origin (`scheme://host:port`) of a URL or of a configured endpoint (FTI's
/// `host:port/` means HTTPS).
fn origin(text: &str) -> Option<String> {
    let text = if text.contains("://") {
        text.to_string()
    } else {
        format!("https://{text}")
    };
    let url = url::Url::parse(&text).ok()?;
    Some(format!(
        "{}://{}:{}",
        url.scheme(),
        url.host_str()?,
        url.port_or_known_default()?
    ))
}

fn declared_verdict(run: &Run) -> Verdict {
    let Some(info) = &run.info else {
        return skip("contract 0.1.0 has no describe(): nothing declared to compare with");
    };
    let wants = &info.capabilities;
    let origins: Vec<String> = wants
        .http
        .iter()
        .filter_map(
            |p| match p.strip_prefix("${").and_then(|k| k.strip_suffix('}')) {
                Some(key) => run.config.get(key).and_then(|v| origin(v)),
                None => origin(p),
            },
        )
        .collect();
    let mut undeclared = Vec::new();
    for u in &run.uses {
        let ok = match u.capability {
            cro_runtime::CapabilityKind::Http => u
                .target
                .split_once(' ')
                .and_then(|(_, url)| origin(url))
                .is_some_and(|o| origins.contains(&o)),
            cro_runtime::CapabilityKind::Secret => wants.secret_keys.contains(&u.target),
            cro_runtime::CapabilityKind::Lookup => {
                let mut parts = u.target.split(' ');
                let (api, kind) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
                wants
                    .lookup
                    .iter()
                    .any(|l| l.api_version == api && l.kind == kind)
            }
        };
        let line = u.line();
        if !ok
            && !undeclared
                .iter()
                .any(|l: &String| l.split(" -> ").next() == line.split(" -> ").next())
        {
            undeclared.push(line);
        }
    }
    if run.uses.is_empty() {
        return fail("the provider used no capability during the run: nothing reached the fabric");
    }
    if undeclared.is_empty() {
        pass(format!(
            "all {} capability uses were declared in describe()",
            run.uses.len()
        ))
    } else {
        fail(format!(
            "used but not declared in describe(): {}",
            undeclared
                .iter()
                .map(|l| l.split(" -> ").next().unwrap_or(l).to_string())
                .collect::<Vec<_>>()
                .join("; ")
        ))
    }
}

fn resources_verdict(run: &Run) -> Verdict {
    if run.all_calls.is_empty() {
        return fail("no call completed");
    }
    let peak = run
        .all_calls
        .iter()
        .map(|c| c.peak_memory_bytes)
        .max()
        .unwrap_or(0);
    let mut per_op: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    for c in &run.all_calls {
        per_op
            .entry(c.operation.as_str())
            .or_default()
            .push(c.duration_ms);
    }
    let times: Vec<String> = per_op
        .iter_mut()
        .map(|(op, ms)| {
            ms.sort_by(f64::total_cmp);
            let median = ms[ms.len() / 2];
            let max = ms[ms.len() - 1];
            format!(
                "{op} median {median:.1} ms max {max:.1} ms ({} calls)",
                ms.len()
            )
        })
        .collect();
    let summary = format!(
        "peak memory {:.1} MiB of {:.0} MiB; {}",
        peak as f64 / f64::from(1 << 20),
        run.memory_limit as f64 / f64::from(1 << 20),
        times.join("; ")
    );
    if run.over_budget.is_empty() {
        pass(summary)
    } else {
        fail(format!(
            "the sandbox stopped calls: {}; {summary}",
            run.over_budget.join("; ")
        ))
    }
}

/// Runs the non-destructive checks (and, with [`LabTarget::attach`], attach, check,
/// detach and a second detach) against a vendor's own fabric.
pub async fn run_lab(opts: &SuiteOptions, lab: &LabTarget) -> Result<Report, SuiteError> {
    let started = Instant::now();
    let bytes = read_component(&opts.component)?;
    let runtime =
        Runtime::new(opts.runtime.clone()).map_err(|e| SuiteError::Load(e.to_string()))?;
    let info = runtime
        .describe_bytes(bytes.clone())
        .await
        .map_err(|e| SuiteError::Load(e.to_string()))?;
    let mut spec = lab.spec.clone();
    spec.component = opts.component.clone();
    let main = load(&runtime, &spec, &bytes, lab.cluster.clone()).await?;
    let contract = main.provider.contract_version().to_string();
    let mut run = Run {
        main,
        info: info.clone(),
        config: spec.config.clone(),
        calls: Vec::new(),
        uses: Vec::new(),
        all_calls: Vec::new(),
        over_budget: Vec::new(),
        memory_limit: spec.limits.memory_bytes,
        checks: Vec::new(),
    };
    let t = Instant::now();
    let verdict = match &info {
        None => skip("contract 0.1.0 has no describe()"),
        Some(i) if i.devices.is_empty() => fail(format!("{} declares no device kinds", who(i))),
        Some(i) => pass(who(i)),
    };
    run.record("describe", t, verdict);

    let t = Instant::now();
    let verdict = match run.list(&[]).await {
        Ok(devices) => pass(format!("{} devices listed", devices.len())),
        Err(e) => fail(format!("get-resources failed: {e}")),
    };
    run.record("get-resources", t, verdict);

    match &lab.attach {
        None => {
            for name in ["attach", "check", "detach", "detach-twice"] {
                run.record(
                    name,
                    Instant::now(),
                    skip("destructive against a lab fabric: pass --allow-attach and --node"),
                );
            }
        }
        Some(a) => {
            let r = resource("conformance-lab-1", &a.node, a.device_type, &a.model);
            let t = Instant::now();
            let attached = run.attach(&request(&r, "conformance-lab-1", vec![])).await;
            let verdict = match &attached {
                Ok(d) => pass(format!("device {} attached to {}", d.device_id, a.node)),
                Err(e) => fail(format!("attach failed: {e}")),
            };
            run.record("attach", t, verdict);
            match attached {
                Err(_) => {
                    for name in ["check", "detach", "detach-twice"] {
                        run.record(name, Instant::now(), skip("needs a passing `attach`"));
                    }
                }
                Ok(d) => {
                    let held = with_device(&r, &d);
                    let t = Instant::now();
                    let verdict = match run.check(&held).await {
                        Ok(()) => pass("healthy"),
                        Err(e) => fail(format!("check of the attached device failed: {e}")),
                    };
                    run.record("check", t, verdict);
                    let t = Instant::now();
                    let verdict = match run.detach(&held).await {
                        Ok(()) => pass("detached"),
                        Err(e) => fail(format!("detach failed: {e}")),
                    };
                    run.record("detach", t, verdict);
                    let t = Instant::now();
                    let verdict = match run.remove(&held).await {
                        Ok(RemoveOutcome::Removed) => pass("a second detach is `removed`"),
                        other => fail(format!("a second detach gave {}", outcome_text(&other))),
                    };
                    run.record("detach-twice", t, verdict);
                }
            }
        }
    }

    let t = Instant::now();
    let mut denied_spec = spec.clone();
    denied_spec.name = format!("{}-denied", spec.name);
    denied_spec.grants.http.clear();
    let denied = load(&runtime, &denied_spec, &bytes, lab.cluster.clone()).await?;
    let verdict = denied_verdict(&mut run, &denied, &[]).await;
    run.record("denied", t, verdict);

    finish(
        run,
        opts,
        format!("lab {}", lab.endpoint),
        contract,
        started,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use cro_runtime::FabricError;

    #[test]
    fn origins_of_urls_and_fti_endpoints() {
        assert_eq!(
            origin("https://h:8443/x/y").as_deref(),
            Some("https://h:8443")
        );
        assert_eq!(origin("h:8443/").as_deref(), Some("https://h:8443"));
        assert_eq!(
            origin("http://127.0.0.1/").as_deref(),
            Some("http://127.0.0.1:80")
        );
    }

    #[test]
    fn faults_need_their_typed_error() {
        let fabric = |status| {
            Err(CallError::Provider(ProviderError::Fabric(FabricError {
                status,
                code: String::new(),
                message: String::new(),
            })))
        };
        assert!(typed_for(FaultKind::ServerError, &fabric(503)).is_ok());
        assert!(typed_for(FaultKind::ServerError, &fabric(404)).is_err());
        let other = Err(CallError::Provider(ProviderError::Other("x".into())));
        assert!(
            typed_for(FaultKind::MalformedBody, &other)
                .unwrap_err()
                .contains("untyped")
        );
        assert!(
            typed_for(FaultKind::LostRequest, &Ok("fine".into()))
                .unwrap_err()
                .contains("succeeded")
        );
        let timeout = Err(CallError::Timeout(Duration::from_secs(1)));
        assert!(typed_for(FaultKind::Slow(Duration::from_secs(2)), &timeout).is_ok());
        assert!(typed_for(FaultKind::LostRequest, &timeout).is_err());
    }
}
