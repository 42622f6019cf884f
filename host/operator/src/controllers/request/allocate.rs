//! NodeAllocating: the plan (which devices stay, which go, where new ones go), written
//! into `status.resources`.

use cro_api::{
    AllocationPolicy, ComposabilityRequest, ComposableResource, RequestState,
    ScalarResourceDetails, ScalarResourceStatus,
};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ListParams};
use kube::runtime::events::EventType;
use kube::{Resource, ResourceExt};

use super::mirror::{Entries, entry_of};
use super::{Next, Unmade, fold_ready, resources_of, set_state, status_of};
use crate::decide::allocation;
use crate::decide::views;
use crate::error::ReconcileError;
use crate::plumbing::context::Context;
use crate::plumbing::patch;

pub(super) async fn allocate(
    req: ComposabilityRequest,
    ctx: &Context,
) -> Result<Next<ComposabilityRequest>, ReconcileError> {
    let api: Api<ComposabilityRequest> = Api::all(ctx.client.clone());
    let name = req.name_any();
    let spec = req.spec.resource.clone();

    let nodes = nodes(ctx).await?;
    let objects = resources_of(ctx, &req, Unmade::Read).await?;
    let others = samenode_requests(ctx, &api).await?;
    let plan = match allocation::plan(
        &views::request_view(&spec),
        &objects.iter().map(views::resource_view).collect::<Vec<_>>(),
        &views::node_views(&nodes),
        &views::samenode_nodes_of_others(&name, &others),
    ) {
        Ok(plan) => plan,
        // A request that cannot be planned says so in NodeAllocating (with the error),
        // the state a new request skips when its plan succeeds at once.
        Err(e) => {
            if req.state() != RequestState::NodeAllocating {
                set_state(ctx, &req, RequestState::NodeAllocating).await?;
            }
            return Err(e.into());
        }
    };
    let entries = planned_entries(&plan, &objects, &spec);

    let old = status_of(&req);
    let mut new = old.clone();
    new.state = RequestState::Updating;
    new.error = String::new();
    new.resources = entries;
    new.scalar_resource = Some(spec);
    fold_ready(&req, &mut new, None);
    let req = patch::replace_status(&api, &req, &old, &new).await?;
    announce(ctx, &req, &plan).await;
    Ok(Next::Converge(req))
}

/// The cluster's nodes. Planning reads nodes and the other requests from the watch
/// caches: a plan made on a view a moment old is stored before anything acts on it, and
/// converge replans when the nodes or the request no longer fit it.
async fn nodes(ctx: &Context) -> Result<Vec<Node>, ReconcileError> {
    Ok(match ctx.caches.nodes() {
        Some(nodes) => nodes.iter().map(|n| n.as_ref().clone()).collect(),
        None => {
            Api::<Node>::all(ctx.client.clone())
                .list(&ListParams::default())
                .await?
                .items
        }
    })
}

/// The other requests a plan must respect. Only same-node requests constrain it: from
/// the cache only those are cloned, not every request.
async fn samenode_requests(
    ctx: &Context,
    api: &Api<ComposabilityRequest>,
) -> Result<Vec<ComposabilityRequest>, ReconcileError> {
    Ok(match ctx.caches.requests() {
        Some(all) => all
            .iter()
            .filter(|r| r.spec.resource.allocation_policy == AllocationPolicy::SameNode)
            .map(|r| r.as_ref().clone())
            .collect(),
        None => api.list(&ListParams::default()).await?.items,
    })
}

/// `status.resources` of the plan: the kept resources as they are, and a new, empty
/// entry (with a fresh name) per device to create.
fn planned_entries(
    plan: &allocation::Plan,
    objects: &[ComposableResource],
    spec: &ScalarResourceDetails,
) -> Entries {
    let mut entries = Entries::new();
    for keep in &plan.keep {
        if let Some(obj) = objects.iter().find(|o| o.name_any() == *keep) {
            entries.insert(keep.clone(), entry_of(obj));
        }
    }
    for node in &plan.create {
        entries.insert(
            spec.resource_type.new_resource_name(),
            ScalarResourceStatus {
                node_name: node.clone(),
                ..ScalarResourceStatus::default()
            },
        );
    }
    entries
}

/// Logs the plan, and records it as an Event on the request when it changes an earlier
/// one (devices kept or dropped: a changed spec, a lost device). A request's first plan
/// is in its status at once, and its `Running` Event names the devices it made: an
/// Event for it too was one more write per request (docs/BENCHMARKS.md, Events).
async fn announce(ctx: &Context, req: &ComposabilityRequest, plan: &allocation::Plan) {
    let summary = format!(
        "keep {}, drop {}, create {}{}",
        plan.keep.len(),
        plan.drop.len(),
        plan.create.len(),
        if plan.create.is_empty() {
            String::new()
        } else {
            format!(" on {}", plan.create.join(", "))
        }
    );
    tracing::info!(drop = ?plan.drop, %summary, "allocated");
    if plan.keep.is_empty() && plan.drop.is_empty() {
        return;
    }
    ctx.event(
        &req.object_ref(&()),
        EventType::Normal,
        "Allocated",
        "Allocate",
        summary,
    )
    .await;
}
