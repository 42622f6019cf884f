//! What both controllers share around one reconciliation: timing and metrics, turning
//! an error into `status.error` plus a Warning Event, and the retry policy.

use std::fmt::Debug;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kube::api::Api;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::{Resource, ResourceExt};
use serde::de::DeserializeOwned;
use serde_json::json;

use crate::context::Context;
use crate::error::ReconcileError;
use crate::patch;

/// How soon a conflict (the object changed under us) is retried.
const CONFLICT_RETRY: Duration = Duration::from_millis(100);

/// The result of a reconciliation that did not fail: when to look again and what
/// `status.error` should say (empty: nothing wrong).
#[derive(Debug)]
pub struct Step {
    pub action: Action,
    pub error: String,
}

impl Step {
    pub fn requeue(after: Duration) -> Self {
        Self {
            action: Action::requeue(after),
            error: String::new(),
        }
    }

    /// Nothing to do until the object or something it watches changes.
    pub fn wait() -> Self {
        Self {
            action: Action::await_change(),
            error: String::new(),
        }
    }

    pub fn with_error(mut self, error: impl Into<String>) -> Self {
        self.error = error.into();
        self
    }
}

fn event_reason(e: &ReconcileError) -> &'static str {
    match e.kind() {
        "provider" => "ProviderFailed",
        "driver" => "DriverNotReady",
        "gpu_busy" => "GpuBusy",
        "node" => "NodeCommandFailed",
        "allocation" => "AllocationFailed",
        "invalid" => "InvalidSpec",
        _ => "ReconcileFailed",
    }
}

pub fn object_key<K: Resource<DynamicType = ()>>(obj: &K) -> String {
    format!("{}/{}", K::kind(&()), obj.name_any())
}

/// Runs one reconciliation of `obj` (freshly read), reports the outcome and maps it to
/// the controller's result. `current_error` reads `status.error` of an object.
pub async fn run<K, F, Fut>(
    controller: &'static str,
    ctx: &Context,
    obj: K,
    current_error: fn(&K) -> &str,
    reconcile: F,
) -> Result<Action, ReconcileError>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug,
    F: FnOnce(K) -> Fut,
    Fut: Future<Output = Result<(Step, Option<K>), ReconcileError>>,
{
    let started = Instant::now();
    let key = object_key(&obj);
    let reference = obj.object_ref(&());
    let api: Api<K> = Api::all(ctx.client.clone());
    let before = obj.clone();
    let result = reconcile(obj).await;
    let error_kind = result.as_ref().err().map(ReconcileError::kind);
    ctx.metrics
        .reconciled(controller, error_kind, started.elapsed());
    match result {
        Ok((step, latest)) => {
            ctx.succeeded(&key);
            // `latest` is the object as the reconciliation left it (None: deleted).
            if let Some(latest) = latest
                && current_error(&latest) != step.error
            {
                if !step.error.is_empty() {
                    ctx.event(
                        &reference,
                        EventType::Warning,
                        "Unhealthy",
                        "Check",
                        &step.error,
                    )
                    .await;
                }
                patch::status(&api, &latest, json!({ "error": step.error }), false).await?;
            }
            Ok(step.action)
        }
        Err(e) if e.is_conflict() => {
            tracing::debug!(object = %key, "conflict; retrying");
            Err(e)
        }
        Err(e) => {
            let message = e.to_string();
            tracing::warn!(object = %key, error = %message, "reconcile failed");
            ctx.event(
                &reference,
                EventType::Warning,
                event_reason(&e),
                "Reconcile",
                &message,
            )
            .await;
            if current_error(&before) != message {
                // The object may be gone by now; that is not worth another error.
                match patch::status(&api, &before, json!({ "error": message }), false).await {
                    Ok(_) => {}
                    Err(ReconcileError::Kube(kube::Error::Api(ae))) if ae.code == 404 => {}
                    Err(write) => {
                        tracing::warn!(object = %key, error = %write, "cannot record the error")
                    }
                }
            }
            Err(e)
        }
    }
}

/// The controllers' error policy: conflicts again at once, everything else with
/// exponential backoff per object.
pub fn error_policy<K: Resource<DynamicType = ()>>(
    obj: Arc<K>,
    error: &ReconcileError,
    ctx: Arc<Context>,
) -> Action {
    if error.is_conflict() {
        return Action::requeue(CONFLICT_RETRY);
    }
    Action::requeue(ctx.next_backoff(&object_key(obj.as_ref())))
}
