//! The ComposabilityRequest controller: decides which devices a request keeps and where
//! new ones go, creates and deletes its ComposableResources, mirrors their state, and
//! cleans up on deletion.
//!
//! Each state's handler returns the [`Next`] step (allocate, converge, or done) and one
//! loop, [`drive`], runs them: a converge that finds the plan invalid hands back to
//! allocate instead of calling it, so no handler calls another.
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
    LABEL_MANAGED_BY, RequestState, ResourceState,
};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::EventType;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Resource, ResourceExt};

use crate::controllers::resource::node_exists;
use crate::error::ReconcileError;
use crate::plumbing::cache::Unseen;
use crate::plumbing::context::Context;
use crate::plumbing::patch;
use crate::plumbing::reconcile::{self, Step};
use crate::plumbing::triggers;

pub const CONTROLLER: &str = "composabilityrequest";

pub(crate) type Outcome = Result<(Step, Option<ComposabilityRequest>), ReconcileError>;

/// What a state's handler leads to.
#[derive(Debug)]
pub(crate) enum Next<R> {
    /// NodeAllocating: (re)plan the request.
    Allocate(R),
    /// Updating or Running: make the resources match the plan.
    Converge(R),
    /// This reconciliation is over.
    Done(Step, Option<R>),
}

/// Handlers one reconciliation runs at most: allocate → converge → (plan invalid)
/// allocate → converge is the longest legitimate chain; a plan invalidated over and
/// over is looked at again after the poll interval instead of in a tight loop.
const MAX_STEPS: usize = 4;

/// Runs handlers from `first` until one is done (or [`MAX_STEPS`] ran).
pub(crate) async fn drive<R, F, Fut>(
    first: Next<R>,
    retry_after: std::time::Duration,
    mut run: F,
) -> Result<(Step, Option<R>), ReconcileError>
where
    F: FnMut(Next<R>) -> Fut,
    Fut: std::future::Future<Output = Result<Next<R>, ReconcileError>>,
{
    let mut next = first;
    for _ in 0..MAX_STEPS {
        next = match next {
            Next::Done(step, r) => return Ok((step, r)),
            other => run(other).await?,
        };
    }
    match next {
        Next::Done(step, r) => Ok((step, r)),
        Next::Allocate(r) | Next::Converge(r) => {
            tracing::info!("the plan keeps changing; looking again shortly");
            Ok((Step::requeue(retry_after), Some(r)))
        }
    }
}

/// `new` with the Ready condition the reconciliation's report will find it implies
/// (`reconcile::report_success`), so that a state and its condition are one write, not
/// two, and the report finds nothing left to write.
pub(super) fn fold_ready(
    req: &ComposabilityRequest,
    new: &mut ComposabilityRequestStatus,
    not_ready: Option<&'static str>,
) {
    let mut preview = req.clone();
    preview.status = Some(new.clone());
    let now = k8s_openapi::jiff::Timestamp::now();
    if let Some(conditions) =
        crate::plumbing::conditions::report_patch(&preview, &new.error, not_ready, now)
            .and_then(|report| report.conditions)
    {
        new.conditions = conditions;
    }
}

/// How long a write of the request's status that is only `progress` of its devices may
/// still wait (`Context::progress_wait`, within `delay` of it being first seen): each
/// write is a watch event every watch of requests decodes, and the mirror of every device
/// state was a third of a request's writes. Anything else (`progress` false) is written
/// at once, and takes the waiting progress with it.
pub(super) fn paced(
    ctx: &Context,
    req: &ComposabilityRequest,
    progress: bool,
    delay: std::time::Duration,
) -> Option<std::time::Duration> {
    let key = reconcile::object_key(req);
    if !progress {
        ctx.progress_written(&key);
        return None;
    }
    ctx.progress_wait(&key, delay)
}

pub(crate) fn status_of(r: &ComposabilityRequest) -> ComposabilityRequestStatus {
    r.status.clone().unwrap_or_default()
}

pub(crate) async fn reconcile(
    obj: Arc<ComposabilityRequest>,
    ctx: Arc<Context>,
) -> Result<Action, ReconcileError> {
    let Some(fresh) = reconcile::current(&ctx, obj, untouched).await? else {
        return Ok(Action::await_change());
    };
    reconcile::run(CONTROLLER, &ctx, fresh, |r| step(r, &ctx)).await
}

/// A request no reconciliation has touched (neither the finalizer nor a status: a new
/// user's object, as its watch event shows it): its first reconciliation begins with
/// the finalizer's write, guarded by the copy's version ([`step`]), so the copy needs no
/// read before it (`reconcile::current`). Nothing else is done with the copy first.
fn untouched(r: &ComposabilityRequest) -> bool {
    !r.has_cro_finalizer() && r.status.is_none() && !r.is_being_deleted()
}

