//! Updating and Running: make the ComposableResources match `status.resources`, mirror
//! their state, and say Running once every device is Online and the dropped ones are
//! gone.

use std::collections::BTreeMap;

use cro_api::{
    ComposabilityRequest, ComposabilityRequestStatus, ComposableResource, ComposableResourceSpec,
    CroObjectExt, FINALIZER, LABEL_MANAGED_BY, LABEL_PROVIDER, RequestState, ResourceState,
};
use kube::api::{Api, PostParams};
use kube::runtime::events::EventType;
use kube::{Resource, ResourceExt};

use super::mirror::{Entries, mirrored, only_progress, summary};
use super::{Next, Unmade, fold_ready, paced, resources_of, set_state, spec_changed, status_of};
use crate::controllers::resource::{node_exists, records_at_creation};
use crate::error::ReconcileError;
use crate::plumbing::conditions;
use crate::plumbing::context::Context;
use crate::plumbing::patch;
use crate::plumbing::reconcile::{self, Step};

pub(super) async fn converge(
    req: ComposabilityRequest,
    ctx: &Context,
) -> Result<Next<ComposabilityRequest>, ReconcileError> {
    if spec_changed(&req) {
        tracing::info!("spec changed: allocating again");
        let req = set_state(ctx, &req, RequestState::NodeAllocating).await?;
        return Ok(Next::Allocate(req));
    }
    // Planned resources not made yet are made next (create_missing).
    let objects = resources_of(ctx, &req, Unmade::Absent).await?;
    let old = status_of(&req);
    if !create_missing(ctx, &req, &old, &objects).await? {
        let req = set_state(ctx, &req, RequestState::NodeAllocating).await?;
        return Ok(Next::Allocate(req));
    }
    let leftovers = drop_leftovers(ctx, &old.resources, &objects).await?;

    let wanted = &old.resources;
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
    new.state = state;
    new.error = error.clone();
    fold_ready(&req, &mut new, not_ready);
    // Resource changes wake the request; the requeue only guards against a lost watch,
    // or writes progress that waited.
    let mut requeue = ctx.config.timings.health_period;
    let req = match progress_wait(ctx, &req, &old, &new) {
        Some(wait) => {
            requeue = requeue.min(wait);
            req
        }
        None => write_status(ctx, req, &old, &new).await?,
    };
    Ok(Next::Done(
        Step::requeue(requeue)
            .with_error(error)
            .not_ready(not_ready),
        Some(req),
    ))
}

/// How long the write of `new` waits, if it may: only progress of the request's devices
/// waits (see [`super::paced`]); its state and error are never late.
fn progress_wait(
    ctx: &Context,
    req: &ComposabilityRequest,
    old: &ComposabilityRequestStatus,
    new: &ComposabilityRequestStatus,
) -> Option<std::time::Duration> {
    if new == old {
        return None;
    }
    paced(
        ctx,
        req,
        only_progress(old, new),
        ctx.request_progress_delay(),
    )
}

