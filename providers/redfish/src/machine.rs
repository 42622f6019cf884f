//! From a resource to its ComputerSystem id: the recorded `machine-id` when the host
//! passes one, else the target Node's `spec.providerID`, `redfish://<system id>`.

use std::collections::BTreeMap;

use serde::Deserialize;

use cro_provider_sdk::{ComposableResource, Host, LookupError, ProviderError};

pub const PROVIDER_ID_PREFIX: &str = "redfish://";

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

/// The resource's system id.
pub fn system_of<H: Host + ?Sized>(
    host: &H,
    r: &ComposableResource,
) -> Result<String, ProviderError> {
    if let Some(m) = r
        .machine_id
        .as_deref()
        .map(str::trim)
        .filter(|m| !m.is_empty())
    {
        return checked(m, &format!("the recorded machine id of {}", r.name));
    }
    let node = &r.target_node;
    let json = host.get_node(node).map_err(|e| match e {
        LookupError::Denied(m) => ProviderError::Denied(format!("looking up Node {node}: {m}")),
        LookupError::NotFound(m) => ProviderError::NotFound(format!("Node {node}: {m}")),
        LookupError::Other(m) => ProviderError::Other(format!("looking up Node {node}: {m}")),
    })?;
    let parsed: Node = serde_json::from_str(&json).map_err(|e| {
        ProviderError::Other(format!("the host returned an unreadable Node {node}: {e}"))
    })?;
    system_of_node(node, &parsed)
}

fn system_of_node(node: &str, n: &Node) -> Result<String, ProviderError> {
    let provider_id = n.spec.provider_id.as_deref().unwrap_or("").trim();
    match provider_id.strip_prefix(PROVIDER_ID_PREFIX) {
        Some(id) if !id.trim().is_empty() => checked(id.trim(), &format!("Node {node}")),
        _ => Err(ProviderError::Config(format!(
            "Node {node} has providerID '{provider_id}', not '{PROVIDER_ID_PREFIX}<system id>'"
        ))),
    }
}

/// A system id is one path segment.
fn checked(id: &str, whose: &str) -> Result<String, ProviderError> {
    if id.contains(['/', '?', '#', '%', ' ', '\\']) || id == "." || id == ".." {
        return Err(ProviderError::Config(format!(
            "{whose} names system '{id}', which is not a Redfish system id"
        )));
    }
    Ok(id.to_string())
}

/// System id -> node name, for every Node whose providerID names a system.
pub fn nodes_by_system<H: Host + ?Sized>(
    host: &H,
) -> Result<BTreeMap<String, String>, ProviderError> {
    let nodes = host.list_nodes().map_err(|e| match e {
        LookupError::Denied(m) => ProviderError::Denied(format!("listing Nodes: {m}")),
        LookupError::NotFound(m) | LookupError::Other(m) => {
            ProviderError::Other(format!("listing Nodes: {m}"))
        }
    })?;
    let mut out = BTreeMap::new();
    for json in &nodes {
        let Ok(n) = serde_json::from_str::<Node>(json) else {
            continue;
        };
        let Some(name) = n.metadata.name.clone().filter(|n| !n.is_empty()) else {
            continue;
        };
        if let Ok(system) = system_of_node(&name, &n) {
            out.insert(system, name);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use cro_provider_sdk::DeviceType;
    use cro_provider_sdk::testing::TestHost;

    fn res(node: &str, machine: Option<&str>) -> ComposableResource {
        ComposableResource {
            name: "gpu-1".into(),
            device_type: DeviceType::Gpu,
            model: "m".into(),
            target_node: node.into(),
            device_id: None,
            fabric_device_id: None,
            machine_id: machine.map(str::to_string),
            force_detach: false,
        }
    }

    #[test]
    fn machine_id_then_provider_id() {
        let host = TestHost::new()
            .with_node(
                "w0",
                r#"{"metadata": {"name": "w0"}, "spec": {"providerID": "redfish://sys-0"}}"#,
            )
            .with_node(
                "kind",
                r#"{"metadata": {"name": "kind"}, "spec": {"providerID": "kind://docker/x"}}"#,
            )
            .with_node(
                "bad",
                r#"{"metadata": {"name": "bad"}, "spec": {"providerID": "redfish://a/b"}}"#,
            );
        assert_eq!(system_of(&host, &res("w0", None)).unwrap(), "sys-0");
        assert_eq!(
            system_of(&host, &res("gone", Some("sys-9"))).unwrap(),
            "sys-9"
        );
        assert!(
            matches!(system_of(&host, &res("kind", None)), Err(ProviderError::Config(m)) if m.contains("kind"))
        );
        assert!(matches!(
            system_of(&host, &res("bad", None)),
            Err(ProviderError::Config(_))
        ));
        assert!(matches!(
            system_of(&host, &res("gone", None)),
            Err(ProviderError::NotFound(_))
        ));
        let map = nodes_by_system(&host).unwrap();
        assert_eq!(
            map.into_iter().collect::<Vec<_>>(),
            [("sys-0".to_string(), "w0".to_string())]
        );
    }
}
