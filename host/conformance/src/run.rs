//! One run of the suite: the loaded provider, its recorder, every call made through it
//! and the checks recorded so far; and the helpers that build resources and specs.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cro_runtime::cluster::StaticCluster;
use cro_runtime::{
    AddOutcome, AddRequest, AttachedDevice, CallError, Claim, ComposableResource, DeviceInfo,
    DeviceType, PoolOutcome, PoolQuery, Provider, ProviderInfo, ProviderSpec, RemoveOutcome,
    Runtime, RuntimeOptions,
};
use serde_json::{Value, json};

use crate::SuiteError;
use crate::report::{CheckResult, Report, Status};
use crate::trace::{CallTrace, Recorder, UseRecord, millis};

/// How long an attach or detach may stay in progress before the check gives up.
pub(crate) const SETTLE: Duration = Duration::from_secs(30);
/// How often an in-progress operation is asked again.
pub(crate) const POLL: Duration = Duration::from_millis(200);
/// How far past its deadline a call may return (the runtime's grace is 250 ms).
pub(crate) const DEADLINE_SLACK: Duration = Duration::from_millis(1000);
/// The node every simulated check attaches to.
pub(crate) const NODE: &str = "conformance-0";

/// One loaded provider with its recorder, and the calls of the running check.
pub(crate) struct Subject {
    pub(crate) provider: Provider,
    pub(crate) recorder: Arc<Recorder>,
}

pub(crate) struct Run {
    pub(crate) main: Subject,
    pub(crate) info: Option<ProviderInfo>,
    pub(crate) config: BTreeMap<String, String>,
    /// The calls of the check running now.
    pub(crate) calls: Vec<CallTrace>,
    /// Every capability use of the main provider during the run.
    pub(crate) uses: Vec<UseRecord>,
    /// Every call of the main provider during the run.
    pub(crate) all_calls: Vec<CallTrace>,
    /// Calls the sandbox stopped for memory or another budget.
    pub(crate) over_budget: Vec<String>,
    pub(crate) memory_limit: u64,
    pub(crate) checks: Vec<CheckResult>,
}

impl Run {
    /// A run of `main`, configured with `config`, recording nothing yet.
    pub(crate) fn new(
        main: Subject,
        info: Option<ProviderInfo>,
        config: BTreeMap<String, String>,
        memory_limit: u64,
    ) -> Run {
        Run {
            main,
            info,
            config,
            calls: Vec::new(),
            uses: Vec::new(),
            all_calls: Vec::new(),
            over_budget: Vec::new(),
            memory_limit,
            checks: Vec::new(),
        }
    }

    /// The report of the checks recorded, for `component` against `fabric`.
    pub(crate) fn report(self, component: &Path, fabric: String, started: Instant) -> Report {
        Report {
            component: component.display().to_string(),
            provider: self.info.as_ref().map(who),
            contract: self.main.provider.contract_version().to_string(),
            fabric,
            checks: self.checks,
            duration_ms: millis(started.elapsed()),
        }
    }
}

/// The component under test: its bytes, the runtime that loads it and what its
/// `describe()` says (`None` for contract 0.1.0).
pub(crate) struct Component {
    pub(crate) runtime: Runtime,
    pub(crate) bytes: Vec<u8>,
    pub(crate) info: Option<ProviderInfo>,
}

impl Component {
    /// Reads the component at `path` and asks it what it is.
    pub(crate) async fn open(
        path: &Path,
        options: RuntimeOptions,
    ) -> Result<Component, SuiteError> {
        let bytes = read_component(path)?;
        let runtime = Runtime::new(options).map_err(|e| SuiteError::Load(e.to_string()))?;
        let info = runtime
            .describe_bytes(bytes.clone())
            .await
            .map_err(|e| SuiteError::Load(e.to_string()))?;
        Ok(Component {
            runtime,
            bytes,
            info,
        })
    }

    /// Loads the component as `spec` says, seeing `cluster`.
    pub(crate) async fn load(
        &self,
        spec: &ProviderSpec,
        cluster: StaticCluster,
    ) -> Result<Subject, SuiteError> {
        load(&self.runtime, spec, &self.bytes, cluster).await
    }
}

