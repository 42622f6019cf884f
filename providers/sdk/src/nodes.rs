//! Kubernetes Nodes through the host's lookups, reduced to what a provider maps to its
//! fabric's machines: the name and `spec.providerID`. Lookup failures become typed
//! provider errors naming the Node.

use serde::Deserialize;

use crate::host::{Host, LookupError};
use crate::model::ProviderError;

/// A Node as a provider sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeRef {
    pub name: String,
    /// `spec.providerID`, trimmed; None when absent or empty.
    pub provider_id: Option<String>,
}

#[derive(Deserialize, Default)]
struct Node {
    #[serde(default)]
    metadata: Metadata,
    #[serde(default)]
    spec: Spec,
}

#[derive(Deserialize, Default)]
struct Metadata {
    name: Option<String>,
}

#[derive(Deserialize, Default)]
struct Spec {
    #[serde(rename = "providerID")]
    provider_id: Option<String>,
}

fn node_ref(json: &str, fallback_name: Option<&str>) -> Option<NodeRef> {
    let n: Node = serde_json::from_str(json).ok()?;
    let name = n
        .metadata
        .name
        .filter(|n| !n.is_empty())
        .or_else(|| fallback_name.map(str::to_string))?;
    let provider_id = n
        .spec
        .provider_id
        .map(|p| p.trim().to_string())
        .filter(|p| !p.is_empty());
    Some(NodeRef { name, provider_id })
}

/// The Node `name` (the provider needs the `lookup` grant for `v1/Node`).
pub fn get<H: Host + ?Sized>(host: &H, name: &str) -> Result<NodeRef, ProviderError> {
    let json = host.get_node(name).map_err(|e| match e {
        LookupError::Denied(m) => ProviderError::Denied(format!("looking up Node {name}: {m}")),
        LookupError::NotFound(m) => ProviderError::NotFound(format!("Node {name}: {m}")),
        LookupError::Other(m) => ProviderError::Other(format!("looking up Node {name}: {m}")),
    })?;
    node_ref(&json, Some(name))
        .ok_or_else(|| ProviderError::Other(format!("the host returned an unreadable Node {name}")))
}

/// Every Node the host lists; one it cannot read is left out.
pub fn list<H: Host + ?Sized>(host: &H) -> Result<Vec<NodeRef>, ProviderError> {
    let nodes = host.list_nodes().map_err(|e| match e {
        LookupError::Denied(m) => ProviderError::Denied(format!("listing Nodes: {m}")),
        LookupError::NotFound(m) | LookupError::Other(m) => {
            ProviderError::Other(format!("listing Nodes: {m}"))
        }
    })?;
    Ok(nodes.iter().filter_map(|j| node_ref(j, None)).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::TestHost;

    #[test]
    fn nodes_with_and_without_a_provider_id() {
        let host = TestHost::new()
            .with_node(
                "w1",
                r#"{"metadata": {"name": "w1"}, "spec": {"providerID": " cdim-node-1 "}}"#,
            )
            .with_node(
                "w2",
                r#"{"metadata": {"name": "w2"}, "spec": {"providerID": "  "}}"#,
            )
            .with_node("w3", "not a Node");
        assert_eq!(
            get(&host, "w1").unwrap(),
            NodeRef {
                name: "w1".into(),
                provider_id: Some("cdim-node-1".into())
            }
        );
        assert_eq!(get(&host, "w2").unwrap().provider_id, None);
        assert!(
            matches!(get(&host, "nope"), Err(ProviderError::NotFound(m)) if m.contains("nope"))
        );
        assert!(
            matches!(get(&host, "w3"), Err(ProviderError::Other(m)) if m.contains("unreadable"))
        );
        let mut all = list(&host).unwrap();
        all.sort_by(|a, b| a.name.cmp(&b.name));
        assert_eq!(all.len(), 2, "the unreadable one is left out: {all:?}");
        assert_eq!(all[0].provider_id.as_deref(), Some("cdim-node-1"));
    }
}
