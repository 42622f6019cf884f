//! Running the suite against a vendor's own fabric (non-destructive unless allowed).

use std::time::Instant;

use cro_runtime::cluster::StaticCluster;
use cro_runtime::{DeviceType, ProviderSpec, RemoveOutcome, Runtime};

use crate::SuiteError;
use crate::checks::*;
use crate::report::Report;
use crate::run::*;
use crate::suite::SuiteOptions;

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
        &opts.component,
        format!("lab {}", lab.endpoint),
        contract,
        started,
    )
}
