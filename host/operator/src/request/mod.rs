//! The ComposabilityRequest controller (SPEC §3): decides which devices a request keeps
//! and where new ones go, creates and deletes its ComposableResources, mirrors their
//! state, and cleans up on deletion.
//!
//! The plan of NodeAllocating is stored in `status.resources` (new entries carry the
//! name and node of a resource still to be created) before anything is created, so a
//! crash between planning and creating never creates a device twice.

mod allocate;
mod cleanup;
mod converge;
mod mirror;

use std::sync::Arc;

use cro_api::{
    ComposabilityRequest, ComposabilityRequestStatus, ComposableResource, CroObjectExt,
    LABEL_MANAGED_BY, RequestState,
};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ListParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::EventType;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Resource, ResourceExt};

use crate::context::Context;
use crate::error::ReconcileError;
use crate::patch;
use crate::reconcile::{self, Step};
use crate::resource::node_exists;

pub const CONTROLLER: &str = "composabilityrequest";

pub(crate) type Outcome = Result<(Step, Option<ComposabilityRequest>), ReconcileError>;

pub(crate) fn status_of(r: &ComposabilityRequest) -> ComposabilityRequestStatus {
    r.status.clone().unwrap_or_default()
}

pub async fn reconcile(
    obj: Arc<ComposabilityRequest>,
    ctx: Arc<Context>,
) -> Result<Action, ReconcileError> {
    let api: Api<ComposabilityRequest> = Api::all(ctx.client.clone());
    let Some(fresh) = api.get_opt(&obj.name_any()).await? else {
        return Ok(Action::await_change());
    };
    reconcile::run(CONTROLLER, &ctx, fresh, |r| step(r, &ctx)).await
}

/// The request's ComposableResources, found by label.
pub(crate) async fn resources_of(
    ctx: &Context,
    request: &str,
) -> Result<Vec<ComposableResource>, ReconcileError> {
    let api: Api<ComposableResource> = Api::all(ctx.client.clone());
    let params = ListParams::default().labels(&format!("{LABEL_MANAGED_BY}={request}"));
    Ok(api.list(&params).await?.items)
}

/// Writes a new state (and clears the error), guarded by the version read.
pub(crate) async fn set_state(
    ctx: &Context,
    req: &ComposabilityRequest,
    state: RequestState,
) -> Result<ComposabilityRequest, ReconcileError> {
    let api: Api<ComposabilityRequest> = Api::all(ctx.client.clone());
    patch::status(
        &api,
        req,
        serde_json::json!({"state": state, "error": ""}),
        true,
    )
    .await
}

async fn step(req: ComposabilityRequest, ctx: &Context) -> Outcome {
    let api: Api<ComposabilityRequest> = Api::all(ctx.client.clone());
    if req.is_being_deleted() {
        return cleanup::on_delete(req, ctx).await;
    }
    let mut req = patch::add_finalizer(&api, &req).await?;
    if let Some(target) = req.spec.resource.target_node()
        && !node_exists(ctx, target).await?
    {
        let message = format!("target node {target} not found: deleting the request");
        ctx.event(
            &req.object_ref(&()),
            EventType::Warning,
            "NodeGone",
            "GarbageCollect",
            &message,
        )
        .await;
        tracing::info!(request = %req.name_any(), %message);
        patch::delete(&api, &req.name_any()).await?;
        return Ok((Step::wait(), None));
    }
    match req.state() {
        RequestState::NodeAllocating => allocate::allocate(req, ctx).await,
        RequestState::Updating | RequestState::Running => converge::converge(req, ctx).await,
        // New, or a state that only deletion explains (the deletion was undone) or that
        // this version does not know: plan from scratch.
        _ => {
            req = set_state(ctx, &req, RequestState::NodeAllocating).await?;
            allocate::allocate(req, ctx).await
        }
    }
}

/// Whether the spec differs from the one last acted on.
pub(crate) fn spec_changed(req: &ComposabilityRequest) -> bool {
    req.status.as_ref().and_then(|s| s.scalar_resource.as_ref()) != Some(&req.spec.resource)
}

/// Builds the controller: requests, plus their ComposableResources (by label, so a
/// device's change wakes its request at once) and Nodes (a node that comes or goes
/// can unblock an allocation or orphan a request).
pub fn controller(
    ctx: Arc<Context>,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) -> impl futures::Future<Output = ()> {
    let client = ctx.client.clone();
    let requests: Api<ComposabilityRequest> = Api::all(client.clone());
    let controller = Controller::new(requests, watcher::Config::default());
    let store = controller.store();
    controller
        .watches(
            Api::<ComposableResource>::all(client.clone()),
            watcher::Config::default(),
            |r: ComposableResource| r.managed_by().map(ObjectRef::<ComposabilityRequest>::new),
        )
        .watches(
            Api::<Node>::all(client),
            watcher::Config::default(),
            move |node: Node| {
                let name = node.name_any();
                store
                    .state()
                    .into_iter()
                    .filter(|r| concerns_node(r, &name))
                    .map(|r| ObjectRef::from_obj(r.as_ref()))
                    .collect::<Vec<_>>()
            },
        )
        .graceful_shutdown_on(shutdown)
        .run(reconcile, reconcile::error_policy, ctx)
        .for_each(|result| async move {
            if let Err(e) = result {
                tracing::debug!(controller = CONTROLLER, error = %e, "reconcile did not finish");
            }
        })
}

/// A node event matters to requests waiting for nodes, and to those using or naming it.
fn concerns_node(r: &ComposabilityRequest, node: &str) -> bool {
    let status = r.status.as_ref();
    r.state() == RequestState::NodeAllocating
        || status.is_some_and(|s| !s.error.is_empty())
        || r.spec.resource.target_node() == Some(node)
        || status.is_some_and(|s| s.resources.values().any(|e| e.node_name == node))
}
