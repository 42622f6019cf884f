//! Deletion of a request: Cleaning (delete every ComposableResource of it and wait until
//! none is left) → Deleting (remove the finalizer).

use cro_api::{ComposabilityRequest, ComposableResource, CroObjectExt, RequestState};
use kube::ResourceExt;
use kube::api::Api;

use super::mirror::entry_of;
use super::{Outcome, resources_of, set_state, status_of};
use crate::plumbing::context::Context;
use crate::plumbing::patch;
use crate::plumbing::reconcile::Step;

pub(super) async fn on_delete(req: ComposabilityRequest, ctx: &Context) -> Outcome {
    let api: Api<ComposabilityRequest> = Api::all(ctx.client.clone());
    if !req.has_cro_finalizer() {
        return Ok((Step::wait(), None));
    }
    let req = match req.state() {
        RequestState::Deleting => {
            patch::remove_finalizer(&api, &req).await?;
            return Ok((Step::wait(), None));
        }
        RequestState::Cleaning => req,
        _ => set_state(ctx, &req, RequestState::Cleaning).await?,
    };

    let resources: Api<ComposableResource> = Api::all(ctx.client.clone());
    let objects = resources_of(ctx, &req).await?;
    for obj in objects.iter().filter(|o| !o.is_being_deleted()) {
        patch::delete(&resources, &obj.name_any()).await?;
    }
    if objects.is_empty() {
        let req = set_state(ctx, &req, RequestState::Deleting).await?;
        patch::remove_finalizer(&api, &req).await?;
        return Ok((Step::wait(), None));
    }

    let old = status_of(&req);
    let mut new = old.clone();
    new.resources = objects
        .iter()
        .map(|o| (o.name_any(), entry_of(o)))
        .collect();
    let req = if new != old {
        patch::replace_status(&api, &req, &old, &new).await?
    } else {
        req
    };
    // The resources' deletion wakes the request; the requeue only guards a lost watch.
    Ok((Step::requeue(ctx.config.timings.health_period), Some(req)))
}