pub(crate) type Verdict = (Status, String);

pub(crate) fn pass(why: impl Into<String>) -> Verdict {
    (Status::Pass, why.into())
}

pub(crate) fn fail(why: impl Into<String>) -> Verdict {
    (Status::Fail, why.into())
}

pub(crate) fn skip(why: impl Into<String>) -> Verdict {
    (Status::Skip, why.into())
}

pub(crate) fn outcome_text<T: std::fmt::Debug>(r: &Result<T, CallError>) -> String {
    match r {
        Ok(v) => format!("ok: {v:?}"),
        Err(e) => format!("error: {e}"),
    }
}

impl Run {
    pub(crate) fn note<T: std::fmt::Debug>(
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

    pub(crate) async fn pool(&mut self, query: &PoolQuery) -> Result<PoolOutcome, CallError> {
        let r = self.main.provider.pool(query).await;
        let rec = self.main.recorder.clone();
        self.note(&rec, "get-pool", &r, true);
        r
    }

    pub(crate) async fn add(&mut self, req: &AddRequest) -> Result<AddOutcome, CallError> {
        let r = self.main.provider.add(req).await;
        let rec = self.main.recorder.clone();
        self.note(&rec, "add-resource", &r, true);
        r
    }

    pub(crate) async fn remove(
        &mut self,
        res: &ComposableResource,
    ) -> Result<RemoveOutcome, CallError> {
        let r = self.main.provider.remove_resource(res).await;
        let rec = self.main.recorder.clone();
        self.note(&rec, "remove-resource", &r, true);
        r
    }

    pub(crate) async fn check(&mut self, res: &ComposableResource) -> Result<(), CallError> {
        let r = self.main.provider.check_resource(res).await;
        let rec = self.main.recorder.clone();
        self.note(&rec, "check-resource", &r, true);
        r
    }

    pub(crate) async fn list(&mut self, claims: &[Claim]) -> Result<Vec<DeviceInfo>, CallError> {
        let r = self.main.provider.list(claims).await;
        let rec = self.main.recorder.clone();
        self.note(&rec, "get-resources", &r, true);
        r
    }

    /// Attaches, asking again while the provider says it is in progress.
    pub(crate) async fn attach(&mut self, req: &AddRequest) -> Result<AttachedDevice, String> {
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
    pub(crate) async fn detach(&mut self, res: &ComposableResource) -> Result<(), String> {
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

    pub(crate) fn record(&mut self, name: &str, started: Instant, verdict: Verdict) {
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
pub(crate) fn resource(
    name: &str,
    node: &str,
    device_type: DeviceType,
    model: &str,
) -> ComposableResource {
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

pub(crate) fn with_device(r: &ComposableResource, d: &AttachedDevice) -> ComposableResource {
    let mut r = r.clone();
    r.device_id = Some(d.device_id.clone());
    r.fabric_device_id = Some(d.fabric_device_id.clone());
    r.machine_id = d.machine_id.clone();
    r
}

pub(crate) fn claim(r: &ComposableResource, d: &AttachedDevice) -> Claim {
    Claim {
        resource: r.name.clone(),
        device_id: Some(d.device_id.clone()),
        fabric_device_id: Some(d.fabric_device_id.clone()),
    }
}

pub(crate) fn request(r: &ComposableResource, key: &str, claims: Vec<Claim>) -> AddRequest {
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

pub(crate) fn spec_for(
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

pub(crate) async fn load(
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

pub(crate) fn read_component(path: &std::path::Path) -> Result<Vec<u8>, SuiteError> {
    std::fs::read(path).map_err(|source| SuiteError::Read {
        path: path.display().to_string(),
        source,
    })
}

/// What a provider describes itself as, on one line.
pub(crate) fn who(info: &ProviderInfo) -> String {
    format!("{} {} by {}", info.name, info.version, info.vendor)
}

/// The device type and model the suite asks for: the first the provider declares
/// (a GPU when it declares one).
pub(crate) fn wanted_device(info: Option<&ProviderInfo>) -> (DeviceType, Option<String>) {
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

pub(crate) fn describe_held(held: &[crate::fabric::FabricDevice]) -> String {
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
