//! The provider registry: the providers this operator runs, by name, and which one
//! serves a node (docs/providers.md, "Several providers").
//!
//! Each provider sits in a [`Slot`] whose component is swapped atomically: a call takes
//! the `Arc` of the instance serving when it starts and finishes on it, while new calls
//! take the new one. The registry itself is a [`DeviceProvider`]: it routes every call on
//! a resource to the provider serving the resource's node ([`route`]), so the
//! controllers are the same whether one provider or many run.
//!
//! Providers come from `CdiProvider` objects ([`watch`]) or, for compatibility, from
//! `--provider-spec` / the Go environment as one implicit provider.

pub(crate) mod admit;
pub(crate) mod fence;
pub(crate) mod load;
pub(crate) mod route;
pub(crate) mod spec;
pub(crate) mod startup;
pub(crate) mod status;
pub(crate) mod watch;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use cro_api::LABEL_PROVIDER;
use cro_runtime::CallError;
use cro_runtime::domain::{
    self, AddOutcome, AddRequest, Claim, DeviceInfo, PoolOutcome, PoolQuery, ProviderError,
    RemoveOutcome,
};
use futures::future::BoxFuture;
use kube::ResourceExt;

use crate::provider::node_cache::{NodeCache, ResourceCache};
use crate::provider::node_scope::NodeScope;
use crate::provider::tenure::{Tenure, TenureCell};
use crate::provider::{DeviceProvider, ProviderCounters, ProviderResult};
use route::{Call, RouteEntry, RouteError};

/// Name of the implicit provider `--provider-spec` or the Go environment defines.
pub(crate) const IMPLICIT_PROVIDER: &str = "default";

