//! The machine behind a node, remembered on each ComposableResource so that its device
//! can be released after the Node object is gone (docs/behaviour.md §4, "Target node
//! gone"; docs/troubleshooting.md).
//!
//! A provider finds the fabric machine of a node through the Node: its `spec.providerID`
//! or the `machine.openshift.io/machine` annotation that leads to a Machine (for FTI,
//! docs/fti-fabric-api.md). When an administrator deletes the Node those are lost, and
//! with them the only way to detach the node's devices. So before the first attach the
//! operator copies them from the Node into the annotation [`ANNOTATION_NODE_MACHINE`] of
//! the ComposableResource, and [`RememberingCluster`] — the cluster view the provider
//! reads through — answers a lookup of a Node that no longer exists with a stand-in
//! built from what a resource remembered. Remove calls and the upstream sync's device
//! listing then reach that machine as before.
//!
//! An annotation (not a spec or status field) keeps the objects valid under the Go
//! operator's CRD, so switching back and forth stays possible.

use std::collections::BTreeMap;

use cro_api::ComposableResource;
use cro_runtime::cluster::{BoxFuture, ClusterError, ClusterReader, KubeCluster};
use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use kube::api::{Api, ListParams};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::node_cache::NodeCache;
use super::node_scope::NodeScope;

pub(crate) use cro_api::ANNOTATION_NODE_MACHINE;

/// The Node annotation that names its Machine (OpenShift and Cluster API machines).
pub(crate) const MACHINE_REF_ANNOTATION: &str = "machine.openshift.io/machine";

/// Marks the stand-in Nodes [`RememberingCluster`] makes up, for whoever reads them.
pub(crate) const STAND_IN_ANNOTATION: &str = "cro.hpsys.ibm.ie.com/stand-in-for-deleted-node";

/// What names a node's machine, as the Node said when a device was attached there.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeMachine {
    #[serde(
        rename = "providerID",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub provider_id: Option<String>,
    /// The Node's `machine.openshift.io/machine` annotation (`namespace/name`).
    #[serde(rename = "machine", default, skip_serializing_if = "Option::is_none")]
    pub machine_ref: Option<String>,
    /// The fabric-side machine id a 0.2.0 provider reported when it attached the device;
    /// given back to the provider on every later call, so a detach needs no Node at all.
    #[serde(
        rename = "fabricMachine",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub fabric_machine: Option<String>,
}

impl NodeMachine {
    /// What `node` says about its machine; None when it says nothing.
    pub(crate) fn of_node(node: &Node) -> Option<NodeMachine> {
        let provider_id = node
            .spec
            .as_ref()
            .and_then(|s| s.provider_id.clone())
            .filter(|p| !p.is_empty());
        let machine_ref = node
            .annotations()
            .get(MACHINE_REF_ANNOTATION)
            .filter(|m| !m.is_empty())
            .cloned();
        (provider_id.is_some() || machine_ref.is_some()).then_some(NodeMachine {
            provider_id,
            machine_ref,
            fabric_machine: None,
        })
    }

    /// What `node` says about its machine, with the fabric's machine one of `others`
    /// (resources targeting the node) noted after its attach while the Node said the
    /// same: a node's devices are all on its one machine, so a resource created with it
    /// needs no write of it after its own attach (docs/BENCHMARKS.md, the write budget).
    /// A fabric that answers another machine is noted then, as without it.
    pub(crate) fn of_node_learned<'a>(
        node: &Node,
        others: impl IntoIterator<Item = &'a ComposableResource>,
    ) -> Option<NodeMachine> {
        let mut machine = Self::of_node(node)?;
        machine.fabric_machine = others
            .into_iter()
            .filter(|r| r.spec.target_node == node.name_any())
            .filter_map(NodeMachine::of_resource)
            .find(|m| {
                m.fabric_machine.is_some()
                    && m.provider_id == machine.provider_id
                    && m.machine_ref == machine.machine_ref
            })
            .and_then(|m| m.fabric_machine);
        Some(machine)
    }

    /// The annotation value (compact JSON).
    pub(crate) fn to_annotation(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Reads an annotation value; None when it is not one (edited by hand, say).
    pub(crate) fn from_annotation(value: &str) -> Option<NodeMachine> {
        serde_json::from_str::<NodeMachine>(value).ok().filter(|m| {
            m.provider_id.is_some() || m.machine_ref.is_some() || m.fabric_machine.is_some()
        })
    }

    /// What `resource` remembered about its node's machine.
    pub fn of_resource(resource: &ComposableResource) -> Option<NodeMachine> {
        resource
            .annotations()
            .get(ANNOTATION_NODE_MACHINE)
            .and_then(|v| Self::from_annotation(v))
    }

    /// The machine's id where the provider id carries one (`<scheme>://<id>`).
    #[cfg(test)]
    pub(crate) fn machine_id(&self) -> Option<&str> {
        self.provider_id
            .as_deref()
            .and_then(|p| p.split_once("://"))
            .map(|(_, id)| id.trim_start_matches('/'))
            .filter(|id| !id.is_empty())
    }

    /// A Node named `name` carrying only what names its machine.
    pub(crate) fn stand_in_node(&self, name: &str) -> Value {
        let mut annotations = serde_json::Map::new();
        annotations.insert(STAND_IN_ANNOTATION.into(), json!("true"));
        if let Some(m) = &self.machine_ref {
            annotations.insert(MACHINE_REF_ANNOTATION.into(), json!(m));
        }
        let mut node = json!({
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": name, "annotations": annotations},
            "spec": {},
        });
        if let Some(p) = &self.provider_id {
            node["spec"]["providerID"] = json!(p);
        }
        node
    }
}

