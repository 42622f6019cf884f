//! Running the suite against a vendor's own fabric (non-destructive unless allowed).

use std::time::Instant;

use cro_runtime::cluster::StaticCluster;
use cro_runtime::{DeviceType, ProviderInfo, ProviderSpec, RemoveOutcome};

use crate::SuiteError;
use crate::checks::{declared_verdict, denied_verdict, resources_verdict};
use crate::report::Report;
use crate::run::{
    Component, Run, Verdict, fail, outcome_text, pass, request, resource, skip, who, with_device,
};
use crate::suite::SuiteOptions;
use crate::table::{CheckId, Need, Row, Suite, run_table};

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

/// The lab suite, in the order of the report: only what a vendor's fabric can take
/// without harm, unless attaching is allowed.
pub(crate) const LAB: &[Row] = &[
    Row::new(CheckId::Describe, &[]),
    Row::new(CheckId::GetResources, &[]),
    Row::new(CheckId::Attach, &[Need::AttachAllowed]),
    // The fabric's word, not the provider's: the device is listed where it was attached.
    Row::new(CheckId::ListedAfterAttach, ATTACHED),
    Row::new(CheckId::RetriedAttach, ATTACHED),
    Row::new(CheckId::Check, ATTACHED),
    Row::new(CheckId::Detach, ATTACHED),
    Row::new(CheckId::GoneAfterDetach, DETACHED),
    // Run whatever `detach` said: a second detach must be `removed` either way.
    Row::new(CheckId::DetachTwice, ATTACHED),
    Row::new(CheckId::Denied, &[]),
    Row::new(CheckId::DeclaredCapabilities, &[]),
    Row::new(CheckId::Resources, &[]),
];

/// The checks of the device `attach` attached on the lab fabric.
const ATTACHED: &[Need] = &[Need::AttachAllowed, Need::Passed(CheckId::Attach)];
/// The checks after `detach` detached it.
const DETACHED: &[Need] = &[
    Need::AttachAllowed,
    Need::Passed(CheckId::Attach),
    Need::Passed(CheckId::Detach),
];

/// Runs the non-destructive checks (and, with [`LabTarget::attach`], attach, check,
/// detach and a second detach) against a vendor's own fabric.
pub async fn run_lab(opts: &SuiteOptions, lab: &LabTarget) -> Result<Report, SuiteError> {
    let started = Instant::now();
    let component = Component::open(&opts.component, opts.runtime.clone()).await?;
    let mut spec = lab.spec.clone();
    spec.component = opts.component.clone();
    let main = component.load(&spec, lab.cluster.clone()).await?;
    let run = Run::new(
        main,
        component.info.clone(),
        spec.config.clone(),
        spec.limits.memory_bytes,
    );
    let mut suite = Lab {
        lab,
        component,
        spec,
        run,
        held: None,
    };
    run_table(&mut suite, LAB).await?;
    Ok(suite
        .run
        .report(&opts.component, format!("lab {}", lab.endpoint), started))
}

/// One run against a lab fabric.
struct Lab<'a> {
    lab: &'a LabTarget,
    component: Component,
    /// The vendor's spec, for the component under test.
    spec: ProviderSpec,
    run: Run,
    /// The resource `attach` attached, with its device.
    held: Option<cro_runtime::ComposableResource>,
}

