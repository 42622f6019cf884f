//! Keeping the registry equal to the `CdiProvider` objects: each change is fetched,
//! loaded, validated and swapped in (or refused, leaving the previous instance serving),
//! and the object's status written (docs/providers.md, "Hot reload").

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use cro_api::{CallCounts, CdiProvider, ComposableResource, LABEL_PROVIDER};
use cro_runtime::{Runtime, RuntimeOptions};
use futures::StreamExt;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Resource, ResourceExt};

use super::load::{self, LoadError};
use super::route::RouteEntry;
use super::status::{self, Observed, Serving};
use super::{Registry, Slot};
use crate::source::{self, FetchOptions};

/// The finalizer a `CdiProvider` keeps while it serves attached devices.
pub(crate) const FINALIZER: &str = "cro.hpsys.ibm.ie.com/cdiprovider";

/// How the registry loads providers.
#[derive(Clone, Debug)]
pub(crate) struct WatchOptions {
    pub(crate) fetch: FetchOptions,
    /// Namespaces a `CdiProvider` may grant a Secret from.
    pub(crate) allowed_secret_namespaces: Vec<String>,
    /// How often every provider is looked at again: its status (call counts) refreshed,
    /// a ConfigMap source re-read for new bytes, a blocked deletion re-checked.
    pub(crate) resync: Duration,
    pub(crate) controller_name: String,
}

/// What the registry last did with one object.
#[derive(Default)]
struct Known {
    /// The spec parts that make a component (source, config, grants, limits), as JSON.
    key: String,
    digest: Option<String>,
    serving: Option<Serving>,
    failure: Option<(String, String)>,
    /// The digest whose load failed under `key` (not loaded again).
    failed_digest: Option<String>,
}

struct Watcher {
    registry: Arc<Registry>,
    client: kube::Client,
    runtime: Runtime,
    options: WatchOptions,
    known: HashMap<String, Known>,
    objects: HashMap<String, CdiProvider>,
    recorder: Recorder,
}

fn component_key(p: &CdiProvider) -> String {
    serde_json::json!([p.spec.source, p.spec.config, p.spec.grants, p.spec.limits]).to_string()
}

/// Runs until the watch ends (never, normally): the caller drops it to stop.
pub(crate) async fn run(registry: Arc<Registry>, client: kube::Client, options: WatchOptions) {
    let runtime = match Runtime::new(RuntimeOptions::default()) {
        Ok(r) => r,
        Err(e) => {
            tracing::error!(error = %e, "provider registry: cannot start the runtime");
            return;
        }
    };
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: options.controller_name.clone(),
            instance: std::env::var("POD_NAME").ok(),
        },
    );
    let mut w = Watcher {
        registry,
        client: client.clone(),
        runtime,
        options,
        known: HashMap::new(),
        objects: HashMap::new(),
        recorder,
    };
    let api: Api<CdiProvider> = Api::all(client);
    let mut events = std::pin::pin!(watcher(api, watcher::Config::default()).default_backoff());
    let mut tick = tokio::time::interval(w.options.resync);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut held = w.registry.tenure().announced();
    let mut listing: Option<Vec<CdiProvider>> = None;
    loop {
        tokio::select! {
            // A provider newly held here: its status (and finalizer) are this replica's
            // to write from now on.
            Ok(()) = held.changed() => {
                let all: Vec<CdiProvider> = w.objects.values().cloned().collect();
                for o in all {
                    w.reconcile(o, false).await;
                }
            }
            event = events.next() => match event {
                None => return,
                Some(Err(e)) => tracing::debug!(error = %e, "CdiProvider watch interrupted"),
                // A list of every object (the first, or a new one after the watch lost
                // its place) is read whole before any of it is routed or loaded.
                Some(Ok(watcher::Event::Init)) => listing = Some(Vec::new()),
                Some(Ok(watcher::Event::InitApply(o))) => match listing.as_mut() {
                    Some(read) => read.push(o),
                    None => w.reconcile(o, false).await,
                },
                // Only a list that began is complete: an end without a beginning is no
                // list, and would forget every provider.
                Some(Ok(watcher::Event::InitDone)) => {
                    if let Some(read) = listing.take() {
                        w.listed(read).await;
                    }
                }
                Some(Ok(watcher::Event::Apply(o))) => w.reconcile(o, false).await,
                Some(Ok(watcher::Event::Delete(o))) => w.forget(&o.name_any()),
            },
            _ = tick.tick() => {
                let all: Vec<CdiProvider> = w.objects.values().cloned().collect();
                for o in all {
                    w.reconcile(o, true).await;
                }
            }
        }
    }
}