/// Per node name, the machine its resources remembered (the first one that did).
pub(crate) fn remembered(resources: &[ComposableResource]) -> BTreeMap<String, NodeMachine> {
    let mut out = BTreeMap::new();
    for r in resources {
        if r.spec.target_node.is_empty() {
            continue;
        }
        if let Some(m) = NodeMachine::of_resource(r) {
            out.entry(r.spec.target_node.clone()).or_insert(m);
        }
    }
    out
}

fn is_node(api_version: &str, kind: &str) -> bool {
    api_version == "v1" && kind == "Node"
}

/// The cluster as the provider reads it, plus stand-ins for deleted Nodes whose
/// machines ComposableResources remembered (see the module comment), with Node lookups
/// answered from the operator's Node cache once it lends it ([`NodeCache`]), and
/// listings of Nodes limited to the nodes the provider serves ([`NodeScope`]).
pub struct RememberingCluster<C> {
    inner: C,
    client: kube::Client,
    nodes: NodeCache,
    scope: NodeScope,
}

impl RememberingCluster<KubeCluster> {
    /// The cluster view `cro run` gives a provider: the API server through `client`,
    /// Node lookups answered first from the cache the operator lends `nodes`
    /// ([`crate::Operator::serving_node_lookups`]).
    pub fn of_api_server(client: kube::Client, nodes: NodeCache) -> Self {
        Self {
            inner: KubeCluster::new(client.clone()),
            client,
            nodes,
            scope: NodeScope::every_node(),
        }
    }
}

impl<C> RememberingCluster<C> {
    /// The same view, its listings of Nodes showing only the nodes `scope` shows (a
    /// provider of the registry: the nodes routed to it).
    pub(crate) fn listing_only(mut self, scope: NodeScope) -> Self {
        self.scope = scope;
        self
    }
}

impl<C: ClusterReader> RememberingCluster<C> {
    async fn remembered(&self) -> Result<BTreeMap<String, NodeMachine>, ClusterError> {
        let api: Api<ComposableResource> = Api::all(self.client.clone());
        let list = api
            .list(&ListParams::default())
            .await
            .map_err(|e| ClusterError::Api(format!("listing ComposableResources: {e}")))?;
        Ok(remembered(&list.items))
    }
}

impl<C: ClusterReader> ClusterReader for RememberingCluster<C> {
    fn get_secret<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<BTreeMap<String, Vec<u8>>, ClusterError>> {
        self.inner.get_secret(namespace, name)
    }

