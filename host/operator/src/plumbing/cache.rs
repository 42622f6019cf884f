//! Watch caches of the objects reconciliations look across: every ComposableResource,
//! ComposabilityRequest and Node, the GPU operator's driver pods, and the DaemonSets of the
//! GPU operator's namespace, kept current by one watch each.
//!
//! Without them a reconciliation listed every object of a kind (the holder check of a
//! detach, the planning of a request) or asked the API server to filter all of them (a
//! request's resources by label), so the work of N reconciliations grew as N² (see
//! docs/BENCHMARKS.md). A cache is stale by the latency of its watch; each reader says
//! how it copes with that (see [`Caches::caught_up`]).
//!
//! The caches fill only once [`Caches::run`] drives them; until their first listing is
//! complete every reader falls back to asking the API server, so a `Context` built without
//! running them (unit tests, tools) behaves as before.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cro_api::{ComposabilityRequest, ComposableResource};
use futures::{FutureExt, StreamExt};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, ListParams};
use kube::runtime::reflector::{self, Store, store::Writer};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Resource, ResourceExt};

use crate::nodeops::driver::DRIVER_POD_LABEL;
use crate::plumbing::triggers::Relisting;

/// How long a reader waits for the resource cache to catch up with the API server before
/// it asks the API server instead (see [`Caches::caught_up`]).
const CATCH_UP: Duration = Duration::from_secs(5);

/// Names of cached ComposableResources by what reconciliations look them up by: the
/// request that manages them, their target node, and the device ids they hold (their
/// status, or the ready-to-detach label of a resource made to release an orphan). Kept by
/// the resource watch right after it updates the store, so a lookup costs the few
/// resources it finds instead of a scan of every resource in the cluster (each request
/// reconcile and each attach scanned them all: N² at scale, docs/BENCHMARKS.md).
#[derive(Default)]
struct ResourceIndex {
    keys: HashMap<String, Keys>,
    by_request: HashMap<String, HashSet<String>>,
    by_node: HashMap<String, HashSet<String>>,
    by_device: HashMap<String, HashSet<String>>,
    /// The listing under way (a relisting replaces what the index holds).
    listing: Relisting,
    /// Names whose deletion the watch showed, by the deletion's version. A request's
    /// status names its deleted devices until it is next written (up to a minute while
    /// Cleaning), and each of its reconciliations read every such name from the API
    /// server: 3.5 GETs per device down at N = 100 (docs/BENCHMARKS.md).
    gone: Marks,
    /// Names this process created, by the creation's version, until the watch shows them.
    created: Marks,
}

/// How long a mark (a deletion seen, a creation made) is kept at most once there are
/// more than [`MARKS_KEPT`]: a reader that finds none asks the API server, as before.
const MARK_KEPT_FOR: Duration = Duration::from_secs(600);
const MARKS_KEPT: usize = 4096;
/// Beyond this many (deletions faster than the API server could serve them), every mark
/// is dropped: the memory stays bounded, the readers ask the API server.
const MARKS_MAX: usize = 65_536;

/// Resource versions of names, with when they were noted (for the bound).
#[derive(Default)]
struct Marks {
    by_name: HashMap<String, (u64, Instant)>,
    /// The size at which old marks are dropped next: twice what was left the last time,
    /// so that dropping costs O(1) per mark however many are young.
    prune_at: usize,
}

impl Marks {
    fn note(&mut self, name: &str, version: u64) {
        if self.by_name.len() >= self.prune_at.max(MARKS_KEPT) {
            self.by_name
                .retain(|_, (_, at)| at.elapsed() < MARK_KEPT_FOR);
            if self.by_name.len() >= MARKS_MAX {
                self.by_name.clear();
            }
            self.prune_at = 2 * self.by_name.len();
        }
        self.by_name
            .insert(name.to_owned(), (version, Instant::now()));
    }

    fn version(&self, name: &str) -> Option<u64> {
        self.by_name.get(name).map(|(v, _)| *v)
    }

    fn forget(&mut self, name: &str) {
        self.by_name.remove(name);
    }
}

/// What the cache can say of a resource name it does not hold (see [`Caches::unseen`]).
pub(crate) enum Unseen {
    /// Created by this process: the cache shows it now.
    Shown(Arc<ComposableResource>),
    /// The cache saw it deleted (and no creation of this process since).
    Gone,
    /// Nothing known: only the API server can say.
    Unknown,
}

/// What one resource is indexed under.
#[derive(Default, PartialEq, Eq)]
struct Keys {
    request: Option<String>,
    node: String,
    devices: Vec<String>,
}