/// Creates the planned ComposableResources that do not exist yet; `false` when one that
/// existed is gone (its node went away, or someone deleted it): the plan no longer holds.
async fn create_missing(
    ctx: &Context,
    req: &ComposabilityRequest,
    old: &ComposabilityRequestStatus,
    objects: &[ComposableResource],
) -> Result<bool, ReconcileError> {
    let resources: Api<ComposableResource> = Api::all(ctx.client.clone());
    for (entry_name, entry) in &old.resources {
        if objects.iter().any(|o| o.name_any() == *entry_name) {
            continue;
        }
        if entry.state != ResourceState::Empty {
            tracing::info!(resource = %entry_name, "resource vanished: allocating again");
            return Ok(false);
        }
        // Never created, or created and gone before its first state was mirrored (that
        // mirror may wait, see `progress_wait`): made (again) where planned, unless the
        // node is gone, which only a new plan can answer.
        if !node_exists(ctx, &entry.node_name).await? {
            tracing::info!(resource = %entry_name, node = %entry.node_name, "planned node is gone: allocating again");
            return Ok(false);
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
        let mut labels = BTreeMap::from([(LABEL_MANAGED_BY.to_owned(), req.name_any())]);
        // The replica holding this provider's Lease reconciles it (unrouted now: the
        // routing loop labels it once the node routes).
        let provider = ctx.provider_of(&entry.node_name);
        if let Some(p) = &provider {
            labels.insert(LABEL_PROVIDER.to_owned(), p.clone());
        }
        obj.metadata.labels = Some(labels);
        obj.metadata.finalizers = Some(vec![FINALIZER.to_owned()]);
        // Its first attach then writes no annotations (adopt: the records), when it is
        // made by the process the provider's Lease names now; nor does it after, when
        // another device on the node noted the fabric's machine.
        let node = ctx.caches.node(&entry.node_name);
        let holder = provider
            .as_deref()
            .and_then(|p| ctx.registry.tenure().holder_of(p));
        let others = ctx
            .caches
            .resources_on_node(&entry.node_name)
            .unwrap_or_default();
        obj.metadata.annotations = Some(records_at_creation(
            node.as_deref(),
            holder.as_ref(),
            others.iter().map(AsRef::as_ref),
        ));
        match resources.create(&PostParams::default(), &obj).await {
            Ok(made) => {
                tracing::info!(resource = %entry_name, node = %entry.node_name, "created resource");
                ctx.caches.note_created(&made);
                // Its first reconciliation here needs no read of it: any copy shows all
                // this process wrote (one GET per device before). Noted only where this
                // process reconciles it, as reconciliations note their own writes.
                if provider
                    .as_deref()
                    .is_some_and(|p| ctx.registry.tenure().check(p).is_ok())
                {
                    ctx.left_at(
                        &reconcile::object_key(&made),
                        made.metadata.resource_version.as_deref(),
                    );
                }
            }
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(true)
}

/// Deletes the request's resources the plan no longer names; how many are left over
/// (those already being deleted count until they are gone).
async fn drop_leftovers(
    ctx: &Context,
    wanted: &Entries,
    objects: &[ComposableResource],
) -> Result<usize, ReconcileError> {
    let resources: Api<ComposableResource> = Api::all(ctx.client.clone());
    let mut leftovers = 0;
    for obj in objects
        .iter()
        .filter(|o| !wanted.contains_key(&o.name_any()))
    {
        leftovers += 1;
        if !obj.is_being_deleted() {
            tracing::info!(resource = %obj.name_any(), "dropping resource");
            ctx.delete_once(&resources, obj).await?;
        }
    }
    Ok(leftovers)
}

/// Writes the new status when it differs, with an Event when the request starts Running.
async fn write_status(
    ctx: &Context,
    req: ComposabilityRequest,
    old: &ComposabilityRequestStatus,
    new: &ComposabilityRequestStatus,
) -> Result<ComposabilityRequest, ReconcileError> {
    if new == old {
        return Ok(req);
    }
    let api: Api<ComposabilityRequest> = Api::all(ctx.client.clone());
    let req = patch::replace_status(&api, &req, old, new).await?;
    if new.state == RequestState::Running && old.state != RequestState::Running {
        ctx.event(
            &req.object_ref(&()),
            EventType::Normal,
            "Running",
            "Update",
            online_message(&new.resources),
        )
        .await;
    }
    Ok(req)
}

/// How many devices a `Running` or `Detached` Event of a request names; the rest are
/// counted.
const MAX_NAMED: usize = 8;

/// The `Running` Event's message: every device and where it is (the per-device
/// `Attached` Events of a request's devices were one Event per device more; the request's
/// Event says it, docs/BENCHMARKS.md, Events), e.g. `all 2 devices are online: gpu-a
/// (GPU-1) on worker-1, gpu-b (GPU-2) on worker-1`.
pub(crate) fn online_message(entries: &super::mirror::Entries) -> String {
    devices_message("online", "on", entries.iter())
}

/// `all N devices are <what>: name (device) <place> node, …`: the first
/// [`MAX_NAMED`] named, the rest counted.
pub(super) fn devices_message<'a>(
    what: &str,
    place: &str,
    devices: impl ExactSizeIterator<Item = (&'a String, &'a cro_api::ScalarResourceStatus)>,
) -> String {
    let n = devices.len();
    let mut named: Vec<String> = devices
        .take(MAX_NAMED)
        .map(|(name, e)| format!("{name} ({}) {place} {}", e.device_id, e.node_name))
        .collect();
    if n > MAX_NAMED {
        named.push(format!("and {} more", n - MAX_NAMED));
    }
    format!("all {n} devices are {what}: {}", named.join(", "))
}

/// The resource's Ready condition is False.
fn not_ready(r: &ComposableResource) -> bool {
    r.status.as_ref().is_some_and(|s| {
        s.conditions
            .iter()
            .any(|c| c.type_ == conditions::READY && c.status == "False")
    })
}
