//! Updating and Running: make the ComposableResources match `status.resources`, mirror
//! their state, and say Running once every device is Online and the dropped ones are
//! gone.

use std::collections::BTreeMap;

use cro_api::{
    ComposabilityRequest, ComposableResource, ComposableResourceSpec, CroObjectExt, FINALIZER,
    LABEL_MANAGED_BY, RequestState, ResourceState,
};
use kube::api::{Api, PostParams};
use kube::runtime::events::EventType;
use kube::{Resource, ResourceExt};

use super::mirror::{mirrored, summary};
use super::{Next, resources_of, set_state, spec_changed, status_of};
use crate::conditions;
use crate::context::Context;
use crate::error::ReconcileError;
use crate::patch;
use crate::reconcile::Step;

pub(super) async fn converge(
    req: ComposabilityRequest,
    ctx: &Context,
) -> Result<Next<ComposabilityRequest>, ReconcileError> {
    let name = req.name_any();
    if spec_changed(&req) {
        tracing::info!("spec changed: allocating again");
        let req = set_state(ctx, &req, RequestState::NodeAllocating).await?;
        return Ok(Next::Allocate(req));
    }
    let api: Api<ComposabilityRequest> = Api::all(ctx.client.clone());
    let resources: Api<ComposableResource> = Api::all(ctx.client.clone());
    let objects = resources_of(ctx, &req).await?;
    let old = status_of(&req);
    let wanted = &old.resources;

    for (entry_name, entry) in wanted {
        if objects.iter().any(|o| o.name_any() == *entry_name) {
            continue;
        }
        if entry.state != ResourceState::Empty {
            // It existed and is gone (its node went away, or someone deleted it): the
            // plan no longer holds.
            tracing::info!(resource = %entry_name, "resource vanished: allocating again");
            let req = set_state(ctx, &req, RequestState::NodeAllocating).await?;
            return Ok(Next::Allocate(req));
        }
        let Some(spec) = old.scalar_resource.as_ref() else {
            return Err(ReconcileError::Invalid(
                "status.scalarResource is missing while Updating".into(),
            ));
        };
        let mut obj = ComposableResource::new(
            entry_name,
            ComposableResourceSpec {
                resource_type: spec.resource_type,
                model: spec.model.clone(),
                target_node: entry.node_name.clone(),
                force_detach: spec.force_detach,
            },
        );
        obj.metadata.labels = Some(BTreeMap::from([(
            LABEL_MANAGED_BY.to_owned(),
            name.clone(),
        )]));
        obj.metadata.finalizers = Some(vec![FINALIZER.to_owned()]);
        match resources.create(&PostParams::default(), &obj).await {
            Ok(_) => {
                tracing::info!(resource = %entry_name, node = %entry.node_name, "created resource");
            }
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(e) => return Err(e.into()),
        }
    }

    let mut leftovers = 0;
    for obj in objects
        .iter()
        .filter(|o| !wanted.contains_key(&o.name_any()))
    {
        leftovers += 1;
        if !obj.is_being_deleted() {
            tracing::info!(resource = %obj.name_any(), "dropping resource");
            patch::delete(&resources, &obj.name_any()).await?;
        }
    }

    let entries = mirrored(wanted, &objects);
    let all_online = entries.iter().all(|(n, e)| {
        e.state == ResourceState::Online && objects.iter().any(|o| o.name_any() == *n)
    });
    let state = if all_online && leftovers == 0 {
        RequestState::Running
    } else {
        RequestState::Updating
    };
    // A Running request is not Ready while one of its devices is not (the fabric lost
    // it, or reports it critical): its state stays Running, as the Go operator's did.
    let not_ready = (state == RequestState::Running
        && objects
            .iter()
            .filter(|o| wanted.contains_key(&o.name_any()))
            .any(not_ready))
    .then_some(conditions::DEVICES_NOT_READY);
    let error = summary(&entries);
    let mut new = old.clone();
    new.resources = entries;
    new.state = state.clone();
    new.error = error.clone();
    let req = if new != old {
        let req = patch::replace_status(&api, &req, &old, &new).await?;
        if state == RequestState::Running && old.state != RequestState::Running {
            ctx.event(
                &req.object_ref(&()),
                EventType::Normal,
                "Running",
                "Update",
                format!("all {} devices are online", new.resources.len()),
            )
            .await;
        }
        req
    } else {
        req
    };
    // Resource changes wake the request; the requeue only guards against a lost watch.
    Ok(Next::Done(
        Step::requeue(ctx.config.timings.health_period)
            .with_error(error)
            .not_ready(not_ready),
        Some(req),
    ))
}

/// The resource's Ready condition is False.
fn not_ready(r: &ComposableResource) -> bool {
    r.status.as_ref().is_some_and(|s| {
        s.conditions
            .iter()
            .any(|c| c.type_ == conditions::READY && c.status == "False")
    })
}
