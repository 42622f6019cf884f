//! Deletion: the detach (idle check, taint, drain, fabric remove, wait until gone,
//! untaint), then the finalizer removed. `Detaching` is written when the detach waits or
//! fails, not before it starts.

use cro_api::{
    ANNOTATION_SKIP_NODE_STEPS, ComposabilityRequest, ComposableResource, CroObjectExt,
    RequestState, ResourceState, ResourceType,
};
use cro_runtime::domain::RemoveOutcome;
use kube::api::Api;
use kube::runtime::events::EventType;
use kube::{Resource, ResourceExt};

use super::{Outcome, exposure, node_exists};
use crate::error::ReconcileError;
use crate::nodeops::driver::CachedPods;
use crate::nodeops::{Discovery, DrainOptions, Driver, ExposureMode, NodeOpsError, driver};
use crate::plumbing::context::Context;
use crate::plumbing::patch::{self, ResourceStatusPatch};
use crate::plumbing::reconcile::Step;
use crate::provider::node_machine::NodeMachine;
use crate::provider::{Operation, to_domain};

pub(super) async fn on_delete(res: ComposableResource, ctx: &Context) -> Outcome {
    let api: Api<ComposableResource> = Api::all(ctx.client.clone());
    if !res.has_cro_finalizer() {
        return Ok((Step::wait(), None));
    }
    let state = res.state();
    if state == ResourceState::Deleting {
        patch::remove_finalizer(&api, &res).await?;
        return Ok((Step::wait(), None));
    }
    if res.device_id().is_none() {
        // Nothing was attached (or the ids were already cleared after the detach).
        let res = patch::status(
            &api,
            &res,
            &ResourceStatusPatch::state(ResourceState::Deleting),
            true,
        )
        .await?;
        patch::remove_finalizer(&api, &res).await?;
        return Ok((Step::wait(), None));
    }
    if state == ResourceState::Detaching {
        return detaching(res, ctx).await;
    }
    // No Event: one per device per phase, and `Detached` (or a warning on the way,
    // `GpuBusy`, `NodeCommandFailed`) says what this one would (docs/BENCHMARKS.md,
    // the write budget).
    tracing::info!(node = %res.spec.target_node,
        device = ?res.device_id().unwrap_or("?"), "detaching");
    // `Detaching` is written only when the detach does not end in this reconciliation
    // (a write per device, docs/BENCHMARKS.md, the write budget). It is not what makes a
    // detach crash-safe: the deletion and the finalizer are, stored by the API server
    // before this runs. A restart finds a resource being deleted whatever its state says
    // and detaches again, which is safe (see [`finish`]). What the state is for is what
    // users see: a detach that waits (the fabric still working, the GPU still on the
    // node) or fails (a busy GPU, a node that cannot run commands) shows `Detaching`,
    // with the error; one that ends at once lets the object go instead.
    let outcome = detaching(res.clone(), ctx).await;
    match outcome {
        Ok((step, None)) => Ok((step, None)),
        Ok((step, Some(left))) => Ok((step, Some(mark_detaching(&api, &left).await?))),
        // A conflict is tried again at once, from what is there now.
        Err(e) if e.is_conflict() => Err(e),
        Err(e) => {
            if let Err(write) = mark_detaching(&api, &res).await {
                tracing::warn!(error = %write, "cannot record the detach as under way");
            }
            Err(e)
        }
    }
}

/// Records a detach that did not end at once as under way (the error it met is kept:
/// the error policy writes the new one). Only for a resource not `Detaching` yet.
async fn mark_detaching(
    api: &Api<ComposableResource>,
    res: &ComposableResource,
) -> Result<ComposableResource, ReconcileError> {
    patch::status(
        api,
        res,
        &ResourceStatusPatch::state(ResourceState::Detaching).keep_error(),
        true,
    )
    .await
}

