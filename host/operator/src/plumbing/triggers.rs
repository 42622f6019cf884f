//! What wakes a controller besides its own objects: secondary watches whose errors stay
//! their own, and the Node changes each controller cares about.
//!
//! Kubelets, device plugins and node feature discovery write their Node often (its
//! conditions, its capacity as GPUs come and go, labels). A trigger that woke every
//! object on a node for each of those writes would have each resource on it checked
//! again (one fabric call per device) and each request on it mirrored again, for
//! nothing: on a node with 40 GPUs, 40 attaches would wake 40 × 40 reconciles. So each
//! controller names what it reads of a Node (a fingerprint), and a Node is passed on
//! only when it first appears, when its fingerprint changes, and when it goes —
//! including a deletion the watch missed while it was reconnecting (the next listing
//! lacks the Node).

use std::collections::{HashMap, HashSet};
use std::hash::{DefaultHasher, Hash, Hasher};

use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event, watcher as watch};
use kube::{Resource, ResourceExt};

use crate::provider::node_machine::NodeMachine;

/// A watch that only wakes objects (Pods, Nodes): its errors are logged and retried
/// with its own backoff, never handed to the controller. The controller backs off its
/// whole merged trigger stream on any error, so a watch that keeps failing (a missing
/// `watch` verb, say) would otherwise starve the controller's own watch: no reconcile
/// would ever run, and the controller could not even shut down, since it waits for that
/// store to be ready.
pub(crate) fn secondary<K>(
    controller: &'static str,
    events: impl Stream<Item = Result<K, watcher::Error>> + Send + 'static,
) -> impl Stream<Item = Result<K, watcher::Error>> + Send + 'static
where
    K: Resource<DynamicType = ()> + Send + 'static,
{
    events.filter_map(move |event| async move {
        match event {
            Ok(object) => Some(Ok(object)),
            Err(e) => {
                tracing::warn!(controller, kind = %K::kind(&()), error = %e, "watch failed; retrying with backoff");
                None
            }
        }
    })
}

/// Every object of a watch that changed (added, modified, deleted).
pub(crate) fn touched<K>(
    api: Api<K>,
    config: watcher::Config,
) -> impl Stream<Item = Result<K, watcher::Error>> + Send + 'static
where
    K: Resource<DynamicType = ()> + Clone + std::fmt::Debug + serde::de::DeserializeOwned,
    K: Send + 'static,
{
    watch(api, config).default_backoff().touched_objects()
}

/// What a ComposableResource reads of its Node: that it exists (this one, not an
/// earlier Node of the same name), the machine it names, and its labels (which
/// provider serves it).
pub(crate) fn resource_view(node: &Node) -> u64 {
    let mut h = DefaultHasher::new();
    node.uid().hash(&mut h);
    NodeMachine::of_node(node)
        .map(|m| m.to_annotation())
        .hash(&mut h);
    node.metadata.labels.hash(&mut h);
    h.finish()
}

/// What a ComposabilityRequest reads of a Node: that it exists and the capacity its
/// placement compares (`views::node_view`).
pub(crate) fn request_view(node: &Node) -> u64 {
    let mut h = DefaultHasher::new();
    node.uid().hash(&mut h);
    let c = crate::decide::views::node_view(node).capacity;
    (c.milli_cpu, c.memory, c.ephemeral_storage, c.pods).hash(&mut h);
    h.finish()
}

/// The names a watch's listing (its first, or one after the stream broke) has shown so
/// far. A listing replaces what was known: whatever it lacks went while the watch was
/// not looking, without a deletion event.
#[derive(Default)]
pub(crate) struct Relisting(Option<HashSet<String>>);

impl Relisting {
    /// A listing starts (`Event::Init`).
    pub(crate) fn start(&mut self) {
        self.0 = Some(HashSet::new());
    }

    /// The listing shows `name` (`Event::InitApply`).
    pub(crate) fn saw(&mut self, name: String) {
        if let Some(names) = &mut self.0 {
            names.insert(name);
        }
    }

    /// The listing is complete (`Event::InitDone`): the `known` names it did not show.
    pub(crate) fn done<'a>(&mut self, known: impl Iterator<Item = &'a String>) -> Vec<String> {
        let listed = self.0.take().unwrap_or_default();
        known.filter(|n| !listed.contains(*n)).cloned().collect()
    }
}

/// The fingerprints of the Nodes seen, and the listing under way.
#[derive(Default)]
struct Seen {
    views: HashMap<String, u64>,
    listing: Relisting,
}

