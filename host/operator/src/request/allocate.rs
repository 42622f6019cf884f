//! NodeAllocating: the plan (which devices stay, which go, where new ones go), written
//! into `status.resources`.

use cro_api::{AllocationPolicy, ComposabilityRequest, RequestState, ScalarResourceStatus};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ListParams};
use kube::runtime::events::EventType;
use kube::{Resource, ResourceExt};

use super::mirror::{Entries, entry_of};
use super::{Next, resources_of, status_of};
use crate::allocation;
use crate::context::Context;
use crate::error::ReconcileError;
use crate::patch;
use crate::views;

pub(super) async fn allocate(
    req: ComposabilityRequest,
    ctx: &Context,
) -> Result<Next<ComposabilityRequest>, ReconcileError> {
    let api: Api<ComposabilityRequest> = Api::all(ctx.client.clone());
    let name = req.name_any();
    let spec = req.spec.resource.clone();

    // Planning reads nodes and the other requests from the watch caches: a plan made on
    // a view a moment old is stored before anything acts on it, and converge replans
    // when the nodes or the request no longer fit it.
    let nodes: Vec<Node> = match ctx.caches.nodes() {
        Some(nodes) => nodes.iter().map(|n| n.as_ref().clone()).collect(),
        None => {
            Api::<Node>::all(ctx.client.clone())
                .list(&ListParams::default())
                .await?
                .items
        }
    };
    let objects = resources_of(ctx, &req).await?;
    // Only same-node requests constrain this plan: clone those, not every request.
    let others: Vec<ComposabilityRequest> = match ctx.caches.requests() {
        Some(all) => all
            .iter()
            .filter(|r| r.spec.resource.allocation_policy == AllocationPolicy::SameNode)
            .map(|r| r.as_ref().clone())
            .collect(),
        None => api.list(&ListParams::default()).await?.items,
    };
    let plan = allocation::plan(
        &views::request_view(&spec),
        &objects.iter().map(views::resource_view).collect::<Vec<_>>(),
        &views::node_views(&nodes),
        &views::samenode_nodes_of_others(&name, &others),
    )?;

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

    let old = status_of(&req);
    let mut new = old.clone();
    new.state = RequestState::Updating;
    new.error = String::new();
    new.resources = entries;
    new.scalar_resource = Some(spec);
    let req = patch::replace_status(&api, &req, &old, &new).await?;

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
    ctx.event(
        &req.object_ref(&()),
        EventType::Normal,
        "Allocated",
        "Allocate",
        summary,
    )
    .await;
    Ok(Next::Converge(req))
}
