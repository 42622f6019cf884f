//! What every reconciliation needs: the API client, the provider, the node command
//! runner, configuration, metrics, the Event recorder, and per-object retry state.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};

use crate::config::OperatorConfig;
use crate::error::ReconcileError;
use crate::metrics::Metrics;
use crate::nodeops::dra::DraApis;
use crate::nodeops::{CommandRunner, GpuOps};
use crate::plumbing::cache::Caches;
use crate::provider::{DeviceProvider, InstrumentedProvider};
use crate::registry::Registry;
use crate::registry::fence::FencedRunner;

pub(crate) struct Context {
    pub(crate) client: kube::Client,
    pub(crate) provider: InstrumentedProvider,
    /// The providers by name: which serves a node, and which this replica holds.
    pub(crate) registry: Arc<Registry>,
    pub(crate) runner: Arc<dyn CommandRunner>,
    pub(crate) gpu: GpuOps,
    pub(crate) config: OperatorConfig,
    pub(crate) metrics: Arc<Metrics>,
    /// The DRA kinds this API server serves; None in device-plugin mode.
    pub(crate) dra: Option<DraApis>,
    /// Watch caches of resources, requests and nodes; filled once `caches.run` runs.
    pub(crate) caches: Caches,
    /// The resource reconciles this replica runs at once, over all the providers it
    /// holds (each provider has a controller of its own, crate::process::shards):
    /// `max_concurrent_reconciles` stays one bound per replica, as with one controller.
    pub(crate) resource_slots: tokio::sync::Semaphore,
    recorder: Recorder,
    failures: Mutex<HashMap<String, u32>>,
    rescans: Mutex<HashMap<String, Instant>>,
    /// The device plugin restarts this process made (at most one per DaemonSet per 10 s).
    pub(crate) plugin_restarts: crate::nodeops::plugins::Restarts,
    /// The ClusterPolicy's driver flag as last read (see `nodeops::driver::discover`).
    pub(crate) cluster_policy: crate::nodeops::driver::ClusterPolicyMemo,
    /// Per object, what its last reconciliation here left (see [`Context::is_current`]
    /// and [`Context::first_look`]).
    left_at: Mutex<HashMap<String, Left>>,
    /// Per request, when progress of its devices was first seen and not yet written (see
    /// `controllers::request::mirror::pace`).
    unwritten_progress: Mutex<ProgressBook>,
    /// Objects (by UID) whose deletion this process asked for, and when: a watch-cache
    /// copy that does not show it yet is not deleted a second time (see
    /// [`Context::delete_once`]).
    deletions_asked: Mutex<HashMap<String, Instant>>,
}

/// Entries of `Context::deletions_asked` past which old ones are dropped: an object whose
/// deletion was asked this long ago shows it in every cache (or is gone).
const DELETIONS_ASKED_ENTRIES: usize = 4096;
const DELETION_SHOWN_WITHIN: Duration = Duration::from_secs(300);

/// What the last reconciliation of an object here left it at.
#[derive(Debug, Clone, Copy)]
enum Left {
    /// This resource version (comparable integers, as `Caches::caught_up` relies on too).
    At(u64),
    /// Not known: the reconciliation failed (what it wrote is unknown) or the version
    /// was not a number.
    Unknown,
}

/// Progress of one key (a request, a resource's wait) waiting to be written.
struct Progress {
    /// When the unwritten progress was first seen (None: nothing waits).
    since: Option<Instant>,
    /// When the key was last asked about (old entries are dropped).
    touched: Instant,
}

/// The progress waiting to be written, by key.
#[derive(Default)]
struct ProgressBook {
    entries: HashMap<String, Progress>,
}

