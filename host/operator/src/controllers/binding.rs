//! The binding controller (docs/dra.md): for every ResourceClaim allocated a device of
//! driver `cro.hpsys.ibm.ie.com` on the node the scheduler chose, a ComposableResource
//! of that device's type and model on that node, so the attach goes through the same
//! machinery as a ComposabilityRequest's (lost-reply adoption, node steps, metrics,
//! troubleshooting). Once it is Online, the claim's `status.devices` says
//! `FabricDeviceReady=True` with the device's ids, and the scheduler binds the Pod. An
//! attach that fails before the device is Online sets a failure condition instead
//! (`FabricDeviceReschedule` when the fabric had no device, `FabricDeviceFailed`
//! otherwise), which makes the scheduler place the Pod again, and the resource is
//! deleted, which detaches whatever it attached.
//!
//! Crash-safe like the rest: the resource's name comes from the claim's UID and the
//! result's position, so a restart finds the resource it made instead of making a
//! second; and the resource of a claim that is gone, or no longer allocated that device,
//! is deleted (its detach drains the node as usual), so nothing stays attached to nobody.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use cro_api::{
    CONDITION_FABRIC_DEVICE_FAILED, CONDITION_FABRIC_DEVICE_READY,
    CONDITION_FABRIC_DEVICE_RESCHEDULE, ComposableResource, ComposableResourceSpec, CroObjectExt,
    DRA_DRIVER, FINALIZER, LABEL_CLAIM_UID, LABEL_MANAGED_BY, ResourceState, ResourceType,
};
use futures::StreamExt as _;
use k8s_openapi::api::core::v1::NodeSelector;
use k8s_openapi::api::resource::v1::{DeviceRequestAllocationResult, ResourceClaim, ResourceSlice};
use kube::ResourceExt;
use kube::api::{Api, ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::runtime::WatchStreamExt as _;
use kube::runtime::events::EventType;
use kube::runtime::watcher;
use serde_json::json;
use tokio::sync::Notify;

use crate::error::ReconcileError;
use crate::plumbing::context::Context;
use crate::plumbing::reconcile;

/// `<namespace>/<name>` of that claim, for people.
pub(crate) const ANNOTATION_CLAIM: &str = "cro.hpsys.ibm.ie.com/claim";
/// `<pool>/<device>` of the allocation the resource serves.
pub(crate) const ANNOTATION_CLAIM_DEVICE: &str = "cro.hpsys.ibm.ie.com/claim-device";

/// The field manager of the claim status cro writes.
const MANAGER: &str = "cro-binding";

/// Binds every `poll_interval`, and soon after a claim or a claim's resource changes,
/// until `shutdown`; does nothing without configured pool kinds (then no claim can be
/// allocated a cro device).
pub(crate) async fn run(ctx: &Context, shutdown: impl std::future::Future<Output = ()>) {
    if ctx.config.pool_devices.is_empty() {
        return;
    }
    let period = ctx.config.timings.poll_interval;
    // Woken by the resource cache on a change of a claim's resource (Online: the
    // condition to set; failed: the claim to fail), and by a watch of the claims (an
    // allocation to act on). They only wake it: a round still lists what it acts on,
    // so a missed or failed watch costs at most one period.
    let wake = ctx.caches.claim_resource_changes();
    let claims = tokio::spawn(wake_on_claims(ctx.client.clone(), wake.clone()));
    reconcile::every_or_woken(ctx, "binding", period, &wake, shutdown, || bind(ctx)).await;
    claims.abort();
}

/// Notifies `wake` on every change of a ResourceClaim.
async fn wake_on_claims(client: kube::Client, wake: Arc<Notify>) {
    let mut changes = std::pin::pin!(
        watcher(
            Api::<ResourceClaim>::all(client),
            watcher::Config::default()
        )
        .default_backoff()
    );
    while changes.next().await.is_some() {
        wake.notify_one();
    }
}

/// One device of one claim, as the scheduler allocated it.
#[derive(Debug, Clone)]
struct Wanted {
    claim: Arc<ResourceClaim>,
    result: DeviceRequestAllocationResult,
    node: Option<String>,
    resource: String,
}

/// One round over every claim and every resource made for one.
async fn bind(ctx: &Context) -> Result<(), ReconcileError> {
    let claims: Vec<Arc<ResourceClaim>> = Api::<ResourceClaim>::all(ctx.client.clone())
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .map(Arc::new)
        .collect();
    let wanted = wanted(&claims);
    let resources: Api<ComposableResource> = Api::all(ctx.client.clone());
    let made: BTreeMap<String, ComposableResource> = resources
        .list(&ListParams::default().labels(LABEL_CLAIM_UID))
        .await?
        .items
        .into_iter()
        .map(|r| (r.name_any(), r))
        .collect();
    let mut published = None;
    for w in &wanted {
        if has_condition(&w.claim, &w.result) {
            // Decided already (ready, or failed and waiting for the scheduler).
            continue;
        }
        match made.get(&w.resource) {
            None => {
                let slices = match published.take() {
                    Some(s) => s,
                    None => published_devices(ctx).await?,
                };
                create(ctx, &resources, w, &slices).await?;
                published = Some(slices);
            }
            Some(r) => follow(ctx, &resources, w, r).await?,
        }
    }
    // A resource whose claim is gone or holds another device now: released.
    let live: BTreeSet<&str> = wanted.iter().map(|w| w.resource.as_str()).collect();
    for r in made
        .values()
        .filter(|r| !live.contains(r.name_any().as_str()))
    {
        if !r.is_being_deleted() {
            tracing::info!(resource = %r.name_any(), "its claim no longer holds the device: releasing it");
            ctx.delete_once(&resources, r).await?;
        }
    }
    Ok(())
}

/// Every device of cro's driver the claims were allocated.
fn wanted(claims: &[Arc<ResourceClaim>]) -> Vec<Wanted> {
    let mut out = Vec::new();
    for claim in claims {
        let Some(allocation) = claim.status.as_ref().and_then(|s| s.allocation.as_ref()) else {
            continue;
        };
        let Some(uid) = claim.uid() else { continue };
        let node = allocation.node_selector.as_ref().and_then(selected_node);
        let results = allocation
            .devices
            .as_ref()
            .and_then(|d| d.results.as_ref())
            .map(Vec::as_slice)
            .unwrap_or_default();
        for (i, result) in results.iter().enumerate() {
            if result.driver != DRA_DRIVER {
                continue;
            }
            out.push(Wanted {
                claim: claim.clone(),
                result: result.clone(),
                node: node.clone(),
                resource: format!("dra-{uid}-{i}"),
            });
        }
    }
    out
}

/// The one node an allocation's node selector names (`metadata.name In [node]`, what the
/// scheduler writes for a device that binds to a node).
fn selected_node(selector: &NodeSelector) -> Option<String> {
    let mut names = selector.node_selector_terms.iter().flat_map(|t| {
        let fields = t.match_fields.iter().flatten();
        let labels = t.match_expressions.iter().flatten();
        fields
            .filter(|r| r.key == "metadata.name")
            .chain(labels.filter(|r| r.key == "kubernetes.io/hostname"))
            .filter(|r| r.operator == "In")
            .flat_map(|r| r.values.iter().flatten().cloned())
    });
    let first = names.next()?;
    names.all(|n| n == first).then_some(first)
}

/// Whether cro already set a binding or failure condition for the device.
fn has_condition(claim: &ResourceClaim, r: &DeviceRequestAllocationResult) -> bool {
    device_status(claim, r).is_some_and(|conditions| {
        conditions.iter().any(|c| {
            c.status == "True"
                && [
                    CONDITION_FABRIC_DEVICE_READY,
                    CONDITION_FABRIC_DEVICE_RESCHEDULE,
                    CONDITION_FABRIC_DEVICE_FAILED,
                ]
                .contains(&c.type_.as_str())
        })
    })
}

fn device_status<'a>(
    claim: &'a ResourceClaim,
    r: &DeviceRequestAllocationResult,
) -> Option<&'a Vec<k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition>> {
    claim
        .status
        .as_ref()?
        .devices
        .iter()
        .flatten()
        .find(|d| d.driver == r.driver && d.pool == r.pool && d.device == r.device)?
        .conditions
        .as_ref()
}

