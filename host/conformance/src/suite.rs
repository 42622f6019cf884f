//! Running the suite against the simulator of the provider's fabric.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use cro_runtime::{Claim, ProviderInfo, Runtime, RuntimeOptions};
use serde_json::json;

use crate::SuiteError;
use crate::checks::*;
use crate::fabric::{Fabric, FabricKind, FaultKind, Op};
use crate::fti::{FtiApi, FtiFabric};
use crate::redfish::RedfishFabric;
use crate::report::{Report, Status};
use crate::run::*;

/// How the suite runs.
#[derive(Debug, Clone)]
pub struct SuiteOptions {
    pub component: PathBuf,
    /// The fabric; `None`: chosen from `describe()`.
    pub fabric: Option<FabricKind>,
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
    if let (Some(_), FabricKind::Redfish) = (opts.fti_api, kind) {
        return Err(SuiteError::FtiApiForOtherFabric(kind.as_str()));
    }
    let fti_api = opts
        .fti_api
        .unwrap_or_else(|| default_fti_api(info.as_ref()));
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
    finish(run, &opts.component, fabric_name, contract, started)
}
