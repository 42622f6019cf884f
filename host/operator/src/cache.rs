//! Watch caches of the objects reconciliations look across: every ComposableResource,
//! ComposabilityRequest and Node, and the GPU operator's driver pods, kept current by one
//! watch each.
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

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cro_api::{ComposabilityRequest, ComposableResource};
use futures::{FutureExt, StreamExt};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, ListParams};
use kube::runtime::reflector::{self, Store, store::Writer};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Resource, ResourceExt};

use crate::nodeops::driver::DRIVER_POD_LABEL;

/// How long a reader waits for the resource cache to catch up with the API server before
/// it asks the API server instead (see [`Caches::caught_up`]).
const CATCH_UP: Duration = Duration::from_secs(5);

struct Writers {
    resources: Writer<ComposableResource>,
    requests: Writer<ComposabilityRequest>,
    nodes: Writer<Node>,
    driver_pods: Writer<Pod>,
}

pub struct Caches {
    resources: Store<ComposableResource>,
    requests: Store<ComposabilityRequest>,
    nodes: Store<Node>,
    /// The GPU operator's driver pods (by their label), read by every GPU attach and
    /// detach to find the node's driver.
    driver_pods: Store<Pod>,
    /// The newest resource version among the ComposableResource changes the cache holds.
    resources_seen: Arc<AtomicU64>,
    /// The newest resource version of device ids this process wrote.
    ids_written: AtomicU64,
    writers: Mutex<Option<Writers>>,
}