impl ProgressBook {
    /// See [`Context::progress_wait`].
    fn wait(&mut self, key: &str, delay: Duration, now: Instant) -> Option<Duration> {
        // Requests deleted while their progress waited leave an entry behind; far more
        // entries than requests in flight means such leftovers: drop the old ones.
        if self.entries.len() > UNWRITTEN_PROGRESS_ENTRIES {
            let stale = delay.saturating_mul(10);
            self.entries
                .retain(|_, p| now.saturating_duration_since(p.touched) < stale);
        }
        let p = self.entries.entry(key.to_owned()).or_insert(Progress {
            since: None,
            touched: now,
        });
        p.touched = now;
        let since = *p.since.get_or_insert(now);
        let wait = self::pace(since, now, delay);
        if wait.is_none() {
            p.since = None;
        }
        wait
    }

    /// `key` was written with something other than progress.
    fn written(&mut self, key: &str) {
        self.entries.remove(key);
    }
}

/// How many times `timings.mirror_delay` the progress of a request's devices may wait
/// while its state stays (16 s by default).
const REQUEST_PROGRESS: u32 = 8;
/// The same while the request is Cleaning (a minute by default).
const CLEANING_PROGRESS: u32 = 30;

/// Entries of `Context::unwritten_progress` past which stale ones are dropped.
const UNWRITTEN_PROGRESS_ENTRIES: usize = 4096;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Context {
    pub(crate) fn new(
        client: kube::Client,
        registry: Arc<Registry>,
        runner: Arc<dyn CommandRunner>,
        config: OperatorConfig,
        metrics: Arc<Metrics>,
        dra: Option<DraApis>,
    ) -> Self {
        let recorder = Recorder::new(
            client.clone(),
            Reporter {
                controller: config.controller_name.clone(),
                instance: std::env::var("POD_NAME").ok(),
            },
        );
        let slots = usize::from(config.max_concurrent_reconciles.max(1));
        // Every node command passes the provider fence, as every fabric call does.
        let runner: Arc<dyn CommandRunner> = Arc::new(FencedRunner::new(runner, registry.clone()));
        let provider: Arc<dyn DeviceProvider> = registry.clone();
        Self {
            provider: InstrumentedProvider::new(provider, metrics.clone()),
            registry,
            gpu: GpuOps::new(runner.clone()),
            client,
            runner,
            config,
            metrics,
            dra,
            caches: Caches::default(),
            resource_slots: tokio::sync::Semaphore::new(slots),
            recorder,
            failures: Mutex::default(),
            rescans: Mutex::default(),
            plugin_restarts: Default::default(),
            cluster_policy: Default::default(),
            left_at: Mutex::default(),
            unwritten_progress: Mutex::default(),
            deletions_asked: Mutex::default(),
        }
    }

    /// The provider serving `node` now (None: no route yet; the resource is labelled
    /// later, crate::controllers::routing).
    pub(crate) fn provider_of(&self, node: &str) -> Option<String> {
        self.registry.route(node).ok()
    }

    /// How long a write of `key` that only reports progress may still wait: progress is
    /// written together with what follows within `delay` of it being first seen (each
    /// write is a watch event every watch of its kind decodes), or alone once `delay`
    /// has passed. Any other write of the key ([`Context::progress_written`]) takes the
    /// waiting progress with it. `None`: write now.
    pub(crate) fn progress_wait(&self, key: &str, delay: Duration) -> Option<Duration> {
        lock(&self.unwritten_progress).wait(key, delay, Instant::now())
    }

    /// How long progress of a request's devices may wait while the request's state
    /// stays: 8 times `timings.mirror_delay` (docs/behaviour.md, §3). Most requests reach
    /// their next state sooner and write their devices' progress with it.
    pub(crate) fn request_progress_delay(&self) -> Duration {
        self.config
            .timings
            .mirror_delay
            .saturating_mul(REQUEST_PROGRESS)
    }

    /// How long progress of a Cleaning request's devices (detaching, gone) may wait: 30
    /// times `timings.mirror_delay`. Such a request is waited on for its going, which the
    /// finalizer's removal makes as soon as no device is left; an error is written at
    /// once, and the ComposableResources show each device as it is.
    pub(crate) fn cleaning_progress_delay(&self) -> Duration {
        self.config
            .timings
            .mirror_delay
            .saturating_mul(CLEANING_PROGRESS)
    }

    /// Deletes `obj` unless this process asked for its deletion already (its copy may
    /// come from a watch cache that does not show the deletionTimestamp yet: a request
    /// being cleaned is reconciled again at each change of its devices, and sent each
    /// DELETE up to three times, docs/BENCHMARKS.md). A deletion asked is durable, so a
    /// second one adds nothing; an object without a UID is deleted every time.
    pub(crate) async fn delete_once<K>(
        &self,
        api: &kube::Api<K>,
        obj: &K,
    ) -> Result<(), ReconcileError>
    where
        K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    {
        let uid = obj.meta().uid.clone();
        if let Some(uid) = &uid
            && lock(&self.deletions_asked).contains_key(uid)
        {
            return Ok(());
        }
        let name = obj.meta().name.clone().unwrap_or_default();
        crate::plumbing::patch::delete(api, &name).await?;
        if let Some(uid) = uid {
            let mut asked = lock(&self.deletions_asked);
            if asked.len() > DELETIONS_ASKED_ENTRIES {
                asked.retain(|_, at| at.elapsed() < DELETION_SHOWN_WITHIN);
            }
            asked.insert(uid, Instant::now());
        }
        Ok(())
    }

    /// `key` was written: no progress of it is waiting.
    pub(crate) fn progress_written(&self, key: &str) {
        lock(&self.unwritten_progress).written(key);
    }

    /// The delay before retrying `key` after one more consecutive failure: the base delay
    /// doubled per failure, capped.
    pub(crate) fn next_backoff(&self, key: &str) -> Duration {
        let mut failures = lock(&self.failures);
        let n = failures.entry(key.to_owned()).or_insert(0);
        *n = n.saturating_add(1);
        let t = &self.config.timings;
        let factor = 2u32.saturating_pow(n.saturating_sub(1).min(20));
        t.backoff_base.saturating_mul(factor).min(t.backoff_max)
    }

    pub(crate) fn succeeded(&self, key: &str) {
        lock(&self.failures).remove(key);
    }

    /// Whether the node of `key` should be made to rescan now (at most once per rescan
    /// interval, so a slow node is not restarted over and over); records the rescan.
    pub(crate) fn rescan_due(&self, key: &str) -> bool {
        let mut rescans = lock(&self.rescans);
        let due = rescans
            .get(key)
            .is_none_or(|at| at.elapsed() >= self.config.timings.rescan_interval);
        if due {
            rescans.insert(key.to_owned(), Instant::now());
        }
        due
    }

    pub(crate) fn forget_rescan(&self, key: &str) {
        lock(&self.rescans).remove(key);
    }

    /// Records the version a reconciliation of `key` left the object at (None: it is
    /// gone; a failed reconciliation is [`Context::left_unknown`]).
    pub(crate) fn left_at(&self, key: &str, version: Option<&str>) {
        let mut left = lock(&self.left_at);
        match version {
            Some(v) => {
                let at = v.parse::<u64>().map_or(Left::Unknown, Left::At);
                left.insert(key.to_owned(), at);
            }
            None => {
                left.remove(key);
            }
        }
    }

    /// Records that a reconciliation of `key` failed: what it wrote is not known, so the
    /// next one reads the object (neither [`Context::is_current`] nor
    /// [`Context::first_look`] holds until a reconciliation succeeds).
    pub(crate) fn left_unknown(&self, key: &str) {
        lock(&self.left_at).insert(key.to_owned(), Left::Unknown);
    }

    /// Whether a copy of `key` at `version` shows everything the last reconciliation here
    /// wrote to it: there was one, it finished, and the copy is at least that new.
    pub(crate) fn is_current(&self, key: &str, version: Option<&str>) -> bool {
        let Some(v) = version.and_then(|v| v.parse::<u64>().ok()) else {
            return false;
        };
        matches!(lock(&self.left_at).get(key), Some(Left::At(left)) if v >= *left)
    }

    /// Whether `key` has never been reconciled here (or was last seen gone): no
    /// reconciliation of it succeeded or failed since.
    pub(crate) fn first_look(&self, key: &str) -> bool {
        !lock(&self.left_at).contains_key(key)
    }

    /// Publishes an Event; a failure to do so is logged, never fatal.
    pub(crate) async fn event(
        &self,
        regarding: &ObjectReference,
        type_: EventType,
        reason: &str,
        action: &str,
        note: impl Into<String>,
    ) {
        let mut note: String = note.into();
        // The API refuses notes above 1 kB.
        if note.len() > 1000 {
            let mut cut = 1000;
            while !note.is_char_boundary(cut) {
                cut -= 1;
            }
            note.truncate(cut);
        }
        let event = Event {
            type_,
            reason: reason.to_owned(),
            note: Some(note),
            action: action.to_owned(),
            secondary: None,
        };
        if let Err(e) = self.recorder.publish(&event, regarding).await {
            tracing::warn!(object = regarding.name.as_deref().unwrap_or("?"), reason, error = %crate::text::kube_error(&e), "cannot publish event");
        }
    }
}

