//! From a resource to its ComputerSystem id: the recorded `machine-id` when the host
//! passes one, else the target Node's `spec.providerID`, `redfish://<system id>`.

use std::collections::BTreeMap;

use cro_provider_sdk::nodes::NodeRef;
use cro_provider_sdk::{ComposableResource, Host, ProviderError};

pub const PROVIDER_ID_PREFIX: &str = "redfish://";

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
    system_of_node(&cro_provider_sdk::nodes::get(host, node)?)
}

fn system_of_node(n: &NodeRef) -> Result<String, ProviderError> {
    let provider_id = n.provider_id.as_deref().unwrap_or("");
    let node = &n.name;
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
    Ok(cro_provider_sdk::nodes::list(host)?
        .into_iter()
        .filter_map(|n| Some((system_of_node(&n).ok()?, n.name)))
        .collect())
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