/// A device cro's slices publish: its kind and the nodes its pool reaches.
#[derive(Debug, Clone)]
struct Published {
    kind: ResourceType,
    model: String,
    nodes: BTreeSet<String>,
}

/// (pool, device) → what cro's slices say of the device.
async fn published_devices(
    ctx: &Context,
) -> Result<BTreeMap<(String, String), Published>, kube::Error> {
    let slices: Api<ResourceSlice> = Api::all(ctx.client.clone());
    let mut out = BTreeMap::new();
    for s in slices
        .list(&ListParams::default().labels(&format!("{LABEL_MANAGED_BY}=cro")))
        .await?
        .items
    {
        let nodes: BTreeSet<String> = s
            .spec
            .node_selector
            .iter()
            .flat_map(|n| n.node_selector_terms.iter())
            .flat_map(|t| t.match_fields.iter().flatten())
            .filter(|r| r.key == "metadata.name" && r.operator == "In")
            .flat_map(|r| r.values.iter().flatten().cloned())
            .collect();
        for d in s.spec.devices.iter().flatten() {
            let attr = |k: &str| {
                d.attributes
                    .as_ref()
                    .and_then(|a| a.get(k))
                    .and_then(|v| v.string.clone())
            };
            let kind = match attr("type").as_deref() {
                Some("gpu") => ResourceType::Gpu,
                Some("cxlmemory") => ResourceType::CxlMemory,
                _ => continue,
            };
            if let Some(model) = attr("model") {
                let device = Published {
                    kind,
                    model,
                    nodes: nodes.clone(),
                };
                out.insert((s.spec.pool.name.clone(), d.name.clone()), device);
            }
        }
    }
    Ok(out)
}