impl Seen {
    /// The Nodes to pass on for one watch event.
    fn on(&mut self, event: Event<Node>, view: fn(&Node) -> u64) -> Vec<Node> {
        match event {
            Event::Init => {
                self.listing.start();
                Vec::new()
            }
            Event::InitApply(node) => {
                self.listing.saw(node.name_any());
                self.apply(node, view)
            }
            Event::InitDone => {
                let gone = self.listing.done(self.views.keys());
                gone.into_iter()
                    .map(|name| {
                        self.views.remove(&name);
                        // Only its name is known any more; that is all the mappers read.
                        Node {
                            metadata: ObjectMeta {
                                name: Some(name),
                                ..ObjectMeta::default()
                            },
                            ..Node::default()
                        }
                    })
                    .collect()
            }
            Event::Apply(node) => self.apply(node, view),
            Event::Delete(node) => {
                self.views.remove(&node.name_any());
                vec![node]
            }
        }
    }

    fn apply(&mut self, node: Node, view: fn(&Node) -> u64) -> Vec<Node> {
        let fingerprint = view(&node);
        match self.views.insert(node.name_any(), fingerprint) {
            Some(before) if before == fingerprint => Vec::new(),
            _ => vec![node],
        }
    }
}

/// The Nodes whose `view` changed: new, changed in what `view` reads, or gone.
pub(crate) fn node_changes(
    api: Api<Node>,
    view: fn(&Node) -> u64,
) -> impl Stream<Item = Result<Node, watcher::Error>> + Send + 'static {
    let mut seen = Seen::default();
    watch(api, watcher::Config::default())
        .default_backoff()
        .flat_map(move |event| {
            let out: Vec<Result<Node, watcher::Error>> = match event {
                Ok(event) => seen.on(event, view).into_iter().map(Ok).collect(),
                Err(e) => vec![Err(e)],
            };
            futures::stream::iter(out)
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{NodeSpec, NodeStatus};
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use std::collections::BTreeMap;

    fn node(name: &str, uid: &str) -> Node {
        Node {
            metadata: ObjectMeta {
                name: Some(name.into()),
                uid: Some(uid.into()),
                ..ObjectMeta::default()
            },
            spec: Some(NodeSpec {
                provider_id: Some(format!("fsas-cdi://{name}")),
                ..NodeSpec::default()
            }),
            ..Node::default()
        }
    }

    fn names(nodes: Vec<Node>) -> Vec<String> {
        nodes.iter().map(|n| n.name_any()).collect()
    }

    #[test]
    fn heartbeats_and_gpu_counts_wake_nobody_new_changed_and_gone_nodes_do() {
        let mut seen = Seen::default();
        let v = resource_view;
        assert_eq!(names(seen.on(Event::Init, v)), Vec::<String>::new());
        assert_eq!(names(seen.on(Event::InitApply(node("a", "1")), v)), ["a"]);
        assert_eq!(names(seen.on(Event::InitApply(node("b", "2")), v)), ["b"]);
        assert!(seen.on(Event::InitDone, v).is_empty());

        // A kubelet's status write (conditions, the GPU count) changes nothing it reads.
        let mut beat = node("a", "1");
        beat.status = Some(NodeStatus {
            capacity: Some(BTreeMap::from([(
                "nvidia.com/gpu".to_owned(),
                Quantity("3".into()),
            )])),
            ..NodeStatus::default()
        });
        assert!(seen.on(Event::Apply(beat), v).is_empty());

        // A label (which provider serves it) does; so does a new Node of the same name.
        let mut labelled = node("a", "1");
        labelled.metadata.labels = Some(BTreeMap::from([("pool".into(), "x".into())]));
        assert_eq!(names(seen.on(Event::Apply(labelled.clone()), v)), ["a"]);
        assert!(seen.on(Event::Apply(labelled), v).is_empty());
        assert_eq!(names(seen.on(Event::Apply(node("a", "9")), v)), ["a"]);

        assert_eq!(names(seen.on(Event::Delete(node("b", "2")), v)), ["b"]);

        // A relisting after a lost connection that lacks a Node: it went meanwhile.
        seen.on(Event::Apply(node("c", "3")), v);
        seen.on(Event::Init, v);
        assert!(seen.on(Event::InitApply(node("a", "9")), v).is_empty());
        assert_eq!(names(seen.on(Event::InitDone, v)), ["c"]);
        // Gone for good: a later listing does not report it again.
        seen.on(Event::Init, v);
        seen.on(Event::InitApply(node("a", "9")), v);
        assert!(seen.on(Event::InitDone, v).is_empty());
    }

    #[test]
    fn requests_are_woken_by_the_capacity_placement_compares_not_by_gpu_counts() {
        let with = |cpu: &str, gpus: &str| {
            let mut n = node("a", "1");
            n.status = Some(NodeStatus {
                capacity: Some(BTreeMap::from([
                    ("cpu".to_owned(), Quantity(cpu.into())),
                    ("nvidia.com/gpu".to_owned(), Quantity(gpus.into())),
                ])),
                ..NodeStatus::default()
            });
            n
        };
        assert_eq!(request_view(&with("8", "0")), request_view(&with("8", "4")));
        assert_ne!(
            request_view(&with("8", "0")),
            request_view(&with("16", "0"))
        );
    }
}