fn read<T>(l: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn write<T>(l: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    l.write().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// One provider: where it routes, the instance serving, its call counts.
pub(crate) struct Slot {
    route: RwLock<RouteEntry>,
    serving: RwLock<Option<Arc<dyn DeviceProvider>>>,
    calls: AtomicU64,
    failed: AtomicU64,
}

impl Slot {
    fn new(route: RouteEntry) -> Slot {
        Slot {
            route: RwLock::new(route),
            serving: RwLock::new(None),
            calls: AtomicU64::new(0),
            failed: AtomicU64::new(0),
        }
    }

    pub(crate) fn name(&self) -> String {
        read(&self.route).name.clone()
    }

    /// The instance serving now; a call holds this `Arc` until it ends.
    pub(crate) fn serving(&self) -> Option<Arc<dyn DeviceProvider>> {
        read(&self.serving).clone()
    }

    /// Makes `provider` serve new calls; calls in flight finish on the old one.
    pub(crate) fn swap(&self, provider: Arc<dyn DeviceProvider>) {
        *write(&self.serving) = Some(provider);
    }

    pub(crate) fn set_route(&self, route: RouteEntry) {
        *write(&self.route) = route;
    }

    /// (calls, failed calls) since this process started.
    pub(crate) fn counts(&self) -> (u64, u64) {
        (
            self.calls.load(Ordering::Relaxed),
            self.failed.load(Ordering::Relaxed),
        )
    }

    fn count<T>(&self, r: &ProviderResult<T>) {
        self.calls.fetch_add(1, Ordering::Relaxed);
        if r.is_err() {
            self.failed.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Where routing reads: the operator's Node watch cache (node labels) and its
/// ComposableResource cache (the provider each resource is labelled with), both lent
/// once the operator's caches start; or (one implicit provider) nowhere, since every
/// node and resource is then served by it.
enum Labels {
    Cache {
        nodes: NodeCache,
        resources: ResourceCache,
    },
    NotNeeded,
}

/// The providers by name.
pub(crate) struct Registry {
    slots: RwLock<BTreeMap<String, Arc<Slot>>>,
    labels: Labels,
    /// Which providers this replica may call now: every routed call passes it first, and
    /// the pool and sync rounds ask only the providers it holds.
    tenure: TenureCell,
    /// Notified when a provider comes or goes (its Lease and work follow at once).
    changed: tokio::sync::Notify,
    /// Whether every provider is known: set once the first complete list of
    /// `CdiProvider` objects is in ([`Registry::all_known`]). Before that, routing with
    /// the providers read so far could name the wrong one (a default provider taking a
    /// node another one selects, a first provider listing every node as the only one).
    complete: AtomicBool,
}

impl Registry {
    /// An empty registry filled by `CdiProvider` objects ([`watch::run`]); it routes
    /// by the labels of the Nodes the operator lends `nodes` (its own Node watch cache,
    /// so the registry adds no second watch of every Node), and its providers look Nodes
    /// up there too. A Node that is gone routes by the provider label of its
    /// resources, read from the ComposableResource cache the operator lends later
    /// ([`Registry::resource_cache`]).
    pub(crate) fn for_objects(nodes: NodeCache) -> Arc<Registry> {
        Arc::new(Registry {
            slots: RwLock::default(),
            labels: Labels::Cache {
                nodes,
                resources: ResourceCache::default(),
            },
            tenure: TenureCell::default(),
            changed: tokio::sync::Notify::new(),
            complete: AtomicBool::new(false),
        })
    }

    /// Where the providers this registry loads look Nodes up first (None for one
    /// implicit provider, loaded before the registry).
    pub(crate) fn node_cache(&self) -> Option<&NodeCache> {
        match &self.labels {
            Labels::Cache { nodes, .. } => Some(nodes),
            Labels::NotNeeded => None,
        }
    }

    /// Where the registry reads which provider each resource is labelled with (None for
    /// one implicit provider, which serves them all).
    pub(crate) fn resource_cache(&self) -> Option<&ResourceCache> {
        match &self.labels {
            Labels::Cache { resources, .. } => Some(resources),
            Labels::NotNeeded => None,
        }
    }

    /// The one implicit provider of `--provider-spec` or the Go environment, serving
    /// every node, under `name`; its tenure is kept in `tenure` (the provider, loaded
    /// before the registry existed, reads its fence there).
    pub(crate) fn single_in(
        name: &str,
        provider: Arc<dyn DeviceProvider>,
        tenure: TenureCell,
    ) -> Arc<Registry> {
        let slot = Slot::new(RouteEntry {
            name: name.to_owned(),
            selector: None,
            default: true,
        });
        slot.swap(provider);
        Arc::new(Registry {
            slots: RwLock::new(BTreeMap::from([(name.to_owned(), Arc::new(slot))])),
            labels: Labels::NotNeeded,
            tenure,
            changed: tokio::sync::Notify::new(),
            complete: AtomicBool::new(true),
        })
    }

    /// Calls go through `tenure` from now on (the operator gives its own at start).
    pub(crate) fn set_tenure(&self, tenure: Arc<Tenure>) {
        self.tenure.set(tenure);
    }

    pub(crate) fn tenure(&self) -> Arc<Tenure> {
        self.tenure.get()
    }

    /// The fence for the runtime to ask before each HTTP request of `provider`.
    pub(crate) fn fence(&self, provider: &str) -> cro_runtime::Fence {
        self.tenure.fence(provider)
    }

    /// `Ok` when this replica may act now for the provider serving `node` (a node
    /// command is fenced like a fabric call); otherwise why not.
    pub(crate) fn fence_node(&self, node: &str) -> Result<String, String> {
        let name = self.route(node).map_err(|e| e.to_string())?;
        self.tenure().check(&name).map_err(|e| e.to_string())?;
        Ok(name)
    }

    /// The slots of the providers this replica holds now.
    fn held_slots(&self) -> Vec<Arc<Slot>> {
        let tenure = self.tenure();
        self.slots()
            .into_iter()
            .filter(|s| tenure.check(&s.name()).is_ok())
            .collect()
    }

    /// The slot named `name`, made with `route` when new (its route updated otherwise).
    pub(crate) fn upsert(&self, route: RouteEntry) -> Arc<Slot> {
        let mut slots = write(&self.slots);
        match slots.get(&route.name) {
            Some(s) => {
                s.set_route(route);
                s.clone()
            }
            None => {
                let s = Arc::new(Slot::new(route.clone()));
                slots.insert(route.name, s.clone());
                self.changed.notify_one();
                s
            }
        }
    }

    pub(crate) fn remove(&self, name: &str) -> Option<Arc<Slot>> {
        let removed = write(&self.slots).remove(name);
        self.changed.notify_one();
        removed
    }

    /// Every provider is in the registry now (the watch read its first complete list):
    /// calls are routed from here on.
    pub(crate) fn all_known(&self) {
        self.complete.store(true, Ordering::Release);
    }

    /// Whether every provider is known (always, for one implicit provider).
    pub(crate) fn knows_all(&self) -> bool {
        self.complete.load(Ordering::Acquire)
    }

    /// Resolves when a provider came or went since the last wait (one permit kept).
    pub(crate) async fn changed(&self) {
        self.changed.notified().await;
    }

    pub(crate) fn slot(&self, name: &str) -> Option<Arc<Slot>> {
        read(&self.slots).get(name).cloned()
    }

    pub(crate) fn slots(&self) -> Vec<Arc<Slot>> {
        read(&self.slots).values().cloned().collect()
    }

    fn node_labels(&self, node: &str) -> Option<BTreeMap<String, String>> {
        match &self.labels {
            Labels::NotNeeded => Some(BTreeMap::new()),
            Labels::Cache { nodes, .. } => nodes
                .get(node)
                .map(|n| n.metadata.labels.clone().unwrap_or_default()),
        }
    }

    /// The provider label of every cached resource targeting `node` (none while no
    /// resource cache is lent or listed).
    fn labels_of_resources_on(&self, node: &str) -> Vec<Option<String>> {
        let Labels::Cache { resources, .. } = &self.labels else {
            return Vec::new();
        };
        resources
            .all()
            .unwrap_or_default()
            .iter()
            .filter(|r| r.spec.target_node == node)
            .map(|r| r.labels().get(LABEL_PROVIDER).cloned())
            .collect()
    }

    /// The provider label of resource `name`, as the resource cache shows it (None: not
    /// labelled, not shown yet, or no resource cache).
    fn label_of(&self, name: &str) -> Option<String> {
        let Labels::Cache { resources, .. } = &self.labels else {
            return None;
        };
        resources.get(name)?.labels().get(LABEL_PROVIDER).cloned()
    }

    /// Whether provider `name` serves a node, the providers read once for every node
    /// asked: it is the only one, or routing names it (for a Node that is gone, by its
    /// resources' provider label: its devices are still listed and released). None
    /// while the providers are still being read: the first one read is not yet known to
    /// be the only one.
    fn serving(&self, name: &str) -> impl Fn(&str) -> bool + '_ {
        let entries = self.route_entries();
        let name = name.to_owned();
        let complete = self.knows_all();
        move |node| {
            (complete && entries.len() == 1)
                || self
                    .route_held_among(&entries, node)
                    .is_ok_and(|n| n == name)
        }
    }

    /// What provider `name`'s listings of Nodes show: the nodes it serves, asked at each
    /// listing (crate::provider::node_scope). Held weakly: the registry holds the
    /// provider, which holds this.
    pub(crate) fn scope_of(self: &Arc<Self>, name: &str) -> NodeScope {
        let registry = Arc::downgrade(self);
        let name = name.to_owned();
        NodeScope::only(move |node| registry.upgrade().is_some_and(|r| r.serving(&name)(node)))
    }

    /// Every provider's routing rule, as they are now.
    fn route_entries(&self) -> Vec<RouteEntry> {
        self.slots()
            .iter()
            .map(|s| read(&s.route).clone())
            .collect()
    }

    /// The name of the provider serving `node`.
    pub(crate) fn route(&self, node: &str) -> Result<String, RouteError> {
        self.route_among(&self.route_entries(), node)
    }

    /// The name of the provider holding `node`'s devices: [`Registry::route`], or for a
    /// Node that is gone the provider its resources are labelled with.
    pub(crate) fn route_held(&self, node: &str) -> Result<String, RouteError> {
        self.route_held_among(&self.route_entries(), node)
    }

    /// The name of the provider serving `node` among `entries`, by the node's labels.
    fn route_among(&self, entries: &[RouteEntry], node: &str) -> Result<String, RouteError> {
        if !self.knows_all() {
            return Err(RouteError::ProvidersUnread {
                node: node.to_owned(),
            });
        }
        // One implicit provider serves every node, known or not.
        if let Labels::NotNeeded = self.labels
            && let [only] = entries
        {
            return Ok(only.name.clone());
        }
        let labels = self
            .node_labels(node)
            .ok_or_else(|| RouteError::UnknownNode {
                node: node.to_owned(),
            })?;
        route::route(node, &labels, entries).map(|e| e.name.clone())
    }

    /// [`Registry::route_among`], and for a node the Node cache does not show (deleted,
    /// its devices still to release or to list) the provider its resources are labelled
    /// with: what holds devices there is that provider's. Not for attaches: nothing is
    /// attached to a node that is gone.
    fn route_held_among(&self, entries: &[RouteEntry], node: &str) -> Result<String, RouteError> {
        match self.route_among(entries, node) {
            Err(RouteError::UnknownNode { .. }) => {
                route::by_resources(node, self.labels_of_resources_on(node), entries)
                    .map(|e| e.name.clone())
            }
            routed => routed,
        }
    }

    /// The slot and serving instance for a call on `resource` ([`route::for_call`]: by
    /// its provider label, as the resource cache shows it, and where its node routes; a
    /// call on a device it holds may reach a Node that is gone,
    /// [`Registry::route_held_among`]). Or the error the call returns.
    fn serving_for(
        &self,
        resource: &domain::ComposableResource,
        call: Call,
    ) -> Result<(Arc<Slot>, Arc<dyn DeviceProvider>), CallError> {
        let node = resource.target_node.as_str();
        let entries = self.route_entries();
        let label = self.label_of(&resource.name);
        let name = route::for_call(node, call, label.as_deref(), &entries, || match call {
            Call::Attach => self.route_among(&entries, node),
            Call::Held => self.route_held_among(&entries, node),
        });
        let name = name.map_err(|e| match e {
            // The cache may lag a new Node, the watch the providers: a retry finds them.
            RouteError::UnknownNode { .. } | RouteError::ProvidersUnread { .. } => {
                CallError::Provider(ProviderError::Unavailable(e.to_string()))
            }
            _ => CallError::Provider(ProviderError::Config(e.to_string())),
        })?;
        // The fence, right before the call: a replica whose Lease of this provider
        // expired or moved makes no further call for it.
        self.tenure()
            .check(&name)
            .map_err(|e| CallError::Provider(ProviderError::Unavailable(e.to_string())))?;
        let slot = self.slot(&name).ok_or_else(|| {
            CallError::Provider(ProviderError::Unavailable(format!(
                "CdiProvider {name} went away"
            )))
        })?;
        let provider = slot.serving().ok_or_else(|| {
            CallError::Provider(ProviderError::Unavailable(format!(
                "CdiProvider {name} serves node {node} but has no component loaded yet"
            )))
        })?;
        Ok((slot, provider))
    }

    fn finish<T>(
        slot: &Slot,
        node: &str,
        op: &'static str,
        r: ProviderResult<T>,
    ) -> ProviderResult<T> {
        slot.count(&r);
        if let Err(e) = &r {
            tracing::debug!(provider = %slot.name(), node, operation = op, error = %e, "provider call failed");
        }
        r
    }
}

impl DeviceProvider for Registry {
    fn add<'a>(&'a self, request: &'a AddRequest) -> BoxFuture<'a, ProviderResult<AddOutcome>> {
        Box::pin(async move {
            let node = &request.resource.target_node;
            let (slot, p) = self.serving_for(&request.resource, Call::Attach)?;
            let r = p.add(request).await;
            Self::finish(&slot, node, "add_resource", r)
        })
    }

    fn remove<'a>(
        &'a self,
        resource: &'a domain::ComposableResource,
    ) -> BoxFuture<'a, ProviderResult<RemoveOutcome>> {
        Box::pin(async move {
            let (slot, p) = self.serving_for(resource, Call::Held)?;
            let r = p.remove(resource).await;
            Self::finish(&slot, &resource.target_node, "remove_resource", r)
        })
    }

    fn check<'a>(
        &'a self,
        resource: &'a domain::ComposableResource,
    ) -> BoxFuture<'a, ProviderResult<()>> {
        Box::pin(async move {
            let (slot, p) = self.serving_for(resource, Call::Held)?;
            let r = p.check(resource).await;
            Self::finish(&slot, &resource.target_node, "check_resource", r)
        })
    }

    fn list<'a>(&'a self, claims: &'a [Claim]) -> BoxFuture<'a, ProviderResult<Vec<DeviceInfo>>> {
        Box::pin(async move { self.list_all(claims).await })
    }

    /// Every provider's pools over the asked nodes it serves, each pool's id prefixed
    /// with its provider's name (two fabrics may both call a pool `1`); not supported
    /// only when no provider has a pool, saying why for each. One provider failing
    /// fails the read: a partial pool would read as devices gone.
    fn pool<'a>(&'a self, query: &'a PoolQuery) -> BoxFuture<'a, ProviderResult<PoolOutcome>> {
        Box::pin(async move {
            let mut pools = Vec::new();
            let mut why_not = Vec::new();
            for (slot, outcome) in self.pools(query).await {
                match outcome? {
                    PoolOutcome::Pools(found) => pools.extend(found.into_iter().map(|mut p| {
                        p.id = format!("{}/{}", slot.name(), p.id);
                        p
                    })),
                    PoolOutcome::NotSupported(why) => {
                        why_not.push(format!("{}: {why}", slot.name()))
                    }
                }
            }
            if pools.is_empty() && !why_not.is_empty() {
                return Ok(PoolOutcome::NotSupported(why_not.join("; ")));
            }
            Ok(PoolOutcome::Pools(pools))
        })
    }

    fn counters(&self) -> Option<ProviderCounters> {
        self.only().and_then(|p| p.counters())
    }
}