/// Where `object` routes.
fn route_entry(object: &CdiProvider) -> RouteEntry {
    RouteEntry {
        name: object.name_any(),
        selector: object.spec.node_selector.clone(),
        default: object.spec.default,
    }
}

/// The providers `known` holds that a complete list, `listed`, no longer shows: deleted
/// while the watch was away.
fn gone_from<'a>(known: impl Iterator<Item = &'a String>, listed: &[CdiProvider]) -> Vec<String> {
    let listed: HashSet<String> = listed.iter().map(ResourceExt::name_any).collect();
    known.filter(|n| !listed.contains(*n)).cloned().collect()
}

impl Watcher {
    /// A complete list of the objects: every provider's routing is set before any is
    /// loaded, and only then are calls routed (a call routed by part of the list could
    /// go to a default provider for a node another one selects, or take the first
    /// provider read for the only one). Providers the list no longer shows are
    /// forgotten.
    async fn listed(&mut self, listed: Vec<CdiProvider>) {
        for name in gone_from(self.objects.keys(), &listed) {
            self.forget(&name);
        }
        for object in &listed {
            self.registry.upsert(route_entry(object));
        }
        self.registry.all_known();
        for object in listed {
            self.reconcile(object, false).await;
        }
    }

    fn forget(&mut self, name: &str) {
        self.known.remove(name);
        self.objects.remove(name);
        if self.registry.remove(name).is_some() {
            tracing::info!(provider = name, "provider removed");
        }
    }

    async fn reconcile(&mut self, object: CdiProvider, resync: bool) {
        let name = object.name_any();
        self.objects.insert(name.clone(), object.clone());
        let slot = self.registry.upsert(route_entry(&object));
        // Every replica loads every provider (any of them may take its Lease); only the
        // one holding it writes its status, finalizer and Events: its call counts are
        // the ones that mean something, and replicas would overwrite each other.
        let writes = self.registry.tenure().check(&name).is_ok();
        if object.metadata.deletion_timestamp.is_some() {
            if writes {
                self.deleting(&object, &slot).await;
            }
            return;
        }
        if writes && !object.finalizers().iter().any(|f| f == FINALIZER) {
            self.add_finalizer(&object).await;
        }
        let key = component_key(&object);
        let known = self.known.remove(&name).unwrap_or_default();
        let is_config_map = object.spec.source.config_map.is_some();
        let fetch_failed = known
            .failure
            .as_ref()
            .is_some_and(|(reason, _)| reason == cro_api::reasons::FETCH_FAILED);
        // A watch event for the same component spec (our own status write, a label)
        // loads nothing. At a resync, a ConfigMap is re-read for new bytes and a failed
        // fetch is retried; a component that failed to load is not retried until its
        // spec or bytes change (loading costs seconds of CPU).
        let must_apply = known.key != key
            || (known.serving.is_none() && known.failure.is_none())
            || (resync && (is_config_map || fetch_failed));
        let generation_reported = object.status.as_ref().and_then(|s| s.observed_generation)
            == object.metadata.generation;
        let known = if must_apply {
            self.apply(&object, &slot, key, known).await
        } else {
            known
        };
        let (calls, failed) = slot.counts();
        let observed = Observed {
            generation: object.metadata.generation,
            serving: known.serving.clone(),
            failure: known.failure.clone(),
            calls: CallCounts {
                total: calls,
                failed,
            },
        };
        self.known.insert(name.clone(), known);
        // Status is written when something was done or at a resync (call counts), not
        // for every event: each write is itself an event.
        if writes && (must_apply || resync || !generation_reported) {
            self.write_status(&object, &observed).await;
        }
    }