/// When progress first seen unwritten at `since` is written, seen again at `now`: at
/// once when `delay` has passed since (`None`), else after what is left of it.
fn pace(since: Instant, now: Instant, delay: Duration) -> Option<Duration> {
    let due = since + delay;
    (now < due).then(|| due - now)
}

#[cfg(test)]
mod tests {
    #[test]
    fn progress_is_written_when_the_delay_since_it_was_first_seen_passes() {
        use super::pace;
        use std::time::{Duration, Instant};
        let t0 = Instant::now();
        let d = Duration::from_secs(2);
        assert_eq!(pace(t0, t0, d), Some(d));
        assert_eq!(
            pace(t0, t0 + Duration::from_millis(1500), d),
            Some(Duration::from_millis(500))
        );
        assert_eq!(pace(t0, t0 + d, d), None);
        assert_eq!(pace(t0, t0 + Duration::from_secs(9), d), None);
    }

    #[test]
    fn progress_waits_its_delay_from_when_it_is_first_seen_each_key_on_its_own() {
        use super::ProgressBook;
        use std::time::{Duration, Instant};
        let s = Duration::from_secs;
        let d = s(16);
        let mut book = ProgressBook::default();
        let t0 = Instant::now();
        // Progress waits 16 s from when it is first seen, then is written alone.
        assert_eq!(book.wait("r", d, t0), Some(s(16)));
        assert_eq!(book.wait("r", d, t0 + s(1)), Some(s(15)));
        assert_eq!(book.wait("r", d, t0 + s(16)), None);
        // More progress waits 16 s from when it is seen.
        assert_eq!(book.wait("r", d, t0 + s(17)), Some(s(16)));
        assert_eq!(book.wait("r", d, t0 + s(32)), Some(s(1)));
        // Another key is paced on its own.
        assert_eq!(book.wait("q", s(2), t0 + s(20)), Some(s(2)));
        assert_eq!(book.wait("q", s(2), t0 + s(22)), None);
        // A state written takes the progress with it: the next waits from when it comes.
        book.written("r");
        assert_eq!(book.wait("r", d, t0 + s(40)), Some(s(16)));
    }

