//! Labels every ComposableResource with the provider serving its node
//! (`cro.hpsys.ibm.ie.com/provider`): the replica holding that provider's Lease is the one
//! that reconciles it, and its controller watches only resources carrying the label
//! (docs/ARCHITECTURE.md, "Replicas").
//!
//! The request controller, the binder and the upstream sync label what they create;
//! this loop, run by the leader only, labels the rest: resources the Go operator or an
//! earlier cro made, those made by hand, and those whose node did not route when they
//! were made. A resource whose node routes nowhere stays unlabelled, its `status.error`
//! and a Warning Event say why, and nobody acts on it until it routes (a CdiProvider selects its
//! node, or the node comes back), because acting through the wrong fabric would attach
//! or detach somebody else's hardware.
//!
//! A label, once set, is kept: a resource's device is on its provider's fabric whatever
//! the node's labels say later, and the registry sends the calls on that device there
//! (crate::registry::route::for_call). A resource on a Node that is gone takes the
//! provider the node's other resources are labelled with
//! (crate::registry::Registry::route_held): whatever is on that node's machine is that
//! provider's, and its detach must reach it.

use std::collections::BTreeSet;
use std::sync::{Mutex, PoisonError};

use cro_api::{ComposableResource, LABEL_PROVIDER};
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::EventType;
use kube::{Resource, ResourceExt};
use serde_json::json;

use crate::error::ReconcileError;
use crate::plumbing::context::Context;
use crate::plumbing::patch::{self, FIELD_MANAGER, ResourceStatusPatch};
use crate::plumbing::reconcile;

/// Labels unlabelled resources every `poll_interval` and soon after one is seen, until
/// `shutdown`.
pub(crate) async fn run(ctx: &Context, shutdown: impl std::future::Future<Output = ()>) {
    let wake = ctx.caches.unrouted_resources();
    let period = ctx.config.timings.poll_interval;
    let warned = Mutex::new(BTreeSet::new());
    reconcile::every_or_woken(ctx, "routing", period, &wake, shutdown, || {
        label_unrouted(ctx, &warned)
    })
    .await;
}

/// One round; `warned` holds the resources already said to route nowhere (said once).
async fn label_unrouted(
    ctx: &Context,
    warned: &Mutex<BTreeSet<String>>,
) -> Result<(), ReconcileError> {
    let Some(resources) = ctx.caches.resources() else {
        return Ok(());
    };
    // Until every CdiProvider is read, no node routes: nothing to label, and nothing to
    // say is unroutable.
    if !ctx.registry.knows_all() {
        return Ok(());
    }
    let api: Api<ComposableResource> = Api::all(ctx.client.clone());
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.to_owned()),
        ..PatchParams::default()
    };
    let mut unroutable = BTreeSet::new();
    for res in resources
        .iter()
        .filter(|r| !r.labels().contains_key(LABEL_PROVIDER))
    {
        let name = res.name_any();
        let provider = match ctx.registry.route_held(&res.spec.target_node) {
            Ok(p) => p,
            Err(e) => {
                if !warned
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .contains(&name)
                {
                    tracing::warn!(resource = %name, node = %res.spec.target_node, error = %e,
                        "no provider serves the resource's node: it waits unlabelled, and no replica acts on it");
                }
                say_unroutable(ctx, &api, res, &e.to_string()).await?;
                unroutable.insert(name);
                continue;
            }
        };
        let patch = json!({"metadata": {"labels": {LABEL_PROVIDER: provider}}});
        match api.patch(&name, &params, &Patch::Merge(&patch)).await {
            Ok(_) => tracing::debug!(resource = %name, provider = %provider, "resource routed"),
            // Deleted meanwhile: nothing to route.
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => return Err(e.into()),
        }
    }
    *warned.lock().unwrap_or_else(PoisonError::into_inner) = unroutable;
    Ok(())
}

/// Tells the resource's readers why nothing happens to it: `status.error` and a Warning
/// Event, each once per message (no replica reconciles it to say so).
async fn say_unroutable(
    ctx: &Context,
    api: &Api<ComposableResource>,
    res: &ComposableResource,
    message: &str,
) -> Result<(), ReconcileError> {
    if res.status.as_ref().is_some_and(|s| s.error == message) {
        return Ok(());
    }
    patch::status(
        api,
        res,
        &ResourceStatusPatch::default().with_error(message),
        false,
    )
    .await?;
    ctx.event(
        &res.object_ref(&()),
        EventType::Warning,
        "NoProvider",
        "Route",
        message,
    )
    .await;
    Ok(())
}