impl Keys {
    fn of(r: &ComposableResource) -> Keys {
        let mut devices: Vec<String> = r.device_id().map(str::to_owned).into_iter().collect();
        if let Some(o) = r.ready_to_detach()
            && !devices.contains(&o.device_id)
        {
            devices.push(o.device_id);
        }
        Keys {
            request: r.managed_by().map(str::to_owned),
            node: r.spec.target_node.clone(),
            devices,
        }
    }
}

fn unlink(map: &mut HashMap<String, HashSet<String>>, key: &str, name: &str) {
    if let Some(names) = map.get_mut(key) {
        names.remove(name);
        if names.is_empty() {
            map.remove(key);
        }
    }
}

fn link(map: &mut HashMap<String, HashSet<String>>, key: &str, name: &str) {
    map.entry(key.to_owned())
        .or_default()
        .insert(name.to_owned());
}

impl ResourceIndex {
    fn remove(&mut self, name: &str) {
        if let Some(old) = self.keys.remove(name) {
            if let Some(r) = &old.request {
                unlink(&mut self.by_request, r, name);
            }
            unlink(&mut self.by_node, &old.node, name);
            for d in &old.devices {
                unlink(&mut self.by_device, d, name);
            }
        }
    }

    fn apply(&mut self, r: &ComposableResource) {
        let name = r.name_any();
        let keys = Keys::of(r);
        if self.keys.get(&name) == Some(&keys) {
            return;
        }
        self.remove(&name);
        if let Some(req) = &keys.request {
            link(&mut self.by_request, req, &name);
        }
        link(&mut self.by_node, &keys.node, &name);
        for d in &keys.devices {
            link(&mut self.by_device, d, &name);
        }
        self.keys.insert(name, keys);
    }

    fn on(&mut self, event: &watcher::Event<ComposableResource>) {
        match event {
            watcher::Event::Apply(r) => {
                self.shown(r);
                self.apply(r);
            }
            watcher::Event::Delete(r) => {
                let name = r.name_any();
                self.gone.note(&name, version_of(r).unwrap_or(0));
                self.remove(&name);
            }
            watcher::Event::Init => self.listing.start(),
            watcher::Event::InitApply(r) => {
                self.listing.saw(r.name_any());
                self.shown(r);
                self.apply(r);
            }
            watcher::Event::InitDone => {
                for name in self.listing.done(self.keys.keys()) {
                    self.remove(&name);
                }
            }
        }
    }

    /// `r` exists: neither gone nor waiting to be shown (once shown at its creation's
    /// version or later).
    fn shown(&mut self, r: &ComposableResource) {
        let name = r.name_any();
        self.gone.forget(&name);
        if self
            .created
            .version(&name)
            .is_some_and(|c| version_of(r).is_some_and(|v| v >= c))
        {
            self.created.forget(&name);
        }
    }

    fn names(map: &HashMap<String, HashSet<String>>, key: &str) -> Vec<String> {
        map.get(key)
            .map(|names| names.iter().cloned().collect())
            .unwrap_or_default()
    }
}

struct Writers {
    resources: Writer<ComposableResource>,
    requests: Writer<ComposabilityRequest>,
    nodes: Writer<Node>,
    driver_pods: Writer<Pod>,
    daemon_sets: Writer<DaemonSet>,
}

pub(crate) struct Caches {
    resources: Store<ComposableResource>,
    requests: Store<ComposabilityRequest>,
    nodes: Store<Node>,
    /// The GPU operator's driver pods (by their label), read by every GPU attach and
    /// detach to find the node's driver.
    driver_pods: Store<Pod>,
    /// The DaemonSets of the GPU operator's namespace (its device plugin and DCGM), read
    /// by every GPU attach and detach in device-plugin mode: two GETs each before.
    daemon_sets: Store<DaemonSet>,
    /// The newest resource version among the ComposableResource changes the cache holds.
    resources_seen: Arc<AtomicU64>,
    /// The newest resource version of device ids this process wrote.
    ids_written: AtomicU64,
    /// The newest ComposableResource version a controller's trigger has seen.
    triggered: AtomicU64,
    /// The newest driver pod version the pod cache holds, and the newest one a
    /// controller's trigger (its own watch) has seen.
    driver_pods_seen: Arc<AtomicU64>,
    driver_pods_triggered: AtomicU64,
    index: Arc<Mutex<ResourceIndex>>,
    /// Notified when a resource made for a ResourceClaim changes (the binding
    /// controller's next round: Online means a condition to set).
    claim_resources_changed: Arc<tokio::sync::Notify>,
    /// Notified when a resource without a provider label is seen (the routing loop's
    /// next round labels it).
    unrouted_seen: Arc<tokio::sync::Notify>,
    writers: Mutex<Option<Writers>>,
}

