//! Deletion of a request: Cleaning (delete every ComposableResource of it and wait until
//! none is left) → Deleting (remove the finalizer).

use cro_api::{ComposabilityRequest, ComposableResource, CroObjectExt, RequestState};
use kube::ResourceExt;
use kube::api::Api;

use super::mirror::entry_of;
use super::{Outcome, Unmade, paced, resources_of, set_state, status_of};
use crate::plumbing::context::Context;
use crate::plumbing::patch;
use crate::plumbing::reconcile::{self, Step};

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
    let objects = resources_of(ctx, &req, Unmade::Read).await?;
    for obj in objects.iter().filter(|o| !o.is_being_deleted()) {
        ctx.delete_once(&resources, obj).await?;
    }
    if objects.is_empty() {
        // Straight to the finalizer's removal: a `Deleting` state written first would be
        // seen for milliseconds, one more write per request (one a Go operator left in
        // `Deleting` is finished above).
        patch::remove_finalizer(&api, &req).await?;
        ctx.progress_written(&reconcile::object_key(&req));
        return Ok((Step::wait(), None));
    }

    let old = status_of(&req);
    let mut new = old.clone();
    new.resources = objects
        .iter()
        .map(|o| (o.name_any(), entry_of(o)))
        .collect();
    // While Cleaning, every change of the mirror is progress (devices detaching and
    // going), written together within a minute by default (super::paced,
    // `Context::cleaning_progress_delay`): a request being deleted is waited on for its
    // going, which its finalizer's removal makes as soon as no device is left; at a
    // thousand requests deleted at once, a write per request at 2 s was a tenth of the
    // writes down, and at 16 s still 0.08 per device.
    let mut requeue = ctx.config.timings.health_period;
    let req = if new == old {
        req
    } else if let Some(wait) = paced(ctx, &req, true, ctx.cleaning_progress_delay()) {
        requeue = requeue.min(wait);
        req
    } else {
        patch::replace_status(&api, &req, &old, &new).await?
    };
    // The resources' deletion wakes the request; the requeue only guards a lost watch,
    // or writes progress that waited.
    Ok((Step::requeue(requeue), Some(req)))
}