impl Lab<'_> {
    /// `attach`: a device of the kind asked for, on the node asked for.
    async fn attach(&mut self) -> Verdict {
        let Some(a) = &self.lab.attach else {
            return Need::AttachAllowed.skip();
        };
        let r = resource("conformance-lab-1", &a.node, a.device_type, &a.model);
        match self
            .run
            .attach(&request(&r, "conformance-lab-1", vec![]))
            .await
        {
            Ok(d) => {
                self.held = Some(with_device(&r, &d));
                pass(format!("device {} attached to {}", d.device_id, a.node))
            }
            Err(e) => fail(format!("attach failed: {e}")),
        }
    }

    /// The checks of the attached device (the table runs them only after `attach`
    /// passed).
    async fn held_verdict(&mut self, check: CheckId) -> Verdict {
        let Some(held) = self.held.clone() else {
            return Need::Passed(CheckId::Attach).skip();
        };
        match check {
            CheckId::Check => match self.run.check(&held).await {
                Ok(()) => pass("healthy"),
                Err(e) => fail(format!("check of the attached device failed: {e}")),
            },
            CheckId::Detach => match self.run.detach(&held).await {
                Ok(()) => pass("detached"),
                Err(e) => fail(format!("detach failed: {e}")),
            },
            CheckId::ListedAfterAttach => self.listed(&held, true).await,
            CheckId::GoneAfterDetach => self.listed(&held, false).await,
            CheckId::RetriedAttach => self.retried(&held).await,
            CheckId::DetachTwice => match self.run.remove(&held).await {
                Ok(RemoveOutcome::Removed) => pass("a second detach is `removed`"),
                other => fail(format!("a second detach gave {}", outcome_text(&other))),
            },
            other => unknown(other),
        }
    }

    /// What `get-resources` says of the held device: listed on its node (`attached`) or
    /// listed nowhere.
    async fn listed(&mut self, held: &cro_runtime::ComposableResource, attached: bool) -> Verdict {
        let id = held.device_id.clone().unwrap_or_default();
        let devices = match self.run.list(&[]).await {
            Ok(d) => d,
            Err(e) => return fail(format!("get-resources failed: {e}")),
        };
        let found = devices.iter().find(|d| d.device_id == id);
        match (attached, found) {
            (true, Some(d)) if d.node == held.target_node => {
                pass(format!("get-resources lists {id} on {}", d.node))
            }
            (true, Some(d)) => fail(format!(
                "the provider attached {id} to {}, but get-resources lists it on {:?}",
                held.target_node, d.node
            )),
            (true, None) => fail(format!(
                "the provider said it attached {id} to {}, but get-resources does not list it",
                held.target_node
            )),
            (false, None) => pass(format!("get-resources no longer lists {id}")),
            (false, Some(d)) => fail(format!(
                "the provider said it detached {id}, but get-resources still lists it on {:?}",
                d.node
            )),
        }
    }

    /// `retried-attach`: the attach asked again with the same attempt key (its reply
    /// lost, say) answers the same device and attaches nothing more; a second device it
    /// attached anyway is detached again, so the vendor's fabric is left as found.
    async fn retried(&mut self, held: &cro_runtime::ComposableResource) -> Verdict {
        let id = held.device_id.clone().unwrap_or_default();
        let on_node = |devices: &[cro_runtime::DeviceInfo]| {
            devices
                .iter()
                .filter(|d| d.node == held.target_node)
                .count()
        };
        let before = match self.run.list(&[]).await {
            Ok(d) => on_node(&d),
            Err(e) => return fail(format!("get-resources failed: {e}")),
        };
        let mut again = held.clone();
        again.device_id = None;
        again.fabric_device_id = None;
        again.machine_id = None;
        let retried = self
            .run
            .attach(&request(&again, "conformance-lab-1", vec![]))
            .await;
        let after = match self.run.list(&[]).await {
            Ok(d) => on_node(&d),
            Err(e) => return fail(format!("get-resources failed: {e}")),
        };
        match retried {
            Ok(d) if d.device_id == id && after == before => pass(format!(
                "the retry answered {id} again and attached nothing more"
            )),
            Ok(d) => {
                let extra = with_device(&again, &d);
                let cleanup = if d.device_id == id {
                    String::new()
                } else {
                    match self.run.detach(&extra).await {
                        Ok(()) => format!("; {} was detached again", d.device_id),
                        Err(e) => format!("; detaching {} failed: {e}", d.device_id),
                    }
                };
                fail(format!(
                    "the same attempt key attached {} (first {id}); {before} devices on {} before, {after} after{cleanup}",
                    d.device_id, held.target_node
                ))
            }
            Err(e) => fail(format!("the retried attach failed: {e}")),
        }
    }

    /// `denied`: the same provider with no HTTP grant.
    async fn denied(&mut self) -> Result<Verdict, SuiteError> {
        let mut denied_spec = self.spec.clone();
        denied_spec.name = format!("{}-denied", self.spec.name);
        denied_spec.grants.http.clear();
        let denied = self
            .component
            .load(&denied_spec, self.lab.cluster.clone())
            .await?;
        Ok(denied_verdict(&mut self.run, &denied, &[]).await)
    }
}

impl Suite for Lab<'_> {
    fn run(&mut self) -> &mut Run {
        &mut self.run
    }

    fn attach_allowed(&self) -> bool {
        self.lab.attach.is_some()
    }

    async fn verdict(&mut self, check: CheckId) -> Result<Verdict, SuiteError> {
        Ok(match check {
            CheckId::Describe => describe_verdict(self.component.info.as_ref()),
            CheckId::GetResources => match self.run.list(&[]).await {
                Ok(devices) => pass(format!("{} devices listed", devices.len())),
                Err(e) => fail(format!("get-resources failed: {e}")),
            },
            CheckId::Attach => self.attach().await,
            CheckId::Check
            | CheckId::Detach
            | CheckId::DetachTwice
            | CheckId::ListedAfterAttach
            | CheckId::RetriedAttach
            | CheckId::GoneAfterDetach => self.held_verdict(check).await,
            CheckId::Denied => self.denied().await?,
            CheckId::DeclaredCapabilities => declared_verdict(&self.run),
            CheckId::Resources => resources_verdict(&self.run),
            other => unknown(other),
        })
    }
}

/// `describe` on a lab fabric: the fabric is the vendor's, not chosen from it.
fn describe_verdict(info: Option<&ProviderInfo>) -> Verdict {
    match info {
        None => skip("contract 0.1.0 has no describe()"),
        Some(i) if i.devices.is_empty() => fail(format!("{} declares no device kinds", who(i))),
        Some(i) => pass(who(i)),
    }
}

/// A check the lab table does not list reaching its dispatch: a mistake of the suite,
/// reported as a failure so that it cannot pass unnoticed.
fn unknown(check: CheckId) -> Verdict {
    fail(format!(
        "the lab suite has no function for `{}`",
        check.name()
    ))
}
