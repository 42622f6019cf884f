//! The ComposableResource controller: one device from the fabric to Online on its node,
//! and back (docs/node-operations.md for the node side).
//!
//! Every reconciliation starts from a fresh read of the object (not the watch cache),
//! so a provider call is never made on stale ids, and every step can be repeated: a
//! crash anywhere is finished by the next reconciliation.

mod adopt;
mod attach;
mod detach;
mod exposure;

use std::sync::Arc;

use cro_api::{ComposableResource, CroObjectExt, ResourceState};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::Api;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::EventType;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Resource, ResourceExt};

use crate::error::ReconcileError;
use crate::nodeops::driver::running_and_ready;
use crate::plumbing::conditions;
use crate::plumbing::context::Context;
use crate::plumbing::patch::{self, ResourceStatusPatch};
use crate::plumbing::reconcile::{self, Step};
use crate::plumbing::triggers;
use crate::provider::node_machine::NodeMachine;
use crate::provider::to_domain;

pub use adopt::ANNOTATION_ATTACH_ATTEMPT;
pub(crate) use adopt::awaiting_adoption;
pub(crate) use adopt::records_at_creation;

pub(crate) const CONTROLLER: &str = "composableresource";

pub(crate) type Outcome = Result<(Step, Option<ComposableResource>), ReconcileError>;

pub(crate) async fn reconcile(
    obj: Arc<ComposableResource>,
    ctx: Arc<Context>,
) -> Result<Action, ReconcileError> {
    // One bound for the replica, whichever provider's controller this is; the semaphore
    // is never closed, so a failure here would be a bug, not a reason to skip the object.
    let _slot = ctx
        .resource_slots
        .acquire()
        .await
        .map_err(|e| ReconcileError::Invalid(format!("reconcile slots: {e}")))?;
    // Nothing to do for a resource that is gone, and reading it only found it so (0.8
    // GETs per device down at N = 100, docs/BENCHMARKS.md): a copy being deleted without
    // this operator's finalizer (the detach removed it; none can be added once deletion
    // began), or older than a deletion the cache's watch saw (the detach was woken once
    // more by a requeue or a pod it waited on).
    if (obj.is_being_deleted() && !obj.has_cro_finalizer()) || ctx.caches.deleted_after(&obj) {
        return Ok(Action::await_change());
    }
    // A resource's first act is a provider call, not a guarded write: a first look reads.
    let Some(fresh) = reconcile::current(&ctx, obj, |_| false).await? else {
        return Ok(Action::await_change());
    };
    reconcile::run(CONTROLLER, &ctx, fresh, |r| step(r, &ctx)).await
}

async fn step(res: ComposableResource, ctx: &Context) -> Outcome {
    let api: Api<ComposableResource> = Api::all(ctx.client.clone());
    if res.is_being_deleted() {
        return detach::on_delete(res, ctx).await;
    }
    let res = patch::add_finalizer(&api, &res).await?;
    if !node_exists(ctx, &res.spec.target_node).await? {
        return collect_garbage(res, ctx).await;
    }
    match res.state() {
        ResourceState::Empty => start(res, ctx).await,
        ResourceState::Attaching => attach::attaching(res, ctx).await,
        ResourceState::Online => online(res, ctx).await,
        // Only deletion leads to these states; finish what was started.
        ResourceState::Detaching | ResourceState::Deleting => {
            patch::delete(&api, &res.name_any()).await?;
            Ok((Step::wait(), Some(res)))
        }
        ResourceState::Unknown(s) => Err(ReconcileError::Invalid(format!(
            "unknown state {s:?} in status.state"
        ))),
    }
}

/// Whether the target node exists; asked by every reconciliation of a resource and of a
/// request that names a node. A Node the watch cache shows counts as there: a stale
/// "there" only postpones the garbage collection, and the Node's deletion wakes the
/// resources on it again. A Node the cache does not show is asked for, because a stale
/// "gone" (a Node created a moment ago) would delete the request and its devices. Asking
/// the API server every time made this the most frequent read of a convergence (14 GETs
/// per device, docs/BENCHMARKS.md).
pub(crate) async fn node_exists(ctx: &Context, node: &str) -> Result<bool, ReconcileError> {
    if node.is_empty() {
        return Ok(false);
    }
    if ctx.caches.shows_node(node) {
        return Ok(true);
    }
    let nodes: Api<Node> = Api::all(ctx.client.clone());
    Ok(nodes.get_opt(node).await?.is_some())
}

