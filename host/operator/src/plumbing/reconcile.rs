//! What both controllers share around one reconciliation: timing and metrics, turning
//! an error into `status.error` plus a Warning Event, and the retry policy.

use std::fmt::Debug;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::jiff::Timestamp;
use kube::api::Api;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::{Resource, ResourceExt};
use serde::de::DeserializeOwned;
use tracing::Instrument;

use crate::error::ReconcileError;
use crate::plumbing::conditions::{self, Reported};
use crate::plumbing::context::Context;
use crate::plumbing::patch;

/// Runs `round` every `period` until `shutdown` (a round that overruns delays the next
/// rather than stacking), each one timed as a reconciliation of `controller` and a
/// failed one logged: the loops that look at the whole cluster at once (the free pool,
/// the claims to bind).
pub(crate) async fn every<F, Fut>(
    ctx: &Context,
    controller: &'static str,
    period: Duration,
    shutdown: impl Future<Output = ()>,
    round: F,
) where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<(), ReconcileError>>,
{
    // Never notified: the rounds keep to the period.
    let never = tokio::sync::Notify::new();
    every_or_woken(ctx, controller, period, &never, shutdown, round).await;
}

/// How long a woken loop waits for the rest of a burst of changes before its round.
const WAKE_SETTLE: Duration = Duration::from_millis(100);

/// [`every`], and also soon after `wake` is notified (changes the round acts on, seen by
/// a watch): notifications during a round or its settling coalesce into one more round,
/// so a burst of changes costs a round or two, not one each.
pub(crate) async fn every_or_woken<F, Fut>(
    ctx: &Context,
    controller: &'static str,
    period: Duration,
    wake: &tokio::sync::Notify,
    shutdown: impl Future<Output = ()>,
    round: F,
) where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<(), ReconcileError>>,
{
    rounds(period, wake, shutdown, round, |result, took| {
        let kind = result.as_ref().err().map(ReconcileError::kind);
        ctx.metrics.reconciled(controller, kind, took);
        if let Err(e) = result {
            tracing::warn!(controller, error = %e, "a round failed");
        }
    })
    .await;
}

/// The schedule of [`every_or_woken`]: `round` at once, then each period or soon after
/// a wake, each outcome handed to `done` with its duration.
async fn rounds<F, Fut, T>(
    period: Duration,
    wake: &tokio::sync::Notify,
    shutdown: impl Future<Output = ()>,
    mut round: F,
    mut done: impl FnMut(T, Duration),
) where
    F: FnMut() -> Fut,
    Fut: Future<Output = T>,
{
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            () = wake.notified() => {
                tokio::select! {
                    () = tokio::time::sleep(WAKE_SETTLE) => {}
                    () = &mut shutdown => return,
                }
                tick.reset();
            }
            () = &mut shutdown => return,
        }
        let started = Instant::now();
        let result = round().await;
        done(result, started.elapsed());
    }
}

/// How soon a conflict (the object changed under us) is retried.
const CONFLICT_RETRY: Duration = Duration::from_millis(100);

/// The result of a reconciliation that did not fail: when to look again and what
/// `status.error` should say (empty: nothing wrong).
#[derive(Debug)]
pub(crate) struct Step {
    pub(crate) action: Action,
    pub(crate) error: String,
    /// Not Ready for this reason whatever the state says (see
    /// [`conditions::report_patch`]).
    pub(crate) not_ready: Option<&'static str>,
}

impl Step {
    pub(crate) fn requeue(after: Duration) -> Self {
        Self {
            action: Action::requeue(after),
            error: String::new(),
            not_ready: None,
        }
    }

    /// Nothing to do until the object or something it watches changes.
    pub(crate) fn wait() -> Self {
        Self {
            action: Action::await_change(),
            error: String::new(),
            not_ready: None,
        }
    }

    pub(crate) fn with_error(mut self, error: impl Into<String>) -> Self {
        self.error = error.into();
        self
    }