impl Default for Caches {
    fn default() -> Self {
        let (resources, rw) = reflector::store();
        let (requests, qw) = reflector::store();
        let (nodes, nw) = reflector::store();
        let (driver_pods, dw) = reflector::store();
        let (daemon_sets, sw) = reflector::store();
        Self {
            resources,
            requests,
            nodes,
            driver_pods,
            daemon_sets,
            resources_seen: Arc::default(),
            ids_written: AtomicU64::new(0),
            triggered: AtomicU64::new(0),
            driver_pods_seen: Arc::default(),
            driver_pods_triggered: AtomicU64::new(0),
            index: Arc::default(),
            claim_resources_changed: Arc::default(),
            unrouted_seen: Arc::default(),
            writers: Mutex::new(Some(Writers {
                resources: rw,
                requests: qw,
                nodes: nw,
                driver_pods: dw,
                daemon_sets: sw,
            })),
        }
    }
}

fn version_of<K: Resource>(obj: &K) -> Option<u64> {
    obj.meta().resource_version.as_deref()?.parse().ok()
}

/// Feeds `writer` from a watch of every `K` until the watch stream ends.
async fn reflect<K>(
    api: Api<K>,
    config: watcher::Config,
    writer: Writer<K>,
    seen: Option<Arc<AtomicU64>>,
    mut also: impl FnMut(&watcher::Event<K>) + Send,
) where
    K: Resource<DynamicType = ()> + Clone + std::fmt::Debug + serde::de::DeserializeOwned,
    K: Send + Sync + 'static,
{
    // Objects of a relisting become visible all at once when it completes: their
    // versions count as seen only then.
    let mut pending = 0u64;
    watcher(api, config)
        .default_backoff()
        // Nothing here reads who wrote which field: managedFields are a large part of
        // every object the API server sends, and the caches hold every object.
        .modify(|o| o.meta_mut().managed_fields = None)
        .reflect(writer)
        .for_each(|event| {
            // What else is kept from the event (the resource index) is updated before the
            // version counts as seen: a reader that waited for the version finds it there.
            match &event {
                Ok(event) => also(event),
                Err(e) => {
                    tracing::debug!(kind = %K::kind(&()), error = %e, "cache watch interrupted")
                }
            }
            if let (Ok(event), Some(seen)) = (&event, &seen) {
                match event {
                    watcher::Event::Apply(o) | watcher::Event::Delete(o) => {
                        seen.fetch_max(version_of(o).unwrap_or(0), Ordering::SeqCst);
                    }
                    watcher::Event::Init => pending = 0,
                    watcher::Event::InitApply(o) => {
                        pending = pending.max(version_of(o).unwrap_or(0))
                    }
                    watcher::Event::InitDone => {
                        seen.fetch_max(pending, Ordering::SeqCst);
                    }
                }
            }
            futures::future::ready(())
        })
        .await;
}

/// Whether the operator's role lets it list the GPU operator's DaemonSets: the chart
/// grants it only with `gpuOperator.rbac`, and a role made for an earlier cro grants
/// `get` alone. Asked once, so that a role without it means reading them at each GPU
/// change (said once here) rather than a watch retrying and logging refusals.
async fn may_list(api: &Api<DaemonSet>) -> bool {
    match api.list(&ListParams::default().limit(1)).await {
        Err(kube::Error::Api(s)) if s.code == 403 => {
            tracing::info!(
                "not allowed to list the GPU operator's DaemonSets: reading them at each GPU change instead"
            );
            false
        }
        _ => true,
    }
}

/// The watch of the GPU operator's driver pods: by the label the driver lookup uses, so
/// the cache holds a few pods per GPU node, not every pod of the cluster.
pub(crate) fn driver_pods() -> watcher::Config {
    watcher::Config::default().labels(DRIVER_POD_LABEL)
}

/// The node a pod is scheduled to.
pub(crate) fn pod_node(pod: &Pod) -> Option<&str> {
    pod.spec.as_ref()?.node_name.as_deref()
}

