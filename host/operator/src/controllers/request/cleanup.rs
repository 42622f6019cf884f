//! Deletion of a request: delete every ComposableResource of it and wait until none is
//! left (`Cleaning`, written once that lasts), then remove the finalizer.

use std::time::Duration;

use cro_api::{ComposabilityRequest, ComposableResource, CroObjectExt, RequestState};
use kube::api::Api;
use kube::runtime::events::EventType;
use kube::{Resource, ResourceExt};

use super::converge::devices_message;
use super::mirror::entry_of;
use super::{Outcome, Unmade, paced, resources_of, set_state, status_of};
use crate::error::ReconcileError;
use crate::plumbing::context::Context;
use crate::plumbing::patch;
use crate::plumbing::reconcile::{self, Step};

pub(super) async fn on_delete(req: ComposabilityRequest, ctx: &Context) -> Outcome {
    let api: Api<ComposabilityRequest> = Api::all(ctx.client.clone());
    if !req.has_cro_finalizer() {
        return Ok((Step::wait(), None));
    }
    if req.state() == RequestState::Deleting {
        patch::remove_finalizer(&api, &req).await?;
        return Ok((Step::wait(), None));
    }

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
        detached_event(ctx, &req).await;
        return Ok((Step::wait(), None));
    }

    let entries: super::mirror::Entries = objects
        .iter()
        .map(|o| (o.name_any(), entry_of(o)))
        .collect();
    let (req, not_yet) = cleaning(ctx, req, &entries).await?;
    if let Some(wait) = not_yet {
        return Ok((Step::requeue(wait), Some(req)));
    }
    let old = status_of(&req);
    let mut new = old.clone();
    new.resources = entries;
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

/// The request as `Cleaning`, with how long until it is written when it is not yet.
///
/// `Cleaning` is what users see of a deletion that lasts, not what makes it safe: the
/// deletion and the finalizer are the plan a restart finishes (it finds the request
/// being deleted whatever its state says). So it waits `timings.mirror_delay`, the way a
/// device's wait on its node does (a write per request, docs/BENCHMARKS.md, the write
/// budget), counted as the request's unwritten progress is (`Context::progress_wait`:
/// from the deletion, or from progress already waiting, whichever was seen first): a
/// request whose devices are all gone
/// sooner goes with its last state, and the finalizer's removal is its only write down. A
/// device that reports an error on the way shows it at once, on a `Cleaning` request.
async fn cleaning(
    ctx: &Context,
    req: ComposabilityRequest,
    entries: &super::mirror::Entries,
) -> Result<(ComposabilityRequest, Option<Duration>), ReconcileError> {
    if req.state() == RequestState::Cleaning {
        return Ok((req, None));
    }
    let key = reconcile::object_key(&req);
    let failing = entries.values().any(|e| !e.error.is_empty());
    if !failing && let Some(wait) = ctx.progress_wait(&key, ctx.config.timings.mirror_delay) {
        return Ok((req, Some(wait)));
    }
    // The state alone: progress still waiting (the mirror) keeps its pace.
    Ok((set_state(ctx, &req, RequestState::Cleaning).await?, None))
}

/// The request's one `Detached` Event once its last device is gone, naming the devices
/// its status lists (which sent no Event of their own: `resource::detach`, as up the
/// `Running` Event names them instead of an `Attached` each). A device whose going a
/// `Cleaning` write had already shown (a deletion lasting over
/// `Context::cleaning_progress_delay`) is no longer in the status, and not named.
async fn detached_event(ctx: &Context, req: &ComposabilityRequest) {
    let status = status_of(req);
    let Some(note) = detached_message(&status.resources) else {
        return;
    };
    ctx.event(
        &req.object_ref(&()),
        EventType::Normal,
        "Detached",
        "Delete",
        note,
    )
    .await;
}

/// The `Detached` Event's note, e.g. `all 2 devices are detached: gpu-a (GPU-1) from
/// worker-1, gpu-b (GPU-2) from worker-1`; `None` when the status lists no device.
pub(crate) fn detached_message(entries: &super::mirror::Entries) -> Option<String> {
    let attached: Vec<_> = entries
        .iter()
        .filter(|(_, e)| !e.device_id.is_empty())
        .collect();
    (!attached.is_empty()).then(|| devices_message("detached", "from", attached.into_iter()))
}

#[cfg(test)]
mod tests {
    use cro_api::ScalarResourceStatus;

    use super::detached_message;
    use crate::controllers::request::mirror::Entries;

    fn entry(device: &str) -> ScalarResourceStatus {
        ScalarResourceStatus {
            device_id: device.into(),
            node_name: "worker-1".into(),
            ..Default::default()
        }
    }

    #[test]
    fn the_request_s_detached_event_names_the_devices_its_status_lists() {
        let mut entries = Entries::new();
        assert_eq!(detached_message(&entries), None);
        // A device the status lists without an id was never attached: not named.
        entries.insert("gpu-z".into(), entry(""));
        assert_eq!(detached_message(&entries), None);
        entries.insert("gpu-a".into(), entry("GPU-1"));
        entries.insert("gpu-b".into(), entry("GPU-2"));
        assert_eq!(
            detached_message(&entries).unwrap(),
            "all 2 devices are detached: gpu-a (GPU-1) from worker-1, gpu-b (GPU-2) from worker-1"
        );
        for i in 0..10 {
            entries.insert(format!("gpu-n{i}"), entry(&format!("GPU-n{i}")));
        }
        let note = detached_message(&entries).unwrap();
        assert!(
            note.starts_with("all 12 devices are detached: gpu-a (GPU-1)"),
            "{note}"
        );
        assert!(note.ends_with(", and 4 more"), "{note}");
    }
}