    /// Fetches and, when the bytes or the spec changed, loads and swaps in the component.
    async fn apply(
        &self,
        object: &CdiProvider,
        slot: &Slot,
        key: String,
        mut known: Known,
    ) -> Known {
        let name = object.name_any();
        match self.load(object, &key, &known).await {
            Ok(None) => {
                known.failure = None;
            }
            Ok(Some((provider, digest))) => {
                let serving = Serving::of(&provider, &digest);
                slot.swap(provider);
                tracing::info!(provider = %name, digest = %digest, contract = %serving.contract, "provider loaded");
                known.serving = Some(serving);
                known.digest = Some(digest);
                known.failure = None;
            }
            Err((e, digest)) => {
                known.failed_digest = digest;
                tracing::warn!(provider = %name, error = %e, "provider not (re)loaded; the previous component, if any, keeps serving");
                if known.failure.as_ref().map(|f| &f.1) != Some(&e.to_string()) {
                    self.event(
                        object,
                        EventType::Warning,
                        e.reason(),
                        "Load",
                        e.to_string(),
                    )
                    .await;
                }
                known.failure = Some((e.reason().to_owned(), e.to_string()));
            }
        }
        known.key = key;
        known
    }

    /// The new instance, or None when the fetched bytes and the spec are what serves.
    async fn load(
        &self,
        object: &CdiProvider,
        key: &str,
        known: &Known,
    ) -> Result<Option<(Arc<cro_runtime::Provider>, String)>, (LoadError, Option<String>)> {
        let name = object.name_any();
        let early = |e: LoadError| (e, None);
        load::check_secret_namespace(&object.spec, &self.options.allowed_secret_namespaces)
            .map_err(early)?;
        let spec = load::provider_spec(&name, &object.spec).map_err(early)?;
        let fetched = source::fetch(&self.client, &object.spec.source, &self.options.fetch)
            .await
            .map_err(|e| early(e.into()))?;
        if known.key == key
            && known.digest.as_deref() == Some(fetched.digest.as_str())
            && known.serving.is_some()
        {
            return Ok(None);
        }
        if known.key == key
            && known.failed_digest.as_deref() == Some(fetched.digest.as_str())
            && let Some((reason, message)) = &known.failure
        {
            return Err((
                LoadError::Repeated {
                    reason: reason.clone(),
                    message: message.clone(),
                },
                Some(fetched.digest),
            ));
        }
        let digest = fetched.digest.clone();
        let wiring = load::Wiring {
            fence: self.registry.fence(&name),
            nodes: self.registry.node_cache().cloned().unwrap_or_default(),
            scope: self.registry.scope_of(&name),
        };
        let loaded = load::instantiate(&self.client, &self.runtime, &spec, fetched, wiring)
            .await
            .map_err(|e| (e, Some(digest)))?;
        Ok(Some((loaded.provider, loaded.digest)))
    }

    async fn write_status(&self, object: &CdiProvider, observed: &Observed) {
        let previous = object
            .status
            .as_ref()
            .map(|s| s.conditions.clone())
            .unwrap_or_default();
        let status = status::status(observed, &previous);
        let mut value = match serde_json::to_value(&status) {
            Ok(v) => v,
            Err(e) => {
                tracing::warn!(error = %e, "cannot serialize a CdiProvider status");
                return;
            }
        };
        // A merge patch keeps fields it does not name: clear the ones now unset.
        if let Some(map) = value.as_object_mut() {
            for field in [
                "lastError",
                "loadedDigest",
                "contractVersion",
                "describe",
                "capabilities",
            ] {
                map.entry(field).or_insert(serde_json::Value::Null);
            }
        }
        if object.status.as_ref() == Some(&status) {
            return;
        }
        let api: Api<CdiProvider> = Api::all(self.client.clone());
        if let Err(e) = api
            .patch_status(
                &object.name_any(),
                &PatchParams::default(),
                &Patch::Merge(serde_json::json!({ "status": value })),
            )
            .await
        {
            tracing::warn!(provider = %object.name_any(), error = %crate::text::kube_error(&e), "cannot write CdiProvider status");
        }
    }

    async fn add_finalizer(&self, object: &CdiProvider) {
        let mut finalizers = object.finalizers().to_vec();
        finalizers.push(FINALIZER.to_owned());
        self.set_finalizers(object, finalizers).await;
    }

    async fn set_finalizers(&self, object: &CdiProvider, finalizers: Vec<String>) {
        let api: Api<CdiProvider> = Api::all(self.client.clone());
        // The resource version makes this a compare-and-swap: a concurrent change wins
        // and the next event brings it here again.
        let patch = serde_json::json!({
            "metadata": {
                "finalizers": finalizers,
                "resourceVersion": object.resource_version(),
            }
        });
        if let Err(e) = api
            .patch(
                &object.name_any(),
                &PatchParams::default(),
                &Patch::Merge(patch),
            )
            .await
        {
            tracing::debug!(provider = %object.name_any(), error = %crate::text::kube_error(&e), "cannot update CdiProvider finalizers");
        }
    }