/// How [`resources_of`] takes a resource the request's status plans (its entry still
/// `Empty`) that the cache has never shown and this process never created.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Unmade {
    /// Not there yet: the caller creates it next, and a creation that finds it made
    /// (by an earlier holder of this controller) is refused and changes nothing.
    Absent,
    /// Read from the API server: the caller concludes from its absence (cleanup would
    /// finish with the resource still there).
    Read,
}

/// The request's ComposableResources: from the watch cache once it shows every resource
/// change that woke a request (`Caches::caught_up_with_triggers`: a request woken by its
/// resource's last change must not read the resource as it was before). A resource the
/// request's status names that the cache lacks is one of: created by this process and
/// not shown yet (the cache is waited for), deleted as the cache's watch saw (gone: a
/// request being cleaned names its deleted devices until its status is next written),
/// planned and not created yet (`unmade`), or unknown, read by name from the API server.
/// Reading every name the cache lacked was 1 GET per device up (the planned ones,
/// before their creation) and 3.5 down at N = 100 (docs/BENCHMARKS.md); listing by label
/// instead scanned every resource of the cluster in the API server. Without the cache,
/// found by label from the API server.
pub(crate) async fn resources_of(
    ctx: &Context,
    req: &ComposabilityRequest,
    unmade: Unmade,
) -> Result<Vec<ComposableResource>, ReconcileError> {
    let request = req.name_any();
    let api: Api<ComposableResource> = Api::all(ctx.client.clone());
    if ctx.caches.caught_up_with_triggers().await
        && let Some(cached) = ctx.caches.resources_of_request(&request)
    {
        let mut mine: Vec<ComposableResource> = cached.iter().map(|r| r.as_ref().clone()).collect();
        let recorded = req.status.iter().flat_map(|s| s.resources.iter());
        let missing: Vec<(String, bool)> = recorded
            .filter(|(n, _)| !mine.iter().any(|r| r.name_any() == **n))
            .map(|(n, e)| (n.clone(), e.state == ResourceState::Empty))
            .collect();
        for (name, planned) in missing {
            let found = match ctx.caches.unseen(&name).await {
                Unseen::Shown(r) => Some(r.as_ref().clone()),
                Unseen::Gone => None,
                Unseen::Unknown if planned && unmade == Unmade::Absent => None,
                Unseen::Unknown => api.get_opt(&name).await?,
            };
            if let Some(r) = found
                && r.managed_by() == Some(request.as_str())
            {
                mine.push(r);
            }
        }
        return Ok(mine);
    }
    let params = ListParams::default().labels(&format!("{LABEL_MANAGED_BY}={request}"));
    Ok(api.list(&params).await?.items)
}

/// Writes a new state (and clears the error) with the Ready condition it implies (one
/// write, not two: see [`fold_ready`]), guarded by the version read.
pub(crate) async fn set_state(
    ctx: &Context,
    req: &ComposabilityRequest,
    state: RequestState,
) -> Result<ComposabilityRequest, ReconcileError> {
    let api: Api<ComposabilityRequest> = Api::all(ctx.client.clone());
    let mut new = status_of(req);
    new.state = state.clone();
    new.error = String::new();
    let before = new.conditions.clone();
    fold_ready(req, &mut new, None);
    let mut update = patch::RequestStatusPatch::state(state);
    if new.conditions != before {
        update.conditions = Some(new.conditions);
    }
    patch::status(&api, req, &update, true).await
}

async fn step(req: ComposabilityRequest, ctx: &Context) -> Outcome {
    let api: Api<ComposabilityRequest> = Api::all(ctx.client.clone());
    if req.is_being_deleted() {
        propagate_force_detach(ctx, &req).await?;
        // The resources' errors say why the cleanup does not finish (a node that cannot
        // run commands, a busy GPU): the request sums them up as it does while live.
        let (step, latest) = cleanup::on_delete(req, ctx).await?;
        let error = latest
            .as_ref()
            .map(|r| mirror::summary(&status_of(r).resources))
            .unwrap_or_default();
        return Ok((step.with_error(error), latest));
    }
    // First of all, on a copy that may not have been read (`untouched`): the write is
    // guarded by its version, and its reply is the request as the API server has it.
    let req = patch::add_finalizer(&api, &req).await?;
    if spec_changed(&req) {
        propagate_force_detach(ctx, &req).await?;
    }
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
    let first = match req.state() {
        RequestState::NodeAllocating => Next::Allocate(req),
        RequestState::Updating | RequestState::Running => Next::Converge(req),
        // New, or a state that only deletion explains (the deletion was undone) or that
        // this version does not know: plan from scratch. `NodeAllocating` is written only
        // if the plan fails (allocate): a plan that succeeds goes to `Updating` in one
        // write instead of two.
        _ => Next::Allocate(req),
    };
    drive(first, ctx.config.timings.poll_interval, |next| async move {
        match next {
            Next::Allocate(r) => allocate::allocate(r, ctx).await,
            Next::Converge(r) => converge::converge(r, ctx).await,
            done @ Next::Done(..) => Ok(done),
        }
    })
    .await
}