impl Registry {
    /// The serving instance when exactly one provider runs (its counters feed the
    /// metrics the single-provider operator always had).
    fn only(&self) -> Option<Arc<dyn DeviceProvider>> {
        match self.slots().as_slice() {
            [one] => one.serving(),
            _ => None,
        }
    }

    /// Each serving provider's answer for the asked nodes it serves (all of them when it
    /// is the only provider), counted like any call; only the providers this replica
    /// holds are asked (another replica publishes the others).
    pub(crate) async fn pools(
        &self,
        query: &PoolQuery,
    ) -> Vec<(Arc<Slot>, ProviderResult<PoolOutcome>)> {
        let mut out = Vec::new();
        for slot in self.held_slots() {
            let Some(provider) = slot.serving() else {
                continue;
            };
            let serves = self.serving(&slot.name());
            let nodes = query.nodes.iter().filter(|n| serves(n)).cloned().collect();
            let mine = PoolQuery {
                kinds: query.kinds.clone(),
                nodes,
            };
            let r = provider.pool(&mine).await;
            slot.count(&r);
            // What the provider says of nodes it does not serve, or of kinds nobody
            // asked for, is not published.
            out.push((slot, r.map(|o| o.limited_to(&mine))));
        }
        out
    }

    /// The upstream sync's listing, per provider: each provider is asked for its fabric's
    /// devices and only those on nodes it serves are kept (another fabric's nodes are not
    /// its business). A provider that fails is logged and skipped, so one fabric being
    /// down does not stop the sync of the others; all failing is an error. Only the
    /// providers this replica holds are asked (another replica syncs the others).
    async fn list_all(&self, claims: &[Claim]) -> ProviderResult<Vec<DeviceInfo>> {
        if !self.knows_all() {
            return Err(CallError::Provider(ProviderError::Unavailable(
                "the operator is still reading the CdiProvider objects: nothing is listed yet"
                    .into(),
            )));
        }
        let mut all = Vec::new();
        let mut last_error = None;
        let mut answered = 0usize;
        for slot in &self.held_slots() {
            let Some(provider) = slot.serving() else {
                continue;
            };
            let name = slot.name();
            let r = provider.list(claims).await;
            slot.count(&r);
            match r {
                Ok(devices) => {
                    answered += 1;
                    let serves = self.serving(&name);
                    all.extend(devices.into_iter().filter(|d| serves(&d.node)));
                }
                Err(e) => {
                    tracing::warn!(provider = %name, error = %e, "upstream sync: listing failed");
                    last_error = Some(e);
                }
            }
        }
        match last_error {
            Some(e) if answered == 0 => Err(e),
            _ => Ok(all),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Node;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
    use kube::runtime::reflector;
    use kube::runtime::watcher::Event;
    use serde::de::DeserializeOwned;
    use serde_json::json;

    fn object<K: DeserializeOwned>(v: serde_json::Value) -> K {
        serde_json::from_value(v).expect("object")
    }

    /// A store listed with `objects`, as the operator's watch cache would be.
    fn listed<K>(objects: Vec<K>) -> reflector::Store<K>
    where
        K: kube::Resource<DynamicType = ()> + Clone + 'static,
    {
        let (store, mut writer) = reflector::store::<K>();
        writer.apply_watcher_event(&Event::Init);
        for o in objects {
            writer.apply_watcher_event(&Event::InitApply(o));
        }
        writer.apply_watcher_event(&Event::InitDone);
        store
    }

    /// A registry of `fabric-a` serving the nodes labelled `pool: a` and `fabric-b`
    /// those labelled `pool: b`, no caches lent yet.
    fn pools_a_and_b() -> Arc<Registry> {
        let registry = Registry::for_objects(NodeCache::default());
        for (name, p) in [("fabric-a", "a"), ("fabric-b", "b")] {
            registry.upsert(RouteEntry {
                name: name.into(),
                selector: Some(LabelSelector {
                    match_labels: Some(BTreeMap::from([("pool".to_owned(), p.to_owned())])),
                    match_expressions: None,
                }),
                default: false,
            });
        }
        registry.all_known();
        registry
    }

    /// Before the watch has read every CdiProvider, nothing is routed and no node is
    /// listed: with only the default provider read, a node another provider selects
    /// would go to it (an attach on the wrong fabric); with only the first provider
    /// read, it would look like the only one and list every node.
    #[tokio::test]
    async fn nothing_is_routed_or_listed_before_every_provider_is_read() {
        let registry = Registry::for_objects(NodeCache::default());
        registry
            .node_cache()
            .expect("routes by node labels")
            .serve_from(listed(vec![
                object::<Node>(json!({"metadata": {"name": "a-1", "labels": {"pool": "a"}}})),
                object::<Node>(json!({"metadata": {"name": "b-1", "labels": {"pool": "b"}}})),
            ]));
        registry.upsert(RouteEntry {
            name: "fabric-a".into(),
            selector: None,
            default: true,
        });
        let resource = domain::ComposableResource {
            name: "r1".into(),
            device_type: domain::DeviceType::Gpu,
            model: "A100".into(),
            target_node: "b-1".into(),
            device_id: Some("GPU-1".into()),
            fabric_device_id: None,
            machine_id: None,
            force_detach: false,
        };
        assert!(matches!(
            registry.route("b-1"),
            Err(RouteError::ProvidersUnread { .. })
        ));
        // A call waits (unavailable: retried), it is not refused as misconfigured.
        assert!(matches!(
            registry.check(&resource).await,
            Err(CallError::Provider(ProviderError::Unavailable(_)))
        ));
        assert!(!registry.scope_of("fabric-a").shows("a-1"));
        assert!(!registry.scope_of("fabric-a").shows("b-1"));
        assert!(matches!(
            registry.list(&[]).await,
            Err(CallError::Provider(ProviderError::Unavailable(_)))
        ));

        registry.upsert(RouteEntry {
            name: "fabric-b".into(),
            selector: Some(LabelSelector {
                match_labels: Some(BTreeMap::from([("pool".to_owned(), "b".to_owned())])),
                match_expressions: None,
            }),
            default: false,
        });
        registry.all_known();
        assert_eq!(registry.route("a-1"), Ok("fabric-a".to_owned()));
        assert_eq!(registry.route("b-1"), Ok("fabric-b".to_owned()));
        assert!(registry.scope_of("fabric-a").shows("a-1"));
        assert!(!registry.scope_of("fabric-a").shows("b-1"));
        // No component is loaded: the call now reaches fabric b's slot and waits there.
        let Err(CallError::Provider(ProviderError::Unavailable(why))) =
            registry.check(&resource).await
        else {
            panic!("fabric b has nothing loaded")
        };
        assert!(why.contains("fabric-b"), "{why}");
        assert!(registry.list(&[]).await.is_ok_and(|d| d.is_empty()));
    }

    #[test]
    fn a_node_gone_routes_its_devices_by_its_resources_label_but_takes_no_attach() {
        let registry = pools_a_and_b();
        let node = |name: &str, p: &str| -> Node {
            object(json!({"metadata": {"name": name, "labels": {"pool": p}}}))
        };
        let resource = |name: &str, node: &str, provider: &str| -> cro_api::ComposableResource {
            object(json!({
                "apiVersion": "cro.hpsys.ibm.ie.com/v1alpha1", "kind": "ComposableResource",
                "metadata": {"name": name, "labels": {LABEL_PROVIDER: provider}},
                "spec": {"type": "gpu", "model": "A100", "target_node": node},
            }))
        };
        registry
            .node_cache()
            .expect("routes by node labels")
            .serve_from(listed(vec![node("b-1", "b")]));
        let entries = registry.route_entries();
        let held = |node: &str| registry.route_held_among(&entries, node);
        // Before the resource cache is lent, a Node that is gone is not known.
        assert!(matches!(held("a-1"), Err(RouteError::UnknownNode { .. })));
        registry
            .resource_cache()
            .expect("routes by resource labels")
            .serve_from(listed(vec![
                resource("r1", "a-1", "fabric-a"),
                resource("r2", "b-1", "fabric-b"),
            ]));
        // A deleted Node: its devices are fabric a's (what its resource says) ...
        assert_eq!(held("a-1"), Ok("fabric-a".to_owned()));
        assert!(registry.serving("fabric-a")("a-1"));
        assert!(!registry.serving("fabric-b")("a-1"));
        assert!(registry.scope_of("fabric-a").shows("a-1"));
        // ... but nothing is attached there.
        assert!(matches!(
            registry.route("a-1"),
            Err(RouteError::UnknownNode { .. })
        ));
        // A known Node routes by its labels, whatever its resources say.
        assert_eq!(held("b-1"), Ok("fabric-b".to_owned()));
        // A node nobody holds anything on stays unknown.
        assert!(matches!(held("c-1"), Err(RouteError::UnknownNode { .. })));
    }

    #[test]
    fn a_provider_s_deletion_waits_for_devices_on_its_nodes_and_those_labelled_with_it() {
        let registry = pools_a_and_b();
        registry
            .node_cache()
            .expect("node cache")
            .serve_from(listed(vec![
                object(json!({"metadata": {"name": "a-1", "labels": {"pool": "a"}}})),
                // Moved to pool b after a device of fabric a was attached.
                object::<Node>(json!({"metadata": {"name": "moved", "labels": {"pool": "b"}}})),
            ]));
        let resource = |name: &str, node: &str, provider: Option<&str>, device: Option<&str>| {
            let mut r: cro_api::ComposableResource = object(json!({
                "apiVersion": "cro.hpsys.ibm.ie.com/v1alpha1", "kind": "ComposableResource",
                "metadata": {"name": name},
                "spec": {"type": "gpu", "model": "A100", "target_node": node},
            }));
            if let Some(p) = provider {
                r.metadata.labels = Some(BTreeMap::from([(LABEL_PROVIDER.into(), p.into())]));
            }
            if let Some(d) = device {
                r.status = Some(object(json!({"state": "Online", "device_id": d})));
            }
            r
        };
        let resources = [
            resource("on-a", "a-1", None, Some("GPU-1")),
            resource("gone", "deleted-node", Some("fabric-a"), Some("GPU-2")),
            resource("moved", "moved", Some("fabric-a"), Some("GPU-3")),
            resource("no-device", "a-1", Some("fabric-a"), None),
            resource("on-b", "elsewhere", Some("fabric-b"), Some("GPU-4")),
        ];
        assert_eq!(
            watch::blocking_devices(&registry, "fabric-a", &resources),
            ["on-a (GPU-1)", "gone (GPU-2)", "moved (GPU-3)"]
        );
        // The node now in pool b holds fabric a's device, and blocks fabric b as before.
        assert_eq!(
            watch::blocking_devices(&registry, "fabric-b", &resources),
            ["moved (GPU-3)", "on-b (GPU-4)"]
        );
    }
}