/// Which of a detach's steps on the node run (docs/troubleshooting.md, "Ways out").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NodeSteps {
    /// The whole sequence: idle check, drain, fabric, rescan, wait until gone.
    All,
    /// `force_detach`: no command runs on the node (no idle check, no drain, no
    /// `nvidia-smi`), so a node that cannot run commands does not hold the detach up;
    /// the API-side steps (DRA taint, plugin restarts, DRA visibility) still run.
    NoCommands,
    /// The skip-node-steps annotation, or a Node that is gone but whose machine was
    /// recorded at attach: the fabric detach alone.
    FabricOnly,
    /// A Node that is gone and no recorded machine: the device cannot be reached; the
    /// resource is let go (the Go behaviour) and the device is left to the fabric.
    Unreachable,
}

/// The steps a detach runs, from what is known of the node and the resource.
pub(crate) fn node_steps(
    node_exists: bool,
    machine_recorded: bool,
    skip_annotation: bool,
    force_detach: bool,
) -> NodeSteps {
    match (node_exists, machine_recorded) {
        (false, true) => NodeSteps::FabricOnly,
        (false, false) => NodeSteps::Unreachable,
        (true, _) if skip_annotation => NodeSteps::FabricOnly,
        (true, _) if force_detach => NodeSteps::NoCommands,
        (true, _) => NodeSteps::All,
    }
}

/// Whether an administrator set the skip-node-steps annotation to `true`.
pub(crate) fn skips_node_steps(res: &ComposableResource) -> bool {
    res.annotations()
        .get(ANNOTATION_SKIP_NODE_STEPS)
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("true"))
}

/// The Node is gone and nothing says which machine it was: the Go behaviour.
async fn let_go(res: ComposableResource, ctx: &Context) -> Outcome {
    let api: Api<ComposableResource> = Api::all(ctx.client.clone());
    let node = res.spec.target_node.clone();
    let message = format!(
        "target node {node} not found and no machine recorded for it: device {} may stay attached on the fabric",
        res.device_id().unwrap_or("?")
    );
    let res = super::mark_node_gone(ctx, &api, res, &message, "Detach").await?;
    patch::remove_finalizer(&api, &res).await?;
    Ok((Step::wait(), None))
}

async fn detaching(res: ComposableResource, ctx: &Context) -> Outcome {
    let node = res.spec.target_node.clone();
    let poll = ctx.config.timings.poll_interval;
    let uuid = res.device_id().unwrap_or_default().to_owned();

    let steps = node_steps(
        node_exists(ctx, &node).await?,
        NodeMachine::of_resource(&res).is_some(),
        skips_node_steps(&res),
        res.spec.force_detach,
    );
    match steps {
        NodeSteps::Unreachable => return let_go(res, ctx).await,
        NodeSteps::All => {}
        other => {
            tracing::info!(node = %node, device = ?uuid, steps = ?other, "detaching with fewer node steps")
        }
    }
    let driver = drain_driver(ctx, &res, steps).await?;

    // Held through the fabric call: an attach on this node meanwhile could be handed
    // this very device back, and must store its ids before the check below runs.
    let guard = ctx.provider.lock_node(&node).await;
    if let Some(other) = holder_elsewhere(ctx, &res, &uuid).await? {
        // This detach finished before a crash kept it from being recorded, and the
        // fabric has since given the device to another resource: nothing is left to do.
        tracing::warn!(device = ?uuid, holder = %other,
            "device already detached and now held by another resource");
        drop(guard);
        return finish(res, ctx, &uuid, steps).await;
    }
    release_on_node(ctx, &res, driver.as_ref(), &uuid, steps).await?;
    match ctx.provider.remove(&guard, &to_domain(&res)).await {
        Ok(RemoveOutcome::InProgress(what)) => {
            tracing::info!(node = %node, what = %what, "detach in progress");
            return Ok((Step::requeue(poll), Some(res)));
        }
        Ok(RemoveOutcome::Removed) => {}
        Err(e) => return Err(ReconcileError::provider(Operation::Remove, e)),
    }
    drop(guard);

    if still_on_node(ctx, &res, driver.as_ref(), &uuid, steps).await? {
        return Ok((Step::requeue(poll), Some(res)));
    }
    finish(res, ctx, &uuid, steps).await
}