/// Copies the request's `force_detach` onto its resources, so that turning it on reaches
/// detaches already under way (the way out of a detach blocked by its node,
/// docs/troubleshooting.md). A resource being deleted is never turned back from forced.
async fn propagate_force_detach(
    ctx: &Context,
    req: &ComposabilityRequest,
) -> Result<(), ReconcileError> {
    let want = req.spec.resource.force_detach;
    let api: Api<ComposableResource> = Api::all(ctx.client.clone());
    for r in resources_of(ctx, req, Unmade::Read).await? {
        if r.spec.force_detach == want || (!want && r.is_being_deleted()) {
            continue;
        }
        let patch = serde_json::json!({"spec": {"force_detach": want}});
        match api
            .patch(
                &r.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
        {
            Ok(_) => {
                tracing::info!(resource = %r.name_any(), force_detach = want, "force_detach copied from the request");
            }
            // Gone meanwhile: nothing left to force.
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// Whether the spec differs from the one last acted on.
pub(crate) fn spec_changed(req: &ComposabilityRequest) -> bool {
    req.status.as_ref().and_then(|s| s.scalar_resource.as_ref()) != Some(&req.spec.resource)
}

/// Builds the controller: requests, plus their ComposableResources (by label, so a
/// device's change wakes its request at once) and Nodes (a node that comes or goes
/// can unblock an allocation or orphan a request; so can a change of the capacity
/// placement compares, `triggers::request_view`, and nothing else of a Node).
pub(crate) fn controller(
    ctx: Arc<Context>,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) -> impl futures::Future<Output = ()> {
    let client = ctx.client.clone();
    let requests: Api<ComposabilityRequest> = Api::all(client.clone());
    let controller = Controller::new(requests, watcher::Config::default());
    let store = controller.store();
    let woken = ctx.clone();
    controller
        .watches(
            Api::<ComposableResource>::all(client.clone()),
            watcher::Config::default(),
            move |r: ComposableResource| {
                // The reconcile this wakes reads the resource cache: it waits for this.
                woken.caches.note_triggered(&r);
                r.managed_by().map(ObjectRef::<ComposabilityRequest>::new)
            },
        )
        .watches_stream(
            triggers::secondary(
                CONTROLLER,
                triggers::node_changes(Api::<Node>::all(client), triggers::request_view),
            ),
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

/// A node event matters to requests waiting for nodes, and to those using or naming it.
fn concerns_node(r: &ComposabilityRequest, node: &str) -> bool {
    let status = r.status.as_ref();
    r.state() == RequestState::NodeAllocating
        || status.is_some_and(|s| !s.error.is_empty())
        || r.spec.resource.target_node() == Some(node)
        || status.is_some_and(|s| s.resources.values().any(|e| e.node_name == node))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn one_loop_drives_the_states_until_done() {
        let mut seen = Vec::new();
        let out = drive(Next::Allocate(0), Duration::from_secs(1), |next| {
            seen.push(format!("{next:?}"));
            async move {
                Ok(match next {
                    Next::Allocate(n) => Next::Converge(n + 1),
                    Next::Converge(n) if n < 3 => Next::Allocate(n + 1),
                    Next::Converge(n) => Next::Done(Step::wait(), Some(n)),
                    done => done,
                })
            }
        })
        .await
        .unwrap();
        assert_eq!(out.1, Some(3));
        assert_eq!(
            seen,
            ["Allocate(0)", "Converge(1)", "Allocate(2)", "Converge(3)"]
        );
    }

    #[tokio::test]
    async fn a_plan_invalidated_over_and_over_is_retried_later_not_in_a_loop() {
        let mut calls = 0;
        let (step, r) = drive(Next::Allocate(()), Duration::from_millis(250), |next| {
            calls += 1;
            async move {
                Ok(match next {
                    Next::Allocate(r) => Next::Converge(r),
                    Next::Converge(r) => Next::Allocate(r),
                    done => done,
                })
            }
        })
        .await
        .unwrap();
        assert_eq!(calls, MAX_STEPS);
        assert_eq!(r, Some(()));
        assert_eq!(
            format!("{:?}", step.action),
            format!("{:?}", Step::requeue(Duration::from_millis(250)).action)
        );
    }

    #[tokio::test]
    async fn errors_stop_the_loop() {
        let out: Result<(Step, Option<()>), _> =
            drive(Next::Converge(()), Duration::from_secs(1), |_| async {
                Err(ReconcileError::Invalid("broken".into()))
            })
            .await;
        assert!(matches!(out, Err(ReconcileError::Invalid(_))));
    }
}