impl Default for Caches {
    fn default() -> Self {
        let (resources, rw) = reflector::store();
        let (requests, qw) = reflector::store();
        let (nodes, nw) = reflector::store();
        let (driver_pods, dw) = reflector::store();
        Self {
            resources,
            requests,
            nodes,
            driver_pods,
            resources_seen: Arc::default(),
            ids_written: AtomicU64::new(0),
            writers: Mutex::new(Some(Writers {
                resources: rw,
                requests: qw,
                nodes: nw,
                driver_pods: dw,
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
) where
    K: Resource<DynamicType = ()> + Clone + std::fmt::Debug + serde::de::DeserializeOwned,
    K: Send + Sync + 'static,
{
    // Objects of a relisting become visible all at once when it completes: their
    // versions count as seen only then.
    let mut pending = 0u64;
    watcher(api, config)
        .default_backoff()
        .reflect(writer)
        .for_each(|event| {
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
            if let Err(e) = event {
                tracing::debug!(kind = %K::kind(&()), error = %e, "cache watch interrupted");
            }
            futures::future::ready(())
        })
        .await;
}

/// The watch of the GPU operator's driver pods: by the label the driver lookup uses, so
/// the cache holds a few pods per GPU node, not every pod of the cluster.
pub fn driver_pods() -> watcher::Config {
    watcher::Config::default().labels(DRIVER_POD_LABEL)
}

/// The node a pod is scheduled to.
pub fn pod_node(pod: &Pod) -> Option<&str> {
    pod.spec.as_ref()?.node_name.as_deref()
}

impl Caches {
    /// Keeps the caches current; runs until dropped. Only the first call does anything.
    pub fn run(&self, client: kube::Client) -> futures::future::BoxFuture<'static, ()> {
        let writers = self
            .writers
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        let Some(w) = writers else {
            return futures::future::ready(()).boxed();
        };
        let seen = self.resources_seen.clone();
        async move {
            let all = watcher::Config::default;
            futures::join!(
                reflect(Api::all(client.clone()), all(), w.resources, Some(seen)),
                reflect(Api::all(client.clone()), all(), w.requests, None),
                reflect(Api::all(client.clone()), all(), w.nodes, None),
                reflect(Api::all(client), driver_pods(), w.driver_pods, None),
            );
        }
        .boxed()
    }

    fn ready<K: Resource<DynamicType = ()> + Clone>(store: &Store<K>) -> bool {
        matches!(store.wait_until_ready().now_or_never(), Some(Ok(())))
    }

    /// The cached ComposableResources (None until the cache has listed them once).
    pub fn resources(&self) -> Option<Vec<Arc<ComposableResource>>> {
        Self::ready(&self.resources).then(|| self.resources.state())
    }

    /// The cached ComposabilityRequests (None until the cache has listed them once).
    pub fn requests(&self) -> Option<Vec<Arc<ComposabilityRequest>>> {
        Self::ready(&self.requests).then(|| self.requests.state())
    }

    /// The Node cache itself, for a reader that looks nodes up by name (the provider
    /// registry's routing by node labels).
    pub fn node_store(&self) -> Store<Node> {
        self.nodes.clone()
    }

    /// The cached Nodes (None until the cache has listed them once).
    pub fn nodes(&self) -> Option<Vec<Arc<Node>>> {
        Self::ready(&self.nodes).then(|| self.nodes.state())
    }

    /// The driver pods on `node` as the cache shows them (None until it has listed them
    /// once). The cache may lag: a reader that finds no Ready pod here asks the API
    /// server before it decides to wait (see `nodeops::driver::discover`).
    pub fn driver_pods_on(&self, node: &str) -> Option<Vec<Pod>> {
        Self::ready(&self.driver_pods).then(|| {
            self.driver_pods
                .state()
                .iter()
                .filter(|p| pod_node(p) == Some(node))
                .map(|p| p.as_ref().clone())
                .collect()
        })
    }

    /// Records a ComposableResource this process just wrote device ids into, so that
    /// [`Caches::caught_up`] waits for the cache to show it. Attaches call it while they
    /// still hold their node's lock.
    pub fn note_ids_written(&self, obj: &ComposableResource) {
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
    pub async fn caught_up(&self, version: Option<&str>) -> bool {
        if !Self::ready(&self.resources) {
            return false;
        }
        let Some(version) = version.and_then(|v| v.parse::<u64>().ok()) else {
            return false;
        };
        let target = version.max(self.ids_written.load(Ordering::SeqCst));
        let deadline = Instant::now() + CATCH_UP;
        loop {
            if self.resources_seen.load(Ordering::SeqCst) >= target {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
    /// Every ComposableResource, as claims for a provider: from the cache once it has
    /// [`Caches::caught_up`] with `me` (so it holds every device id this process stored,
    /// under the node lock the caller holds), else listed from the API server. Read on
    /// every attach, so a full list each time would make attaching N devices cost N².
    pub async fn all_resources(
        &self,
        client: &kube::Client,
        me: &ComposableResource,
    ) -> Result<Vec<ComposableResource>, kube::Error> {
        if self
            .caught_up(me.metadata.resource_version.as_deref())
            .await
            && let Some(cached) = self.resources()
        {
            return Ok(cached.iter().map(|r| r.as_ref().clone()).collect());
        }
        let api: Api<ComposableResource> = Api::all(client.clone());
        Ok(api.list(&ListParams::default()).await?.items)
    }

    /// A ComposableResource matching `pred` (another holder of a device), if any. A
    /// wrong "none" could give one device to two resources or detach a device another
    /// holds, so the cache answers only once [`Caches::caught_up`] with `me` (the
    /// resource asking, as last read or written), and each resource it names is read
    /// again before it counts. Otherwise every resource is listed.
    pub async fn find_resource(
        &self,
        client: &kube::Client,
        me: &ComposableResource,
        pred: impl Fn(&ComposableResource) -> bool,
    ) -> Result<Option<ComposableResource>, kube::Error> {
        let api: Api<ComposableResource> = Api::all(client.clone());
        if self
            .caught_up(me.metadata.resource_version.as_deref())
            .await
            && let Some(cached) = self.resources()
        {
            for candidate in cached.iter().filter(|r| pred(r)) {
                if let Some(fresh) = api.get_opt(&candidate.name_any()).await?
                    && pred(&fresh)
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
            .find(|r| pred(r)))
    }
}
