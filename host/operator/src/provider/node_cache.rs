//! The operator's watch caches, lent to the parts loaded before them.
//!
//! A provider finds a node's fabric machine by looking its Node up (the `lookup`
//! import), once per attach: a GET of the API server for every device, while the
//! operator already holds every Node in its watch cache (for routing, the plan and the
//! node checks). [`NodeCache`] is the handle through which the cluster view
//! ([`super::node_machine::RememberingCluster`]) answers those lookups from that cache.
//! The provider registry reads the same Node cache for routing by node labels, and the
//! ComposableResource cache ([`ResourceCache`]) for the provider label of the resources
//! on a Node that is gone (crate::registry::Registry::route_held_among).
//! Providers and the registry are made before the operator's caches exist, so a handle
//! starts empty and the operator fills it when its caches start
//! ([`LentCache::serve_from`]); an operator started again with the same provider lends
//! its own in its place.
//!
//! A lookup the cache cannot answer (not listed yet, or an object it does not show, such
//! as one created a moment ago) is left to the reader (a Node lookup is then a GET as
//! before). What the cache holds is what the watch sent, without `managedFields`; a
//! Node's name, labels, annotations and `providerID` (what providers read) are the same
//! as a GET's, at most the watch's delay behind.

use std::sync::{Arc, PoisonError, RwLock};

use cro_api::ComposableResource;
use futures::FutureExt;
use k8s_openapi::api::core::v1::Node;
use kube::Resource;
use kube::runtime::reflector::{ObjectRef, Store};

/// A shared, replaceable view of one of the operator's watch caches of a cluster-scoped
/// kind (empty until the operator lends it). Clones share it.
pub struct LentCache<K: Resource<DynamicType = ()> + Clone + 'static> {
    store: Arc<RwLock<Option<Store<K>>>>,
}

/// The operator's Node cache, as providers and routing read it.
pub type NodeCache = LentCache<Node>;

/// The operator's ComposableResource cache, as routing reads it.
pub(crate) type ResourceCache = LentCache<ComposableResource>;

impl<K: Resource<DynamicType = ()> + Clone + 'static> Default for LentCache<K> {
    fn default() -> Self {
        Self {
            store: Arc::default(),
        }
    }
}

impl<K: Resource<DynamicType = ()> + Clone + 'static> Clone for LentCache<K> {
    fn clone(&self) -> Self {
        Self {
            store: self.store.clone(),
        }
    }
}

impl<K: Resource<DynamicType = ()> + Clone + 'static> LentCache<K> {
    /// Lookups are answered from `store` from now on (once it has listed).
    pub(crate) fn serve_from(&self, store: Store<K>) {
        *self.store.write().unwrap_or_else(PoisonError::into_inner) = Some(store);
    }

    /// What `read` finds in the store, once lent and listed: before its first listing an
    /// empty store would answer "no such object" for every object.
    fn read_listed<T>(&self, read: impl FnOnce(&Store<K>) -> Option<T>) -> Option<T> {
        let guard = self.store.read().unwrap_or_else(PoisonError::into_inner);
        let store = guard.as_ref()?;
        if !matches!(store.wait_until_ready().now_or_never(), Some(Ok(()))) {
            return None;
        }
        read(store)
    }

    /// Object `name` as the cache shows it; None when no cache is lent, it has not listed
    /// yet, or it does not show the object.
    pub(crate) fn get(&self, name: &str) -> Option<Arc<K>> {
        self.read_listed(|s| s.get(&ObjectRef::new(name)))
    }

    /// Every object the cache shows; None when no cache is lent or it has not listed yet.
    pub(crate) fn all(&self) -> Option<Vec<Arc<K>>> {
        self.read_listed(|s| Some(s.state()))
    }
}

impl<K: Resource<DynamicType = ()> + Clone + 'static> std::fmt::Debug for LentCache<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let lent = self
            .store
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .is_some();
        f.debug_struct("LentCache")
            .field("kind", &K::kind(&()))
            .field("lent", &lent)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::runtime::reflector;
    use kube::runtime::watcher::Event;

    fn node(name: &str) -> Node {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name},
            "spec": {"providerID": format!("fsas-cdi://{name}")},
        }))
        .expect("node")
    }

    #[test]
    fn only_a_listed_cache_answers_and_the_latest_lent_one() {
        let cache = NodeCache::default();
        assert!(cache.get("w1").is_none(), "nothing lent");
        let (store, mut writer) = reflector::store::<Node>();
        cache.serve_from(store);
        // Lent, but not listed yet: an empty store must not read as "no such Node".
        writer.apply_watcher_event(&Event::Init);
        writer.apply_watcher_event(&Event::InitApply(node("w1")));
        assert!(cache.get("w1").is_none(), "not listed yet");
        writer.apply_watcher_event(&Event::InitDone);
        let found = cache.get("w1").expect("listed");
        assert_eq!(
            found.spec.as_ref().and_then(|s| s.provider_id.as_deref()),
            Some("fsas-cdi://w1")
        );
        assert!(cache.get("w2").is_none(), "a Node the cache does not show");
        // An operator started again lends its own cache in place of the last one.
        let (store, mut writer) = reflector::store::<Node>();
        cache.serve_from(store);
        writer.apply_watcher_event(&Event::Init);
        writer.apply_watcher_event(&Event::InitApply(node("w2")));
        writer.apply_watcher_event(&Event::InitDone);
        assert!(cache.get("w1").is_none(), "the earlier cache is not read");
        assert!(cache.get("w2").is_some());
    }
}