    use super::*;
    use crate::config::ProviderSource;
    use crate::nodeops::{ExecOutput, NodeOpsError, PodRef};
    use crate::provider::ProviderResult;
    use cro_runtime::domain::{self, AddOutcome, AddRequest, Claim, DeviceInfo, RemoveOutcome};
    use futures::future::BoxFuture;

    struct Nothing;

    impl DeviceProvider for Nothing {
        fn add<'a>(&'a self, _: &'a AddRequest) -> BoxFuture<'a, ProviderResult<AddOutcome>> {
            Box::pin(async { Ok(AddOutcome::InProgress("never".into())) })
        }
        fn remove<'a>(
            &'a self,
            _: &'a domain::ComposableResource,
        ) -> BoxFuture<'a, ProviderResult<RemoveOutcome>> {
            Box::pin(async { Ok(RemoveOutcome::Removed) })
        }
        fn check<'a>(
            &'a self,
            _: &'a domain::ComposableResource,
        ) -> BoxFuture<'a, ProviderResult<()>> {
            Box::pin(async { Ok(()) })
        }
        fn list<'a>(&'a self, _: &'a [Claim]) -> BoxFuture<'a, ProviderResult<Vec<DeviceInfo>>> {
            Box::pin(async { Ok(Vec::new()) })
        }
        fn pool<'a>(
            &'a self,
            _: &'a cro_runtime::PoolQuery,
        ) -> BoxFuture<'a, ProviderResult<cro_runtime::PoolOutcome>> {
            Box::pin(async {
                Ok(cro_runtime::PoolOutcome::NotSupported(
                    "a test double".into(),
                ))
            })
        }
        fn counters(&self) -> Option<crate::provider::ProviderCounters> {
            None
        }
    }

    impl CommandRunner for Nothing {
        fn run<'a>(
            &'a self,
            _: &'a PodRef,
            _: &'a [String],
        ) -> BoxFuture<'a, Result<ExecOutput, NodeOpsError>> {
            Box::pin(async { Ok(ExecOutput::default()) })
        }
    }

    fn context() -> Context {
        // The client never connects in these tests.
        let config = kube::Config::new("http://127.0.0.1:9".parse().unwrap());
        let client = kube::Client::try_from(config).unwrap();
        let mut c = OperatorConfig::new(ProviderSource::GoEnvironment);
        c.timings.backoff_base = Duration::from_millis(100);
        c.timings.backoff_max = Duration::from_secs(1);
        c.timings.rescan_interval = Duration::from_secs(3600);
        Context::new(
            client,
            Registry::single_in("default", Arc::new(Nothing), Default::default()),
            Arc::new(Nothing),
            c,
            Arc::new(Metrics::new()),
            None,
        )
    }

    #[tokio::test]
    async fn backoff_doubles_per_failure_is_capped_and_resets() {
        let ctx = context();
        let delays: Vec<u128> = (0..6).map(|_| ctx.next_backoff("a").as_millis()).collect();
        assert_eq!(delays, vec![100, 200, 400, 800, 1000, 1000]);
        assert_eq!(ctx.next_backoff("b").as_millis(), 100);
        ctx.succeeded("a");
        assert_eq!(ctx.next_backoff("a").as_millis(), 100);
    }

    #[tokio::test]
    async fn a_copy_is_current_only_when_as_new_as_the_last_reconciliation_left_it() {
        let ctx = context();
        // Never reconciled here: read it (unless the controller knows a first look is safe).
        assert!(!ctx.is_current("r/a", Some("7")));
        assert!(ctx.first_look("r/a"));
        ctx.left_at("r/a", Some("7"));
        assert!(ctx.is_current("r/a", Some("7")));
        assert!(ctx.is_current("r/a", Some("9")));
        assert!(!ctx.is_current("r/a", Some("6")));
        assert!(!ctx.is_current("r/a", None));
        assert!(!ctx.is_current("r/a", Some("not a number")));
        assert!(!ctx.first_look("r/a"));
        // A failed reconciliation: read it again, and not as a first look.
        ctx.left_unknown("r/a");
        assert!(!ctx.is_current("r/a", Some("9")));
        assert!(!ctx.first_look("r/a"));
        ctx.left_at("r/a", Some("10"));
        assert!(ctx.is_current("r/a", Some("10")));
        // A deleted object forgets: a new one of the same name is a first look.
        ctx.left_at("r/a", None);
        assert!(!ctx.is_current("r/a", Some("11")));
        assert!(ctx.first_look("r/a"));
        // A version that is not a number is not current, nor a first look.
        ctx.left_at("r/a", Some("x"));
        assert!(!ctx.is_current("r/a", Some("11")));
        assert!(!ctx.first_look("r/a"));
    }

    #[tokio::test]
    async fn rescans_are_rate_limited_per_resource() {
        let ctx = context();
        assert!(ctx.rescan_due("gpu-1"));
        assert!(!ctx.rescan_due("gpu-1"));
        assert!(ctx.rescan_due("gpu-2"));
        ctx.forget_rescan("gpu-1");
        assert!(ctx.rescan_due("gpu-1"));
    }
}