impl Caches {
    /// Keeps the caches current; runs until dropped. Only the first call does anything.
    /// `daemon_sets`: the namespace whose DaemonSets are watched (the GPU operator's, in
    /// device-plugin mode; None: not watched, and that cache never answers).
    pub(crate) fn run(
        &self,
        client: kube::Client,
        daemon_sets: Option<&str>,
    ) -> futures::future::BoxFuture<'static, ()> {
        let writers = self
            .writers
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        let Some(w) = writers else {
            return futures::future::ready(()).boxed();
        };
        let seen = self.resources_seen.clone();
        let pods_seen = self.driver_pods_seen.clone();
        let index = self.index.clone();
        let claim_resources_changed = self.claim_resources_changed.clone();
        let unrouted_seen = self.unrouted_seen.clone();
        let daemon_sets: Option<Api<DaemonSet>> =
            daemon_sets.map(|ns| Api::namespaced(client.clone(), ns));
        let indexed = move |e: &watcher::Event<ComposableResource>| {
            if let watcher::Event::Apply(o) | watcher::Event::Delete(o) = e
                && o.labels().contains_key(cro_api::LABEL_CLAIM_UID)
            {
                claim_resources_changed.notify_one();
            }
            if let watcher::Event::Apply(o) | watcher::Event::InitApply(o) = e
                && !o.labels().contains_key(cro_api::LABEL_PROVIDER)
            {
                unrouted_seen.notify_one();
            }
            index
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .on(e)
        };
        async move {
            let all = watcher::Config::default;
            futures::join!(
                reflect(
                    Api::all(client.clone()),
                    all(),
                    w.resources,
                    Some(seen),
                    indexed
                ),
                reflect(Api::all(client.clone()), all(), w.requests, None, |_| {}),
                reflect(Api::all(client.clone()), all(), w.nodes, None, |_| {}),
                reflect(
                    Api::all(client),
                    driver_pods(),
                    w.driver_pods,
                    Some(pods_seen),
                    |_| {}
                ),
                async move {
                    if let Some(api) = daemon_sets
                        && may_list(&api).await
                    {
                        reflect(api, all(), w.daemon_sets, None, |_| {}).await;
                    }
                },
            );
        }
        .boxed()
    }

    fn ready<K: Resource<DynamicType = ()> + Clone>(store: &Store<K>) -> bool {
        matches!(store.wait_until_ready().now_or_never(), Some(Ok(())))
    }

    /// Notified on every change of a resource made for a ResourceClaim (one permit kept:
    /// changes while nobody waits wake the next wait once).
    pub(crate) fn claim_resource_changes(&self) -> Arc<tokio::sync::Notify> {
        self.claim_resources_changed.clone()
    }

    /// Notified when a resource without a provider label is seen (one permit kept).
    pub(crate) fn unrouted_resources(&self) -> Arc<tokio::sync::Notify> {
        self.unrouted_seen.clone()
    }

    /// The cached ComposableResources (None until the cache has listed them once).
    pub(crate) fn resources(&self) -> Option<Vec<Arc<ComposableResource>>> {
        Self::ready(&self.resources).then(|| self.resources.state())
    }

    /// The cached resources the index names under `names`' key (those the store no
    /// longer holds are left out).
    fn indexed(
        &self,
        names: impl FnOnce(&ResourceIndex) -> Vec<String>,
    ) -> Option<Vec<Arc<ComposableResource>>> {
        if !Self::ready(&self.resources) {
            return None;
        }
        let names = names(
            &self
                .index
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        );
        Some(
            names
                .iter()
                .filter_map(|n| self.resources.get(&reflector::ObjectRef::new(n)))
                .collect(),
        )
    }

    /// The cached resources a request manages (None until the cache has listed them).
    pub(crate) fn resources_of_request(
        &self,
        request: &str,
    ) -> Option<Vec<Arc<ComposableResource>>> {
        self.indexed(|i| ResourceIndex::names(&i.by_request, request))
    }

    /// The cached resources whose target is `node` (None until the cache has listed them).
    pub(crate) fn resources_on_node(&self, node: &str) -> Option<Vec<Arc<ComposableResource>>> {
        self.indexed(|i| ResourceIndex::names(&i.by_node, node))
    }

    /// The cached resources holding device `id` (None until the cache has listed them).
    pub(crate) fn resources_holding(&self, id: &str) -> Option<Vec<Arc<ComposableResource>>> {
        self.indexed(|i| ResourceIndex::names(&i.by_device, id))
    }

    /// The cached ComposabilityRequests (None until the cache has listed them once).
    pub(crate) fn requests(&self) -> Option<Vec<Arc<ComposabilityRequest>>> {
        Self::ready(&self.requests).then(|| self.requests.state())
    }

    /// The cached ComposabilityRequest named `name` (None when the cache does not show
    /// it, or has not listed requests yet).
    pub(crate) fn request(&self, name: &str) -> Option<Arc<ComposabilityRequest>> {
        self.requests.get(&reflector::ObjectRef::new(name))
    }

    /// The Node cache itself, for a reader that looks nodes up by name (the provider
    /// registry's routing by node labels).
    pub(crate) fn node_store(&self) -> Store<Node> {
        self.nodes.clone()
    }

    /// The ComposableResource cache itself, for the provider registry's routing of a
    /// call on a resource by the provider label it carries.
    pub(crate) fn resource_store(&self) -> Store<ComposableResource> {
        self.resources.clone()
    }

    /// The cached Nodes (None until the cache has listed them once).
    pub(crate) fn nodes(&self) -> Option<Vec<Arc<Node>>> {
        Self::ready(&self.nodes).then(|| self.nodes.state())
    }

    /// The driver pods on `node` as the cache shows them (None until it has listed them
    /// once). The cache may lag: a reader that finds no Ready pod here asks the API
    /// server before it decides to wait (see `nodeops::driver::discover`).
    pub(crate) fn driver_pods_on(&self, node: &str) -> Option<Vec<Pod>> {
        Self::ready(&self.driver_pods).then(|| {
            self.driver_pods
                .state()
                .iter()
                .filter(|p| pod_node(p) == Some(node))
                .map(|p| p.as_ref().clone())
                .collect()
        })
    }

    /// The driver pods on `node` as the cache shows them, once it holds every driver pod
    /// change a controller's trigger has seen ([`Caches::note_driver_pod_triggered`]):
    /// an attach woken by its node's driver pod turning Ready finds it Ready here. None
    /// until the cache has listed once, or while it lags more than [`CATCH_UP`].
    pub(crate) async fn driver_pods_current(&self, node: &str) -> Option<Vec<Pod>> {
        if !Self::ready(&self.driver_pods) {
            return None;
        }
        let target = self.driver_pods_triggered.load(Ordering::SeqCst);
        if !Self::reached(&self.driver_pods_seen, target).await {
            // A change the cache will never show (a pod deleted while its watch was being
            // relisted) is not waited for again by every later attach; this one reads the
            // API server. A newer trigger meanwhile stays.
            let now = self.driver_pods_seen.load(Ordering::SeqCst);
            let _ = self.driver_pods_triggered.compare_exchange(
                target,
                now,
                Ordering::SeqCst,
                Ordering::SeqCst,
            );
            return None;
        }
        self.driver_pods_on(node)
    }

    /// Records the version of a driver pod change a controller's trigger has seen, so
    /// that [`Caches::driver_pods_current`] waits for it.
    pub(crate) fn note_driver_pod_triggered(&self, pod: &Pod) {
        if let Some(v) = version_of(pod) {
            self.driver_pods_triggered.fetch_max(v, Ordering::SeqCst);
        }
    }

    /// The DaemonSet `name` of the GPU operator's namespace as the cache shows it: `None`
    /// until the cache has listed once (or when the role does not allow the watch),
    /// `Some(None)` when it shows no such DaemonSet. The cache may lag by its watch: a
    /// restart this process made a moment ago may not show yet (see
    /// `nodeops::plugins::Restarts`).
    pub(crate) fn daemon_set(&self, name: &str) -> Option<Option<Arc<DaemonSet>>> {
        // The store holds the few DaemonSets of one namespace.
        Self::ready(&self.daemon_sets).then(|| {
            self.daemon_sets
                .state()
                .into_iter()
                .find(|d| d.metadata.name.as_deref() == Some(name))
        })
    }

    /// Records a ComposableResource this process just created: until the cache shows it,
    /// [`Caches::unseen`] waits for it rather than calling it unknown.
    pub(crate) fn note_created(&self, obj: &ComposableResource) {
        if let Some(v) = version_of(obj) {
            self.lock_index().created.note(&obj.name_any(), v);
        }
    }

    /// What the cache can say of resource `name` that it did not hold when the caller
    /// looked: created by this process (then it waits, at most [`CATCH_UP`], for the
    /// cache to show the creation), or deleted as its watch saw, or shown since the
    /// caller looked, or nothing. A creation of this process newer than a deletion seen
    /// is a resource made again under the same name.
    pub(crate) async fn unseen(&self, name: &str) -> Unseen {
        let created = {
            let index = self.lock_index();
            let gone = index.gone.version(name);
            match index.created.version(name) {
                Some(c) if gone.is_none_or(|g| g < c) => Some(c),
                _ if gone.is_some() => return Unseen::Gone,
                _ => None,
            }
        };
        // No mark: never created here, or shown since the caller looked (a creation's
        // mark goes once the cache shows it). Taken as unknown, a resource this process
        // created a moment ago was created again (refused as already made: a few per
        // hundred devices in docs/BENCHMARKS.md).
        let Some(created) = created else {
            return match self.resources.get(&reflector::ObjectRef::new(name)) {
                Some(r) => Unseen::Shown(r),
                None => Unseen::Unknown,
            };
        };
        if !self.seen(created).await {
            return Unseen::Unknown;
        }
        if let Some(r) = self.resources.get(&reflector::ObjectRef::new(name)) {
            return Unseen::Shown(r);
        }
        if self
            .lock_index()
            .gone
            .version(name)
            .is_some_and(|g| g >= created)
        {
            return Unseen::Gone;
        }
        Unseen::Unknown
    }

    /// Whether the cache's watch saw resource `copy` deleted at or after the copy's
    /// version, with no creation of this process under its name since: whatever the copy
    /// shows, that resource is gone.
    pub(crate) fn deleted_after(&self, copy: &ComposableResource) -> bool {
        let Some(v) = version_of(copy) else {
            return false;
        };
        let name = copy.name_any();
        let index = self.lock_index();
        index
            .gone
            .version(&name)
            .is_some_and(|g| g >= v && index.created.version(&name).is_none_or(|c| c < g))
    }

    fn lock_index(&self) -> std::sync::MutexGuard<'_, ResourceIndex> {
        self.index
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Records a ComposableResource this process just wrote device ids into, so that
    /// [`Caches::caught_up`] waits for the cache to show it. Attaches call it while they
    /// still hold their node's lock.
    pub(crate) fn note_ids_written(&self, obj: &ComposableResource) {
        if let Some(v) = version_of(obj) {
            self.ids_written.fetch_max(v, Ordering::SeqCst);
        }
    }

    /// Waits until the resource cache shows every ComposableResource change up to
    /// `version` (a version the caller read) and every device id this process wrote
    /// (see [`Caches::note_ids_written`]); resource versions are comparable integers
    /// (Kubernetes 1.35). Both are writes already made, so their watch events are on the
    /// way: this normally returns within milliseconds. False when the cache has not
    /// listed yet, a version is not an integer, or the watch lags more than
    /// [`CATCH_UP`]: the caller then asks the API server itself.
    pub(crate) async fn caught_up(&self, version: Option<&str>) -> bool {
        if !Self::ready(&self.resources) {
            return false;
        }
        let Some(version) = version.and_then(|v| v.parse::<u64>().ok()) else {
            return false;
        };
        let target = version.max(self.ids_written.load(Ordering::SeqCst));
        self.seen(target).await
    }

    /// Records the version of a ComposableResource change another watch (a controller's
    /// trigger) has seen, so that [`Caches::caught_up_with_triggers`] waits for it.
    pub(crate) fn note_triggered(&self, obj: &ComposableResource) {
        if let Some(v) = version_of(obj) {
            self.triggered.fetch_max(v, Ordering::SeqCst);
        }
    }

    /// Waits until the resource cache shows every ComposableResource change a trigger
    /// has seen ([`Caches::note_triggered`]). A request woken by its resource's last
    /// change (its deletion, say) that read this cache before the cache's own watch had
    /// that change would see the resource as it was, and nothing would wake it again.
    /// False as [`Caches::caught_up`] is.
    pub(crate) async fn caught_up_with_triggers(&self) -> bool {
        if !Self::ready(&self.resources) {
            return false;
        }
        self.seen(self.triggered.load(Ordering::SeqCst)).await
    }

    /// Waits (at most [`CATCH_UP`]) until the resource cache has seen version `target`.
    async fn seen(&self, target: u64) -> bool {
        Self::reached(&self.resources_seen, target).await
    }

    /// Waits (at most [`CATCH_UP`]) until a cache's `seen` version is `target` or newer.
    async fn reached(seen: &AtomicU64, target: u64) -> bool {
        let deadline = Instant::now() + CATCH_UP;
        loop {
            if seen.load(Ordering::SeqCst) >= target {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
    /// The ComposableResources on `me`'s target node, as claims for a provider: a device
    /// on the node's machine can only be held by a resource on that node, which is all a
    /// provider tells its own device from another's by (see the contract's `claims`).
    /// From the cache once it has [`Caches::caught_up`] with `me` (so it holds every
    /// device id this process stored, under the node lock the caller holds), else listed
    /// from the API server. Read on every attach: every resource of the cluster each time
    /// (as copies, even) made attaching N devices cost N² in time and memory.
    pub(crate) async fn node_resources(
        &self,
        client: &kube::Client,
        me: &ComposableResource,
    ) -> Result<Vec<Arc<ComposableResource>>, kube::Error> {
        let node = &me.spec.target_node;
        if self
            .caught_up(me.metadata.resource_version.as_deref())
            .await
            && let Some(cached) = self.resources_on_node(node)
        {
            return Ok(cached);
        }
        let api: Api<ComposableResource> = Api::all(client.clone());
        Ok(api
            .list(&ListParams::default())
            .await?
            .items
            .into_iter()
            .filter(|r| &r.spec.target_node == node)
            .map(Arc::new)
            .collect())
    }

    /// Whether the Node cache shows `name` (false also when it has not listed yet). A
    /// Node it shows may have been deleted a moment ago; one it does not show may have
    /// been created a moment ago: see `resource::node_exists` for how each is used.
    pub(crate) fn shows_node(&self, name: &str) -> bool {
        self.node(name).is_some()
    }

    /// The cached Node `name`, if the cache has listed and shows it.
    pub(crate) fn node(&self, name: &str) -> Option<Arc<Node>> {
        Self::ready(&self.nodes)
            .then(|| self.nodes.get(&reflector::ObjectRef::new(name)))
            .flatten()
    }

    /// A ComposableResource other than `me` holding device `id` (by its status, or by
    /// the ready-to-detach label when `labels` is set), if any. A wrong "none" could give
    /// one device to two resources or detach a device another holds, so the cache answers
    /// only once [`Caches::caught_up`] with `me` (the resource asking, as last read or
    /// written), and each resource it names is read again before it counts. Otherwise
    /// every resource is listed.
    pub(crate) async fn find_holder(
        &self,
        client: &kube::Client,
        me: &ComposableResource,
        id: &str,
        labels: bool,
    ) -> Result<Option<ComposableResource>, kube::Error> {
        let name = me.name_any();
        let holds = |r: &ComposableResource| {
            r.name_any() != name
                && (r.device_id() == Some(id)
                    || (labels && r.ready_to_detach().is_some_and(|o| o.device_id == id)))
        };
        let api: Api<ComposableResource> = Api::all(client.clone());
        if self
            .caught_up(me.metadata.resource_version.as_deref())
            .await
            && let Some(cached) = self.resources_holding(id)
        {
            for candidate in cached.iter().filter(|r| holds(r)) {
                if let Some(fresh) = api.get_opt(&candidate.name_any()).await?
                    && holds(&fresh)
                {
                    return Ok(Some(fresh));
                }
            }
            return Ok(None);
        }
        Ok(api
            .list(&ListParams::default())
            .await?
            .items
            .into_iter()
            .find(|r| holds(r)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cro_api::{ComposableResourceSpec, ComposableResourceStatus, ResourceType};

    fn res(name: &str, request: &str, node: &str, device: &str) -> ComposableResource {
        let mut r = ComposableResource::new(
            name,
            ComposableResourceSpec {
                resource_type: ResourceType::Gpu,
                model: "m".into(),
                target_node: node.into(),
                force_detach: false,
            },
        );
        if !request.is_empty() {
            r.metadata.labels = Some(
                [(cro_api::LABEL_MANAGED_BY.to_owned(), request.to_owned())]
                    .into_iter()
                    .collect(),
            );
        }
        r.status = Some(ComposableResourceStatus {
            device_id: device.into(),
            ..Default::default()
        });
        r
    }

    fn names(
        i: &ResourceIndex,
        map: fn(&ResourceIndex) -> &HashMap<String, HashSet<String>>,
        key: &str,
    ) -> Vec<String> {
        let mut v = ResourceIndex::names(map(i), key);
        v.sort();
        v
    }

    fn at(mut r: ComposableResource, version: u64) -> ComposableResource {
        r.metadata.resource_version = Some(version.to_string());
        r
    }

    fn says(u: Unseen) -> &'static str {
        match u {
            Unseen::Shown(_) => "shown",
            Unseen::Gone => "gone",
            Unseen::Unknown => "unknown",
        }
    }

    #[tokio::test]
    async fn names_the_cache_lacks_are_gone_once_seen_deleted_unless_made_again_here() {
        let caches = Caches::default();
        let a = res("a", "req", "n1", "");
        assert_eq!(says(caches.unseen("a").await), "unknown");
        caches
            .lock_index()
            .on(&watcher::Event::Delete(at(a.clone(), 5)));
        assert_eq!(says(caches.unseen("a").await), "gone");
        // Made again here under the same name: not gone, and once the cache has seen
        // the creation's version without showing it, nothing is known.
        caches.note_created(&at(a.clone(), 9));
        caches.resources_seen.store(9, Ordering::SeqCst);
        assert_eq!(says(caches.unseen("a").await), "unknown");
        // Deleted again after that creation.
        caches
            .lock_index()
            .on(&watcher::Event::Delete(at(a.clone(), 12)));
        assert_eq!(says(caches.unseen("a").await), "gone");
        assert!(caches.deleted_after(&at(a.clone(), 12)));
        assert!(caches.deleted_after(&at(a.clone(), 10)));
        assert!(
            !caches.deleted_after(&at(a.clone(), 13)),
            "a newer copy: made again"
        );
        // Shown by the watch: neither gone nor waited for.
        caches
            .lock_index()
            .on(&watcher::Event::Apply(at(a.clone(), 14)));
        assert_eq!(says(caches.unseen("a").await), "unknown");
        assert!(caches.lock_index().created.version("a").is_none());
        assert!(!caches.deleted_after(&at(a.clone(), 10)));
    }

    #[tokio::test]
    async fn a_creation_the_cache_showed_since_the_caller_looked_is_shown() {
        let caches = Caches::default();
        let a = at(res("a", "req", "n1", ""), 9);
        caches.note_created(&a);
        // The caller read the request's resources without "a"; then the watch showed it:
        // the store holds it and the index dropped the creation's mark.
        let mut writers = caches.writers.lock().unwrap().take().unwrap();
        writers
            .resources
            .apply_watcher_event(&watcher::Event::Apply(a.clone()));
        caches.lock_index().on(&watcher::Event::Apply(a.clone()));
        caches.resources_seen.store(9, Ordering::SeqCst);
        assert!(caches.lock_index().created.version("a").is_none());
        // Not unknown: the caller would create it again.
        assert_eq!(says(caches.unseen("a").await), "shown");
        // Deleted as the watch saw: gone, not shown.
        writers
            .resources
            .apply_watcher_event(&watcher::Event::Delete(at(a.clone(), 10)));
        caches
            .lock_index()
            .on(&watcher::Event::Delete(at(a.clone(), 10)));
        assert_eq!(says(caches.unseen("a").await), "gone");
    }

    #[test]
    fn marks_stay_bounded_however_fast_they_come() {
        let mut marks = Marks::default();
        for i in 0..(MARKS_MAX + 10) {
            marks.note(&format!("r{i}"), i as u64);
        }
        assert!(marks.by_name.len() < MARKS_MAX, "{}", marks.by_name.len());
        assert_eq!(
            marks.version(&format!("r{}", MARKS_MAX + 9)),
            Some((MARKS_MAX + 9) as u64)
        );
    }

    #[test]
    fn the_index_follows_changes_deletions_and_relistings() {
        let mut i = ResourceIndex::default();
        fn by_request(i: &ResourceIndex) -> &HashMap<String, HashSet<String>> {
            &i.by_request
        }
        fn by_node(i: &ResourceIndex) -> &HashMap<String, HashSet<String>> {
            &i.by_node
        }
        fn by_device(i: &ResourceIndex) -> &HashMap<String, HashSet<String>> {
            &i.by_device
        }
        i.on(&watcher::Event::Apply(res("a", "req1", "n1", "")));
        i.on(&watcher::Event::Apply(res("b", "req1", "n2", "GPU-2")));
        assert_eq!(names(&i, by_request, "req1"), ["a", "b"]);
        assert_eq!(names(&i, by_node, "n1"), ["a"]);
        assert_eq!(names(&i, by_device, "GPU-2"), ["b"]);

        // a stores its device; b lets go of its own.
        i.on(&watcher::Event::Apply(res("a", "req1", "n1", "GPU-1")));
        i.on(&watcher::Event::Apply(res("b", "req1", "n2", "")));
        assert_eq!(names(&i, by_device, "GPU-1"), ["a"]);
        assert!(names(&i, by_device, "GPU-2").is_empty());
        assert!(!i.by_device.contains_key("GPU-2"), "empty keys are dropped");

        i.on(&watcher::Event::Delete(res("a", "req1", "n1", "GPU-1")));
        assert_eq!(names(&i, by_request, "req1"), ["b"]);
        assert!(names(&i, by_node, "n1").is_empty());

        // A relisting after a lost watch: what it lacks went meanwhile.
        i.on(&watcher::Event::Init);
        i.on(&watcher::Event::InitApply(res("c", "req2", "n1", "GPU-3")));
        i.on(&watcher::Event::InitDone);
        assert!(names(&i, by_request, "req1").is_empty());
        assert_eq!(names(&i, by_node, "n1"), ["c"]);
        assert_eq!(i.keys.len(), 1);
    }

    #[test]
    fn a_resource_releasing_an_orphan_holds_the_device_of_its_label() {
        let mut i = ResourceIndex::default();
        let mut r = res("orphan", "", "n1", "");
        r.metadata.labels = Some(
            [(
                cro_api::LABEL_READY_TO_DETACH_DEVICE_ID.to_owned(),
                "GPU-9".to_owned(),
            )]
            .into_iter()
            .collect(),
        );
        i.on(&watcher::Event::Apply(r));
        assert_eq!(ResourceIndex::names(&i.by_device, "GPU-9"), ["orphan"]);
        assert!(i.by_request.is_empty(), "no request manages it");
    }
}