    fn get_object<'a>(
        &'a self,
        api_version: &'a str,
        kind: &'a str,
        namespace: Option<&'a str>,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Value, ClusterError>> {
        Box::pin(async move {
            if is_node(api_version, kind)
                && namespace.is_none()
                && let Some(node) = self.nodes.get(name)
            {
                // k8s-openapi writes apiVersion and kind: it reads as a GET of it.
                return serde_json::to_value(&*node)
                    .map_err(|e| ClusterError::Api(format!("v1 Node {name}: {e}")));
            }
            let found = self
                .inner
                .get_object(api_version, kind, namespace, name)
                .await;
            match found {
                Err(ClusterError::NotFound(what)) if is_node(api_version, kind) => {
                    // Only a Node that is gone is made up, and only from a record.
                    match self.remembered().await {
                        Ok(machines) => match machines.get(name) {
                            Some(m) => {
                                tracing::debug!(
                                    node = name,
                                    "lookup of a deleted Node answered from the machine a resource recorded"
                                );
                                Ok(m.stand_in_node(name))
                            }
                            None => Err(ClusterError::NotFound(what)),
                        },
                        Err(_) => Err(ClusterError::NotFound(what)),
                    }
                }
                other => other,
            }
        })
    }

    fn list_objects<'a>(
        &'a self,
        api_version: &'a str,
        kind: &'a str,
    ) -> BoxFuture<'a, Result<Vec<Value>, ClusterError>> {
        Box::pin(async move {
            let mut objects = self.inner.list_objects(api_version, kind).await?;
            if !is_node(api_version, kind) {
                return Ok(objects);
            }
            objects.retain(|o| {
                o["metadata"]["name"]
                    .as_str()
                    .is_some_and(|n| self.scope.shows(n))
            });
            let listed: std::collections::BTreeSet<String> = objects
                .iter()
                .filter_map(|o| o["metadata"]["name"].as_str().map(str::to_owned))
                .collect();
            // A failure here must not hide the real Nodes' devices: list those alone.
            match self.remembered().await {
                Ok(machines) => objects.extend(
                    machines
                        .iter()
                        .filter(|(node, _)| !listed.contains(*node) && self.scope.shows(node))
                        .map(|(node, m)| m.stand_in_node(node)),
                ),
                Err(e) => {
                    tracing::warn!(error = %e, "cannot add the machines of deleted Nodes to the device listing");
                }
            }
            Ok(objects)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(v: Value) -> Node {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn a_node_s_machine_round_trips_through_the_annotation() {
        let n = node(json!({"metadata": {"name": "w1"}, "spec": {"providerID": "fsas-cdi://m-1"}}));
        let m = NodeMachine::of_node(&n).unwrap();
        assert_eq!(m.machine_id(), Some("m-1"));
        let text = m.to_annotation();
        assert_eq!(text, r#"{"providerID":"fsas-cdi://m-1"}"#);
        assert_eq!(NodeMachine::from_annotation(&text), Some(m.clone()));
        let stand_in = m.stand_in_node("w1");
        assert_eq!(stand_in["spec"]["providerID"], "fsas-cdi://m-1");
        assert_eq!(stand_in["metadata"]["name"], "w1");
        // The stand-in reads back as the same machine.
        assert_eq!(NodeMachine::of_node(&node(stand_in)), Some(m));
    }

    #[test]
    fn openshift_nodes_remember_their_machine_reference() {
        let n = node(json!({"metadata": {"name": "w1",
            "annotations": {"machine.openshift.io/machine": "openshift-machine-api/m0"}}}));
        let m = NodeMachine::of_node(&n).unwrap();
        assert_eq!(m.machine_id(), None);
        let stand_in = m.stand_in_node("w1");
        assert_eq!(
            stand_in["metadata"]["annotations"][MACHINE_REF_ANNOTATION],
            "openshift-machine-api/m0"
        );
    }

    #[test]
    fn a_new_resource_learns_the_fabric_machine_from_another_on_the_same_machine() {
        let n = node(json!({"metadata": {"name": "w1"}, "spec": {"providerID": "fsas-cdi://m-1"}}));
        let resource = |name: &str, target: &str, record: &str| {
            let mut r = ComposableResource::new(
                name,
                serde_json::from_value(
                    json!({"type": "gpu", "model": "A100", "target_node": target}),
                )
                .unwrap(),
            );
            r.metadata.annotations = Some(BTreeMap::from([(
                ANNOTATION_NODE_MACHINE.to_owned(),
                record.to_owned(),
            )]));
            r
        };
        let noted = resource(
            "a",
            "w1",
            r#"{"providerID":"fsas-cdi://m-1","fabricMachine":"fm-1"}"#,
        );
        let unnoted = resource("b", "w1", r#"{"providerID":"fsas-cdi://m-1"}"#);
        // The node was another machine when this one noted it.
        let earlier = resource(
            "c",
            "w1",
            r#"{"providerID":"fsas-cdi://m-0","fabricMachine":"fm-0"}"#,
        );
        let elsewhere = resource(
            "d",
            "w2",
            r#"{"providerID":"fsas-cdi://m-1","fabricMachine":"fm-2"}"#,
        );
        let learned = |others: &[&ComposableResource]| {
            NodeMachine::of_node_learned(&n, others.iter().copied())
                .unwrap()
                .fabric_machine
        };
        assert_eq!(learned(&[&unnoted, &earlier, &noted]), Some("fm-1".into()));
        assert_eq!(learned(&[&unnoted, &earlier, &elsewhere]), None);
        assert_eq!(learned(&[]), None);
        // What the Node says is kept as it is.
        let m = NodeMachine::of_node_learned(&n, [&noted]).unwrap();
        assert_eq!(m.provider_id.as_deref(), Some("fsas-cdi://m-1"));
        // A Node naming no machine records nothing, learned or not.
        let bare = node(json!({"metadata": {"name": "w1"}}));
        assert_eq!(NodeMachine::of_node_learned(&bare, [&noted]), None);
    }

    #[test]
    fn nodes_naming_no_machine_and_foreign_annotations_record_nothing() {
        assert_eq!(
            NodeMachine::of_node(&node(json!({"metadata": {"name": "w1"}}))),
            None
        );
        assert_eq!(NodeMachine::from_annotation("fsas-cdi://x"), None);
        assert_eq!(NodeMachine::from_annotation("{}"), None);
    }
}