/// The driver a GPU is drained through, when the whole node sequence runs; `None` when
/// there is nothing to drain.
async fn drain_driver(
    ctx: &Context,
    res: &ComposableResource,
    steps: NodeSteps,
) -> Result<Option<Driver>, ReconcileError> {
    if res.spec.resource_type != ResourceType::Gpu || steps != NodeSteps::All {
        return Ok(None);
    }
    let node = &res.spec.target_node;
    match driver::discover(
        &ctx.client,
        ctx.runner.as_ref(),
        node,
        &ctx.config.namespace,
        CachedPods::ready_only(ctx.caches.driver_pods_on(node)),
        &ctx.cluster_policy,
    )
    .await?
    {
        Discovery::Ready(driver) => Ok(Some(driver)),
        // No driver pod at all: nothing on the node can use or hold the GPU, so there
        // is nothing to drain (a GPU attached but never picked up).
        Discovery::ContainerPending { pod: None } => Ok(None),
        Discovery::ContainerPending { pod: Some(pod) } => Err(NodeOpsError::DriverInstalling {
            node: node.clone(),
            pod,
        }
        .into()),
    }
}

/// Before the fabric removes the GPU: the idle check, the DRA taint and the drain (those
/// the steps allow).
async fn release_on_node(
    ctx: &Context,
    res: &ComposableResource,
    driver: Option<&Driver>,
    uuid: &str,
    steps: NodeSteps,
) -> Result<(), ReconcileError> {
    let name = res.name_any();
    if let Some(driver) = driver
        && ctx.gpu.is_listed(driver, uuid).await?
    {
        // A GPU already gone from the node (drained, or removed before a crash) needs
        // neither the idle check nor the drain.
        if !res.spec.force_detach {
            ctx.gpu.ensure_idle(driver, uuid, ctx.config.mode).await?;
        }
        if let Some(dra) = &ctx.dra
            && ctx.config.mode == ExposureMode::Dra
            && let Some(device) = dra.find_device(&ctx.client, uuid).await?
        {
            dra.taint(&ctx.client, &name, uuid, &device).await?;
        }
        ctx.gpu
            .drain(
                driver,
                uuid,
                DrainOptions {
                    mode: ctx.config.mode,
                    force: res.spec.force_detach,
                },
            )
            .await?;
    }
    if steps == NodeSteps::NoCommands
        && res.spec.resource_type == ResourceType::Gpu
        && let Some(dra) = &ctx.dra
        && ctx.config.mode == ExposureMode::Dra
        && let Some(device) = dra.find_device(&ctx.client, uuid).await?
    {
        dra.taint(&ctx.client, &name, uuid, &device).await?;
    }
    Ok(())
}

/// After the fabric removed the GPU: rescans the node and tells whether it still shows
/// the GPU (then the detach looks again later).
async fn still_on_node(
    ctx: &Context,
    res: &ComposableResource,
    driver: Option<&Driver>,
    uuid: &str,
    steps: NodeSteps,
) -> Result<bool, ReconcileError> {
    let name = res.name_any();
    if let Some(driver) = driver {
        let still_seen = exposure::visible(ctx, driver, uuid).await?;
        if still_seen || ctx.config.mode == ExposureMode::DevicePlugin {
            exposure::rescan(ctx, driver, &name, false).await?;
        }
        if still_seen {
            tracing::debug!(gpu = ?uuid, "GPU still visible after the detach");
            return Ok(true);
        }
    }
    if steps == NodeSteps::NoCommands && res.spec.resource_type == ResourceType::Gpu {
        exposure::rescan_after_detach(ctx, &res.spec.target_node, &name).await?;
        if exposure::still_published(ctx, uuid).await? {
            tracing::debug!(gpu = ?uuid, "GPU still published after the detach");
            return Ok(true);
        }
    }
    Ok(false)
}