    /// A provider being deleted keeps serving (and its finalizer) while any resource on a
    /// node it serves holds a device; it says which.
    async fn deleting(&mut self, object: &CdiProvider, slot: &Slot) {
        let name = object.name_any();
        if !object.finalizers().iter().any(|f| f == FINALIZER) {
            return;
        }
        let resources: Api<ComposableResource> = Api::all(self.client.clone());
        let list = match resources.list(&ListParams::default()).await {
            Ok(l) => l.items,
            Err(e) => {
                tracing::warn!(provider = %name, error = %crate::text::kube_error(&e), "cannot list resources for a provider's deletion");
                return;
            }
        };
        let blocking = blocking_devices(&self.registry, &name, &list);
        if blocking.is_empty() {
            let rest: Vec<String> = object
                .finalizers()
                .iter()
                .filter(|f| *f != FINALIZER)
                .cloned()
                .collect();
            self.set_finalizers(object, rest).await;
            tracing::info!(provider = %name, "provider deleted: no device it serves is attached");
            return;
        }
        let message = format!(
            "deletion waits: devices still attached through this provider: {}",
            blocking.join(", ")
        );
        let known = self.known.entry(name.clone()).or_default();
        let changed = known.failure.as_ref().map(|f| &f.1) != Some(&message);
        known.failure = Some(("DeletionBlocked".into(), message.clone()));
        let (calls, failed) = slot.counts();
        let observed = Observed {
            generation: object.metadata.generation,
            serving: known.serving.clone(),
            failure: known.failure.clone(),
            calls: CallCounts {
                total: calls,
                failed,
            },
        };
        if changed {
            self.event(
                object,
                EventType::Warning,
                "DeletionBlocked",
                "Delete",
                message,
            )
            .await;
        }
        self.write_status(object, &observed).await;
    }

    async fn event(
        &self,
        object: &CdiProvider,
        type_: EventType,
        reason: &str,
        action: &str,
        note: String,
    ) {
        let mut note = note;
        if note.len() > 1000 {
            let mut cut = 1000;
            while !note.is_char_boundary(cut) {
                cut -= 1;
            }
            note.truncate(cut);
        }
        let regarding: ObjectReference = object.object_ref(&());
        let event = Event {
            type_,
            reason: reason.to_owned(),
            note: Some(note),
            action: action.to_owned(),
            secondary: None,
        };
        if let Err(e) = self.recorder.publish(&event, &regarding).await {
            tracing::debug!(error = %crate::text::kube_error(&e), "cannot publish a CdiProvider event");
        }
    }
}

/// The resources (`name (device id)`) holding a device that `provider` serves: labelled
/// with it (their device is on its fabric, wherever their node routes now, and with
/// their Node gone) or on a node it serves.
pub(crate) fn blocking_devices(
    registry: &Registry,
    provider: &str,
    resources: &[ComposableResource],
) -> Vec<String> {
    resources
        .iter()
        .filter_map(|r| {
            let device = r.device_id()?;
            let serves = r
                .labels()
                .get(LABEL_PROVIDER)
                .is_some_and(|p| p == provider)
                || registry
                    .route(&r.spec.target_node)
                    .is_ok_and(|n| n == provider);
            serves.then(|| format!("{} ({device})", r.name_any()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_complete_list_forgets_the_providers_it_no_longer_shows() {
        let provider = |name: &str| {
            let mut p: CdiProvider = serde_json::from_value(serde_json::json!({
                "apiVersion": "cro.hpsys.ibm.ie.com/v1alpha1", "kind": "CdiProvider",
                "metadata": {"name": "x"},
                "spec": {"source": {}, "grants": {}, "limits": {}},
            }))
            .expect("a CdiProvider");
            p.metadata.name = Some(name.to_owned());
            p
        };
        let known = [
            "fabric-a".to_owned(),
            "fabric-b".to_owned(),
            "fabric-c".to_owned(),
        ];
        let listed = [provider("fabric-b"), provider("fabric-d")];
        assert_eq!(
            gone_from(known.iter(), &listed),
            ["fabric-a".to_owned(), "fabric-c".to_owned()]
        );
        assert!(gone_from(known.iter(), &[]).len() == 3);
        assert!(gone_from([].iter(), &listed).is_empty());
    }
}