/// A new resource: an orphaned device starts Online with its ids (and is deleted
/// from there, which detaches it); any other starts Attaching.
async fn start(res: ComposableResource, ctx: &Context) -> Outcome {
    let api: Api<ComposableResource> = Api::all(ctx.client.clone());
    if let Some(orphan) = res.ready_to_detach() {
        let res = patch::status(
            &api,
            &res,
            &ResourceStatusPatch::ids(&orphan.device_id, &orphan.cdi_device_id)
                .with_state(ResourceState::Online)
                .with_error(""),
            true,
        )
        .await?;
        return online(res, ctx).await;
    }
    // A resource the request controller created carries its attempt record from birth:
    // the record, not the state, is what says an attach may be in flight (a restart
    // looks for its device first, the upstream sync leaves it alone), so the fabric is
    // asked at once and `Attaching` is written with the ids, or when the fabric says it
    // is still working: one status write per attach fewer (docs/BENCHMARKS.md, the
    // write budget). Any other resource states its plan first.
    if adopt::recorded(&res).is_some() {
        return attach::attaching(res, ctx).await;
    }
    let res = patch::status(&api, &res, &attach::attaching_patch(&res), true).await?;
    attach::attaching(res, ctx).await
}

/// Online: orphans delete themselves; others are health-checked every period.
async fn online(res: ComposableResource, ctx: &Context) -> Outcome {
    if res.ready_to_detach().is_some() {
        let api: Api<ComposableResource> = Api::all(ctx.client.clone());
        ctx.event(
            &res.object_ref(&()),
            EventType::Normal,
            "ReleasingOrphan",
            "Detach",
            format!(
                "device {} is held by no request: detaching it",
                res.device_id().unwrap_or("?")
            ),
        )
        .await;
        patch::delete(&api, &res.name_any()).await?;
        return Ok((Step::wait(), None));
    }
    let (health, not_ready) = match ctx.provider.check(&to_domain(&res)).await {
        Ok(()) => (String::new(), None),
        Err(e) => {
            let reason = health_not_ready(&e);
            let text = e.to_string();
            let message = match reason {
                Some(_) => format!(
                    "device {} on node {}: {text}",
                    res.device_id().unwrap_or("?"),
                    res.spec.target_node
                ),
                None => text,
            };
            (message, reason)
        }
    };
    Ok((
        Step::requeue(ctx.config.timings.health_period)
            .with_error(health)
            .not_ready(not_ready),
        Some(res),
    ))
}

/// Which failed health checks take an Online device out of Ready: the fabric lost it,
/// or reports it critical. A warning, or a check that could not be made (the fabric
/// unreachable, a trap), says nothing about the device and only shows in the message.
pub(crate) fn health_not_ready(e: &crate::provider::ProviderCallError) -> Option<&'static str> {
    use cro_runtime::CallError;
    use cro_runtime::domain::ProviderError;
    match e {
        CallError::Provider(ProviderError::NotFound(_)) => Some(conditions::DEVICE_MISSING),
        CallError::Provider(ProviderError::Fabric(f)) if f.status == 404 => {
            Some(conditions::DEVICE_MISSING)
        }
        CallError::Provider(ProviderError::Critical(_)) => Some(conditions::DEVICE_CRITICAL),
        _ => None,
    }
}

/// The target node is gone: nothing can be drained or verified there any more. A device
/// whose machine was recorded at attach is detached on the fabric on the way out (the
/// deletion does it); otherwise the resource goes as the Go operator let it go.
async fn collect_garbage(res: ComposableResource, ctx: &Context) -> Outcome {
    let api: Api<ComposableResource> = Api::all(ctx.client.clone());
    let node = res.spec.target_node.clone();
    let orphan = res.ready_to_detach();
    let device = res
        .device_id()
        .map(str::to_owned)
        .or_else(|| orphan.as_ref().map(|o| o.device_id.clone()));
    if let Some(device) = device
        && NodeMachine::of_resource(&res).is_some()
    {
        let message = format!(
            "target node {node} not found: detaching device {device} on the fabric only, with the machine recorded at attach"
        );
        let mut update = ResourceStatusPatch::default().with_error(&message);
        if res.device_id().is_none()
            && let Some(orphan) = &orphan
        {
            // A released orphan's ids are in its labels until it starts: the deletion
            // below must find them in the status.
            update = ResourceStatusPatch::ids(&orphan.device_id, &orphan.cdi_device_id)
                .with_state(ResourceState::Online)
                .with_error(&message);
        }
        let res = patch::status(&api, &res, &update, false).await?;
        ctx.event(
            &res.object_ref(&()),
            EventType::Warning,
            "NodeGone",
            "GarbageCollect",
            &message,
        )
        .await;
        patch::delete(&api, &res.name_any()).await?;
        return Ok((Step::wait().with_error(message), Some(res)));
    }
    let message = format!("target node {node} not found");
    let res = mark_node_gone(ctx, &api, res, &message, "GarbageCollect").await?;
    patch::delete(&api, &res.name_any()).await?;
    Ok((Step::wait(), None))
}