/// The resource of an allocated device, or the failure condition when there can be
/// none (no node chosen, a device cro does not publish).
async fn create(
    ctx: &Context,
    resources: &Api<ComposableResource>,
    w: &Wanted,
    published: &BTreeMap<(String, String), Published>,
) -> Result<(), ReconcileError> {
    let Some(node) = &w.node else {
        return fail(
            ctx,
            w,
            CONDITION_FABRIC_DEVICE_FAILED,
            "NoNode",
            "the allocation names no single node: cro attaches to the node the scheduler chose",
        )
        .await;
    };
    let Some(device) = published.get(&(w.result.pool.clone(), w.result.device.clone())) else {
        return fail(
            ctx,
            w,
            CONDITION_FABRIC_DEVICE_RESCHEDULE,
            "NotPublished",
            &format!(
                "device {} of pool {} is not in cro's ResourceSlices (edited by hand, or withdrawn)",
                w.result.device, w.result.pool
            ),
        )
        .await;
    };
    if !device.nodes.contains(node) {
        return fail(
            ctx,
            w,
            CONDITION_FABRIC_DEVICE_FAILED,
            "NodeUnreachable",
            &format!(
                "pool {} does not reach node {node}: its fabric cannot attach a device there",
                w.result.pool
            ),
        )
        .await;
    }
    if ctx.caches.node(node).is_none() {
        return fail(
            ctx,
            w,
            CONDITION_FABRIC_DEVICE_RESCHEDULE,
            "NodeGone",
            &format!("node {node} the scheduler chose does not exist"),
        )
        .await;
    }
    let claim = &w.claim;
    let obj = ComposableResource {
        metadata: ObjectMeta {
            name: Some(w.resource.clone()),
            labels: Some(
                [(LABEL_CLAIM_UID.to_owned(), claim.uid().unwrap_or_default())]
                    .into_iter()
                    .chain(
                        ctx.provider_of(node)
                            .map(|p| (cro_api::LABEL_PROVIDER.to_owned(), p)),
                    )
                    .collect(),
            ),
            annotations: Some(BTreeMap::from([
                (
                    ANNOTATION_CLAIM.to_owned(),
                    format!(
                        "{}/{}",
                        claim.namespace().unwrap_or_default(),
                        claim.name_any()
                    ),
                ),
                (
                    ANNOTATION_CLAIM_DEVICE.to_owned(),
                    format!("{}/{}", w.result.pool, w.result.device),
                ),
            ])),
            finalizers: Some(vec![FINALIZER.to_owned()]),
            ..ObjectMeta::default()
        },
        spec: ComposableResourceSpec {
            resource_type: device.kind,
            model: device.model.clone(),
            target_node: node.clone(),
            force_detach: false,
        },
        status: None,
    };
    match resources.create(&PostParams::default(), &obj).await {
        Ok(_) => {
            tracing::info!(resource = %w.resource, node = %node, claim = %claim.name_any(), "attaching a device for an allocated claim");
            Ok(())
        }
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// The resource's progress, told to the claim once it is decided.
async fn follow(
    ctx: &Context,
    resources: &Api<ComposableResource>,
    w: &Wanted,
    r: &ComposableResource,
) -> Result<(), ReconcileError> {
    if r.is_being_deleted() {
        return Ok(());
    }
    if r.state() == ResourceState::Online
        && let Some(device_id) = r.device_id()
    {
        let data = json!({
            "type": r.spec.resource_type.as_str(),
            "deviceId": device_id,
            "fabricDeviceId": r.cdi_device_id().unwrap_or_default(),
            "node": r.spec.target_node,
            "resource": r.name_any(),
        });
        return set_condition(
            ctx,
            w,
            CONDITION_FABRIC_DEVICE_READY,
            "Attached",
            &format!(
                "device {device_id} is attached to node {} and visible there",
                r.spec.target_node
            ),
            Some(data),
        )
        .await;
    }
    let error = r
        .status
        .as_ref()
        .map(|s| s.error.as_str())
        .unwrap_or_default();
    if error.is_empty() {
        return Ok(());
    }
    // Failed before Online: the scheduler places the Pod again, and the resource goes
    // (its detach releases whatever the attach got). No capacity is final at once; any
    // other error (a call that timed out on a busy fabric, a node step under way) is
    // retried by the resource's own backoff first, and fails the claim only once it
    // has stood for `GIVE_UP`.
    let (condition, reason) = if error.contains("no capacity") {
        (CONDITION_FABRIC_DEVICE_RESCHEDULE, "NoCapacity")
    } else if failing_for(r).is_some_and(|d| d >= GIVE_UP) {
        (CONDITION_FABRIC_DEVICE_FAILED, "AttachFailed")
    } else {
        return Ok(());
    };
    fail(ctx, w, condition, reason, error).await?;
    ctx.delete_once(resources, r).await
}

/// How long an attach may keep failing (other than for capacity) before its claim is
/// given up and the Pod placed again.
const GIVE_UP: std::time::Duration = std::time::Duration::from_secs(30);

/// How long the resource has been failing: since its Ready condition turned to reason
/// `Error`.
fn failing_for(r: &ComposableResource) -> Option<std::time::Duration> {
    let since = r
        .status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == "Ready" && c.status == "False" && c.reason == "Error")?
        .last_transition_time
        .0;
    k8s_openapi::jiff::Timestamp::now()
        .duration_since(since)
        .try_into()
        .ok()
}

/// A failure condition on the claim, with an Event naming why.
async fn fail(
    ctx: &Context,
    w: &Wanted,
    condition: &str,
    reason: &str,
    message: &str,
) -> Result<(), ReconcileError> {
    tracing::warn!(claim = %w.claim.name_any(), device = %w.result.device, reason, message, "a claim's device cannot be attached: the scheduler places the Pod again");
    ctx.event(
        &kube::Resource::object_ref(w.claim.as_ref(), &()),
        EventType::Warning,
        reason,
        "Bind",
        format!(
            "device {} of pool {}: {message}; set {condition} so the Pod is placed again",
            w.result.device, w.result.pool
        ),
    )
    .await;
    set_condition(ctx, w, condition, reason, message, None).await
}

/// Applies the device's condition (and data) to the claim's status, as cro's field
/// manager: other managers' entries are left alone.
async fn set_condition(
    ctx: &Context,
    w: &Wanted,
    condition: &str,
    reason: &str,
    message: &str,
    data: Option<serde_json::Value>,
) -> Result<(), ReconcileError> {
    let claim = &w.claim;
    let Some(namespace) = claim.namespace() else {
        return Ok(());
    };
    let mut message = message.to_owned();
    if message.len() > 1000 {
        let mut cut = 1000;
        while !message.is_char_boundary(cut) {
            cut -= 1;
        }
        message.truncate(cut);
    }
    let mut device = json!({
        "driver": w.result.driver,
        "pool": w.result.pool,
        "device": w.result.device,
        "conditions": [{
            "type": condition,
            "status": "True",
            "reason": reason,
            "message": message,
            "lastTransitionTime": k8s_openapi::jiff::Timestamp::now().to_string(),
            "observedGeneration": claim.metadata.generation,
        }],
    });
    if let Some(data) = data {
        device["data"] = data;
    }
    let patch = json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "status": {"devices": [device]},
    });
    let api: Api<ResourceClaim> = Api::namespaced(ctx.client.clone(), &namespace);
    match api
        .patch_status(
            &claim.name_any(),
            &PatchParams::apply(MANAGER).force(),
            &Patch::Apply(&patch),
        )
        .await
    {
        Ok(_) => Ok(()),
        // Deleted meanwhile: the next round releases its resource.
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{NodeSelectorRequirement, NodeSelectorTerm};

    use super::*;

    fn selector(key: &str, field: bool, values: &[&str]) -> NodeSelector {
        let req = NodeSelectorRequirement {
            key: key.into(),
            operator: "In".into(),
            values: Some(values.iter().map(|v| v.to_string()).collect()),
        };
        NodeSelector {
            node_selector_terms: vec![NodeSelectorTerm {
                match_fields: field.then(|| vec![req.clone()]),
                match_expressions: (!field).then(|| vec![req]),
            }],
        }
    }

    #[test]
    fn the_chosen_node_is_the_one_the_selector_names() {
        assert_eq!(
            selected_node(&selector("metadata.name", true, &["w1"])).as_deref(),
            Some("w1")
        );
        assert_eq!(
            selected_node(&selector("kubernetes.io/hostname", false, &["w2"])).as_deref(),
            Some("w2")
        );
        assert_eq!(
            selected_node(&selector("metadata.name", true, &["w1", "w2"])),
            None
        );
        assert_eq!(selected_node(&selector("zone", false, &["a"])), None);
    }
}