/// The device is gone: drop the taint and release the finalizer, so the object goes.
///
/// No `Deleting` status with the ids cleared first (a write per device, docs/
/// BENCHMARKS.md, the write budget): it kept nothing from happening twice. A restart
/// or a failed finalizer removal finds the resource still `Detaching` with its ids, as
/// it would between the fabric's answer and that write, and goes through the detach
/// again, which is safe: the fabric's remove of a device already removed says it is
/// removed, and a device the fabric has since given to another resource is found by
/// [`holder_elsewhere`] before anything is asked.
async fn finish(res: ComposableResource, ctx: &Context, uuid: &str, steps: NodeSteps) -> Outcome {
    let api: Api<ComposableResource> = Api::all(ctx.client.clone());
    let name = res.name_any();
    let node = res.spec.target_node.clone();
    if let Some(dra) = &ctx.dra {
        dra.untaint(&ctx.client, &name).await?;
    }
    ctx.forget_rescan(&name);
    tracing::info!(node = %node, device = ?uuid, "detached");
    let request = res.managed_by().and_then(|r| ctx.caches.request(r));
    if named_by_its_request(&res, request.as_deref(), steps) {
        return release(&api, &res).await;
    }
    ctx.event(
        &res.object_ref(&()),
        EventType::Normal,
        "Detached",
        "Detach",
        match steps {
            NodeSteps::All => format!("device {uuid} detached from node {node}"),
            NodeSteps::NoCommands => format!(
                "device {uuid} detached from node {node} without commands on the node (force_detach): the GPU was not drained"
            ),
            NodeSteps::FabricOnly | NodeSteps::Unreachable => format!(
                "device {uuid} detached on the fabric only; nothing was done on node {node}"
            ),
        },
    )
    .await;
    release(&api, &res).await
}

/// Whether the `Detached` Event of the device's request will name it, so that it sends
/// none of its own (one Event per request down, as up: docs/troubleshooting.md, "Event
/// reasons"): a detach with every node step, of a device its request manages while the
/// request is being deleted and its status lists the device with its id (the request's
/// Event names the devices of its status once the last one is gone:
/// `request::cleanup`). A request the cache does not show, or not yet as being deleted,
/// leaves the device its own.
fn named_by_its_request(
    res: &ComposableResource,
    request: Option<&ComposabilityRequest>,
    steps: NodeSteps,
) -> bool {
    steps == NodeSteps::All
        && request.is_some_and(|r| {
            // A request a Go operator left `Deleting` loses its finalizer at once,
            // without an Event of its own.
            r.is_being_deleted()
                && r.state() != RequestState::Deleting
                && r.status.as_ref().is_some_and(|s| {
                    s.resources
                        .get(&res.name_any())
                        .is_some_and(|e| !e.device_id.is_empty())
                })
        })
}

/// The finalizer removed: the object goes.
async fn release(api: &Api<ComposableResource>, res: &ComposableResource) -> Outcome {
    let name = res.name_any();
    match patch::remove_finalizer(api, res).await {
        // Changed since this reconciliation read it (an annotation, another
        // controller's write): the removal is asked again on what is there now, rather
        // than going through the whole detach again.
        Err(e) if e.is_conflict() => {
            if let Some(now) = api.get_opt(&name).await? {
                patch::remove_finalizer(api, &now).await?;
            }
        }
        other => other?,
    }
    Ok((Step::wait(), None))
}

/// Another ComposableResource whose status holds `device`, if any: from the watch
/// cache once it shows every change up to this resource's version and every device id an
/// attach of this process stored (the caller holds the node lock, so an attach on this
/// node that was handed this device has stored and noted its ids by then), each holder
/// it names confirmed by a read; else from a LIST (see `Caches::find_holder`).
async fn holder_elsewhere(
    ctx: &Context,
    me: &ComposableResource,
    device: &str,
) -> Result<Option<String>, ReconcileError> {
    Ok(ctx
        .caches
        .find_holder(&ctx.client, me, device, false)
        .await?
        .map(|r| r.name_any()))
}