/// Whether a change of its node's driver pod may let `res` go on: an attach or a detach
/// that is under way (either can be waiting for the driver pod to be Ready). Online and
/// new resources do not look at the driver pod until their own next step.
fn waits_on_driver(res: &ComposableResource) -> bool {
    res.is_being_deleted()
        || matches!(
            res.state(),
            ResourceState::Attaching | ResourceState::Detaching
        )
}

/// Builds the controller of the resources of `provider` (those labelled with it: the
/// replica holding the provider's Lease runs it, crate::process::shards): resources,
/// plus Nodes so that a node's removal (or a change of what a resource reads of it,
/// `triggers::resource_view`) reaches the devices on it at once, plus the GPU
/// operator's driver pods so that a driver pod becoming Ready wakes the attaches
/// waiting on its node at once (their poll interval stays as the fallback). Started
/// when the Lease is taken, it lists the provider's resources and reconciles each: a
/// resource left mid-step by the previous holder is finished here.
pub(crate) fn controller(
    ctx: Arc<Context>,
    provider: &str,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) -> impl futures::Future<Output = ()> {
    let client = ctx.client.clone();
    let resources: Api<ComposableResource> = Api::all(client.clone());
    let mine =
        watcher::Config::default().labels(&format!("{}={provider}", cro_api::LABEL_PROVIDER));
    let controller = Controller::new(resources, mine);
    let store = controller.store();
    let on_node = store.clone();
    let pod_ctx = ctx.clone();
    controller
        .watches_stream(
            triggers::secondary(
                CONTROLLER,
                triggers::touched(
                    Api::<Pod>::all(client.clone()),
                    crate::plumbing::cache::driver_pods(),
                ),
            ),
            move |pod: Pod| {
                // The attach it wakes reads the pod cache, which waits for this change.
                pod_ctx.caches.note_driver_pod_triggered(&pod);
                // Only a Ready pod (or one going away) lets a waiting attach or detach on
                // with its next step; the pod's other changes would wake them for nothing.
                let relevant = running_and_ready(&pod) || pod.metadata.deletion_timestamp.is_some();
                let node = crate::plumbing::cache::pod_node(&pod).map(str::to_owned);
                let Some(node) = node.filter(|_| relevant) else {
                    return Vec::new();
                };
                on_node
                    .state()
                    .into_iter()
                    .filter(|r| r.spec.target_node == node && waits_on_driver(r))
                    .map(|r| ObjectRef::from_obj(r.as_ref()))
                    .collect::<Vec<_>>()
            },
        )
        .watches_stream(
            triggers::secondary(
                CONTROLLER,
                triggers::node_changes(Api::<Node>::all(client), triggers::resource_view),
            ),
            move |node: Node| {
                let name = node.name_any();
                store
                    .state()
                    .into_iter()
                    .filter(|r| r.spec.target_node == name)
                    .map(|r| ObjectRef::from_obj(r.as_ref()))
                    .collect::<Vec<_>>()
            },
        )
        .with_config(
            kube::runtime::controller::Config::default()
                .concurrency(ctx.config.max_concurrent_reconciles),
        )
        .graceful_shutdown_on(shutdown)
        .run(reconcile, reconcile::error_policy, ctx)
        .for_each(|result| async move {
            if let Err(e) = result {
                tracing::debug!(controller = CONTROLLER, error = %e, "reconcile did not finish");
            }
        })
}

/// A resource whose Node is gone: its DRA taint lifted, `Deleting` with `message` as its
/// error, and a `NodeGone` Warning Event (`action`: what the operator does about it).
/// Shared by garbage collection and by a detach that has no machine to go to.
pub(super) async fn mark_node_gone(
    ctx: &Context,
    api: &Api<ComposableResource>,
    res: ComposableResource,
    message: &str,
    action: &str,
) -> Result<ComposableResource, ReconcileError> {
    if let Some(dra) = &ctx.dra {
        dra.untaint(&ctx.client, &res.name_any()).await?;
    }
    let res = patch::status(
        api,
        &res,
        &ResourceStatusPatch::state(ResourceState::Deleting).with_error(message),
        false,
    )
    .await?;
    ctx.event(
        &res.object_ref(&()),
        EventType::Warning,
        "NodeGone",
        action,
        message,
    )
    .await;
    Ok(res)
}