    pub(crate) fn not_ready(mut self, reason: Option<&'static str>) -> Self {
        self.not_ready = reason;
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

pub(crate) fn object_key<K: Resource<DynamicType = ()>>(obj: &K) -> String {
    format!("{}/{}", K::kind(&()), obj.name_any())
}

/// The span of one reconciliation: every log line inside it carries the controller, the
/// object, its generation and the state the reconciliation started from.
pub(crate) fn reconcile_span<K: Reported>(controller: &'static str, obj: &K) -> tracing::Span {
    tracing::info_span!(
        "reconcile",
        controller = %controller,
        object = %object_key(obj),
        generation = obj.meta().generation.unwrap_or(0),
        state = %obj.state_name(),
    )
}

/// The object to reconcile, or None when it is gone: the controller's cached copy when it
/// shows everything this process's last reconciliation of it wrote
/// ([`Context::is_current`]), else read from the API server. A copy older than that
/// could make a provider call on ids that are no longer the object's (an attach whose
/// stored ids the copy lacks would attach a second device), which is why a first
/// reconciliation (of an object this process did not create), one after a failure and
/// one whose copy lags always read. Reading every time was two of every five API reads
/// of a convergence (docs/BENCHMARKS.md).
///
/// `proven_by_first_write`: a copy it holds for needs no read at its first look here
/// ([`Context::first_look`]): the controller's first act on such an object is a write
/// guarded by the copy's version, which a stale copy makes conflict (and the retry,
/// after a failure, reads). The request controller says so of a request it has never
/// touched (one GET per request before).
pub(crate) async fn current<K>(
    ctx: &Context,
    obj: Arc<K>,
    proven_by_first_write: impl FnOnce(&K) -> bool,
) -> Result<Option<K>, ReconcileError>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug,
{
    let key = object_key(obj.as_ref());
    if ctx.is_current(&key, obj.meta().resource_version.as_deref())
        || (ctx.first_look(&key) && proven_by_first_write(obj.as_ref()))
    {
        return Ok(Some(obj.as_ref().clone()));
    }
    let api: Api<K> = Api::all(ctx.client.clone());
    Ok(api.get_opt(&obj.name_any()).await?)
}

/// Runs one reconciliation of `obj` (read by [`current`]), reports the outcome and maps it to
/// the controller's result: `status.error` and the Ready condition always describe what
/// the reconciliation left.
pub(crate) async fn run<K, F, Fut>(
    controller: &'static str,
    ctx: &Context,
    obj: K,
    reconcile: F,
) -> Result<Action, ReconcileError>
where
    K: Reported + Clone + DeserializeOwned + Debug,
    F: FnOnce(K) -> Fut,
    Fut: Future<Output = Result<(Step, Option<K>), ReconcileError>>,
{
    let span = reconcile_span(controller, &obj);
    run_in_span(controller, ctx, obj, reconcile)
        .instrument(span)
        .await
}

async fn run_in_span<K, F, Fut>(
    controller: &'static str,
    ctx: &Context,
    obj: K,
    reconcile: F,
) -> Result<Action, ReconcileError>
where
    K: Reported + Clone + DeserializeOwned + Debug,
    F: FnOnce(K) -> Fut,
    Fut: Future<Output = Result<(Step, Option<K>), ReconcileError>>,
{
    let started = Instant::now();
    let key = object_key(&obj);
    let reference = obj.object_ref(&());
    let name = obj.name_any();
    let result = reconcile(obj).await;
    let error_kind = result.as_ref().err().map(ReconcileError::kind);
    ctx.metrics
        .reconciled(controller, error_kind, started.elapsed());
    match result {
        Ok((step, latest)) => {
            ctx.succeeded(&key);
            report_success(ctx, &key, &reference, step, latest).await
        }
        Err(e) if e.is_conflict() => {
            tracing::debug!(object = %key, "conflict; retrying");
            ctx.left_unknown(&key);
            Err(e)
        }
        Err(e) => {
            ctx.left_unknown(&key);
            report_failure::<K>(ctx, &key, &reference, &name, &e).await;
            Err(e)
        }
    }
}

/// Writes the Ready condition (and `status.error`) a successful reconciliation implies,
/// with a Warning Event for a new error, and notes the version it left.
async fn report_success<K>(
    ctx: &Context,
    key: &str,
    reference: &ObjectReference,
    step: Step,
    latest: Option<K>,
) -> Result<Action, ReconcileError>
where
    K: Reported + Clone + DeserializeOwned + Debug,
{
    // `latest` is the object as the reconciliation left it (None: deleted).
    let Some(latest) = latest else {
        ctx.left_at(key, None);
        return Ok(step.action);
    };
    let Some(report) =
        conditions::report_patch(&latest, &step.error, step.not_ready, Timestamp::now())
    else {
        ctx.left_at(key, latest.meta().resource_version.as_deref());
        return Ok(step.action);
    };
    if !step.error.is_empty() && latest.status_error() != step.error {
        ctx.event(
            reference,
            EventType::Warning,
            "Unhealthy",
            "Check",
            &step.error,
        )
        .await;
    }
    let api: Api<K> = Api::all(ctx.client.clone());
    match patch::status(&api, &latest, &report, false).await {
        Ok(reported) => ctx.left_at(key, reported.meta().resource_version.as_deref()),
        // Gone while this reconciliation finished: nothing left to report on.
        Err(ReconcileError::Kube(kube::Error::Api(ae))) if ae.code == 404 => {
            ctx.left_at(key, None);
        }
        Err(e) => {
            ctx.left_unknown(key);
            return Err(e);
        }
    }
    Ok(step.action)
}

/// A failed reconciliation: logged, a Warning Event, and the error in `status.error`.
async fn report_failure<K>(
    ctx: &Context,
    key: &str,
    reference: &ObjectReference,
    name: &str,
    e: &ReconcileError,
) where
    K: Reported + Clone + DeserializeOwned + Debug,
{
    let message = e.to_string();
    tracing::warn!(object = %key, error = %message, "reconcile failed");
    ctx.event(
        reference,
        EventType::Warning,
        event_reason(e),
        "Reconcile",
        &message,
    )
    .await;
    // Read again: the failed reconciliation may have changed the state (which the
    // condition's reason names) or cleared an earlier error.
    let api: Api<K> = Api::all(ctx.client.clone());
    if let Err(write) = record_failure(&api, name, &message).await {
        tracing::warn!(object = %key, error = %write, "cannot record the error");
    }
}

/// Writes `message` as `status.error` with the Ready condition it implies; an object
/// already gone is not worth another error.
async fn record_failure<K>(api: &Api<K>, name: &str, message: &str) -> Result<(), ReconcileError>
where
    K: Reported + Clone + DeserializeOwned + Debug,
{
    let Some(fresh) = api.get_opt(name).await? else {
        return Ok(());
    };
    let Some(report) = conditions::report_patch(&fresh, message, None, Timestamp::now()) else {
        return Ok(());
    };
    match patch::status(api, &fresh, &report, false).await {
        Err(ReconcileError::Kube(kube::Error::Api(ae))) if ae.code == 404 => Ok(()),
        other => other.map(|_| ()),
    }
}

/// The controllers' error policy: conflicts again at once, everything else with
/// exponential backoff per object.
pub(crate) fn error_policy<K: Resource<DynamicType = ()>>(
    obj: Arc<K>,
    error: &ReconcileError,
    ctx: Arc<Context>,
) -> Action {
    if error.is_conflict() {
        return Action::requeue(CONFLICT_RETRY);
    }
    Action::requeue(ctx.next_backoff(&object_key(obj.as_ref())))
}

#[cfg(test)]
mod tests {
    use super::*;
    use cro_api::{ComposableResource, ComposableResourceStatus, ResourceState};
    use std::io::Write;
    use std::sync::Mutex;

    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// A woken loop runs soon, a burst of wakes during a round costs one more round, and
    /// without wakes the period holds.
    #[tokio::test(start_paused = true)]
    async fn a_wake_runs_a_round_soon_and_a_burst_coalesces() {
        let wake = Arc::new(tokio::sync::Notify::new());
        let ran = Arc::new(Mutex::new(Vec::<Duration>::new()));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let start = tokio::time::Instant::now();
        let loop_task = {
            let (wake, ran) = (wake.clone(), ran.clone());
            tokio::spawn(async move {
                rounds(
                    Duration::from_secs(3600),
                    &wake,
                    async move {
                        let _ = stopped.await;
                    },
                    || {
                        let ran = ran.clone();
                        async move {
                            ran.lock().unwrap().push(start.elapsed());
                            // A round that takes a while: wakes meanwhile wait for it.
                            tokio::time::sleep(Duration::from_secs(1)).await;
                        }
                    },
                    |(), _| {},
                )
                .await;
            })
        };
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert_eq!(
            ran.lock().unwrap().len(),
            1,
            "the first tick, then the period"
        );
        wake.notify_one();
        tokio::time::sleep(Duration::from_millis(150)).await;
        assert_eq!(
            ran.lock().unwrap().len(),
            2,
            "woken within the settling time"
        );
        for _ in 0..50 {
            wake.notify_one();
        }
        tokio::time::sleep(Duration::from_secs(10)).await;
        let times = ran.lock().unwrap().clone();
        assert_eq!(
            times.len(),
            3,
            "fifty wakes in a round: one more round: {times:?}"
        );
        let _ = stop.send(());
        loop_task.await.unwrap();
    }

    #[test]
    fn log_lines_of_a_reconciliation_carry_object_generation_and_state() {
        let captured = Captured::default();
        let writer = captured.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .finish();
        let details = cro_api::ScalarResourceDetails {
            resource_type: cro_api::ResourceType::Gpu,
            model: "m".into(),
            size: 1,
            force_detach: false,
            allocation_policy: Default::default(),
            target_node: None,
            other_spec: None,
        };
        let mut res = ComposableResource::for_request("req", &details, "n1");
        res.metadata.name = Some("gpu-1".into());
        res.metadata.generation = Some(3);
        res.status = Some(ComposableResourceStatus {
            state: ResourceState::Attaching,
            ..Default::default()
        });
        tracing::subscriber::with_default(subscriber, || {
            let _entered = reconcile_span("composableresource", &res).entered();
            tracing::info!("attach in progress");
        });
        let text = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
        assert!(
            text.contains("reconcile{controller=composableresource object=ComposableResource/gpu-1 generation=3 state=Attaching}"),
            "{text}"
        );
        assert!(text.contains("attach in progress"), "{text}");
    }
}