#[cfg(test)]
mod tests {
    use cro_api::{ComposabilityRequest, ComposableResource};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use serde_json::json;

    use super::{NodeSteps, named_by_its_request, node_steps};

    fn request(deleting: bool, listed: Option<&str>) -> ComposabilityRequest {
        request_in("Cleaning", deleting, listed)
    }

    fn request_in(state: &str, deleting: bool, listed: Option<&str>) -> ComposabilityRequest {
        let mut status = json!({"state": state, "resources": {}});
        if let Some(device) = listed {
            status["resources"]["gpu-a"] = json!({"device_id": device, "node_name": "n1"});
        }
        let mut req: ComposabilityRequest = serde_json::from_value(json!({
            "apiVersion": "cro.hpsys.ibm.ie.com/v1alpha1",
            "kind": "ComposabilityRequest",
            "metadata": {"name": "r"},
            "spec": {"resource": {"type": "gpu", "model": "A100", "size": 1}},
            "status": status,
        }))
        .unwrap();
        if deleting {
            req.metadata.deletion_timestamp = Some(Time("2026-01-01T00:00:00Z".parse().unwrap()));
        }
        req
    }

    #[test]
    fn a_device_leaves_its_event_to_its_request_only_when_that_one_names_it() {
        let res: ComposableResource = serde_json::from_value(json!({
            "apiVersion": "cro.hpsys.ibm.ie.com/v1alpha1",
            "kind": "ComposableResource",
            "metadata": {"name": "gpu-a", "labels": {"app.kubernetes.io/managed-by": "r"}},
            "spec": {"type": "gpu", "model": "A100", "target_node": "n1"},
        }))
        .unwrap();
        let named = request(true, Some("GPU-1"));
        assert!(named_by_its_request(&res, Some(&named), NodeSteps::All));
        // Skipped node steps are said by the device itself.
        for steps in [
            NodeSteps::NoCommands,
            NodeSteps::FabricOnly,
            NodeSteps::Unreachable,
        ] {
            assert!(!named_by_its_request(&res, Some(&named), steps));
        }
        // The request not (yet, as the cache shows it) being deleted, not in the cache,
        // not listing the device, or listing it without its id: the device's own Event.
        let live = request(false, Some("GPU-1"));
        assert!(!named_by_its_request(&res, Some(&live), NodeSteps::All));
        assert!(!named_by_its_request(&res, None, NodeSteps::All));
        let unlisted = request(true, None);
        assert!(!named_by_its_request(&res, Some(&unlisted), NodeSteps::All));
        let without_id = request(true, Some(""));
        assert!(!named_by_its_request(
            &res,
            Some(&without_id),
            NodeSteps::All
        ));
        // A request a Go operator left `Deleting` sends no Event when it goes.
        let go_leftover = request_in("Deleting", true, Some("GPU-1"));
        assert!(!named_by_its_request(
            &res,
            Some(&go_leftover),
            NodeSteps::All
        ));
        assert!(named_by_its_request(
            &res,
            Some(&request_in("Running", true, Some("GPU-1"))),
            NodeSteps::All
        ));
    }

    #[test]
    fn the_ways_out_choose_the_node_steps() {
        // (node exists, machine recorded, skip annotation, force_detach)
        assert_eq!(node_steps(true, true, false, false), NodeSteps::All);
        assert_eq!(node_steps(true, false, false, true), NodeSteps::NoCommands);
        assert_eq!(node_steps(true, true, true, true), NodeSteps::FabricOnly);
        assert_eq!(node_steps(true, false, true, false), NodeSteps::FabricOnly);
        assert_eq!(node_steps(false, true, false, false), NodeSteps::FabricOnly);
        assert_eq!(node_steps(false, false, true, true), NodeSteps::Unreachable);
    }
}
