//! From a resource to its CDIM node, and from the node to the I/O adapter a GPU is
//! connected to. As in the Go client, a Kubernetes Node names its CDIM node by its
//! `spec.providerID`, verbatim; the recorded `machine-id` of a resource wins.

use std::collections::BTreeMap;

use cro_provider_sdk::{ComposableResource, Host, ProviderError};

use crate::client::{Client, Entry, NodeEntry};

/// The CDIM node id of the resource's target node.
pub fn node_of<H: Host + ?Sized>(
    host: &H,
    r: &ComposableResource,
) -> Result<String, ProviderError> {
    if let Some(m) = r
        .machine_id
        .as_deref()
        .map(str::trim)
        .filter(|m| !m.is_empty())
    {
        return Ok(m.to_string());
    }
    let node = &r.target_node;
    cro_provider_sdk::nodes::get(host, node)?
        .provider_id
        .ok_or_else(|| {
            ProviderError::Config(format!(
                "Node {node} has no spec.providerID; with CDIM it must be the node's CDIM id"
            ))
        })
}

/// CDIM node id (lower case) → Kubernetes Node name, for every Node with a providerID.
pub fn names_by_node<H: Host + ?Sized>(
    host: &H,
) -> Result<BTreeMap<String, String>, ProviderError> {
    Ok(cro_provider_sdk::nodes::list(host)?
        .into_iter()
        .filter_map(|n| Some((n.provider_id?.to_ascii_lowercase(), n.name)))
        .collect())
}

/// A node of CDIM and the I/O adapter its GPUs are connected to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Place {
    /// The node's id as CDIM spells it.
    pub node: String,
    pub io_adapter: String,
}

/// The Go client's walk: the node's detected host adapter (`eesv`), the I/O adapter
/// its `destinationFabricAdapter` link names, which must be an `eeio` adapter.
pub fn place_of<H: Host + ?Sized>(
    client: &Client<'_, H>,
    node_id: &str,
) -> Result<Place, ProviderError> {
    let nodes: Vec<NodeEntry> = client.nodes()?;
    let node = nodes
        .into_iter()
        .find(|n| n.id.eq_ignore_ascii_case(node_id))
        .ok_or_else(|| ProviderError::NotFound(format!("CDIM has no node {node_id}")))?;
    let host_adapter = node
        .resources
        .iter()
        .find(|e| e.detected && e.device.is_host_adapter() && !e.device.id.is_empty())
        .map(|e| e.device.id.clone())
        .ok_or_else(|| {
            ProviderError::Config(format!(
                "CDIM node {node_id} has no detected sourceFabricAdapter (eesv) to connect a GPU through"
            ))
        })?;
    let host: Entry = client.resource(&host_adapter)?.ok_or_else(|| {
        ProviderError::NotFound(format!(
            "CDIM lists host adapter {host_adapter} of node {node_id} but does not know it"
        ))
    })?;
    let io_adapter = host
        .device
        .links
        .iter()
        .find(|l| l.kind.eq_ignore_ascii_case(crate::client::IO_ADAPTER) && !l.id.is_empty())
        .map(|l| l.id.clone())
        .ok_or_else(|| {
            ProviderError::Config(format!(
                "host adapter {host_adapter} of node {node_id} links to no destinationFabricAdapter"
            ))
        })?;
    let io = client.resource(&io_adapter)?.ok_or_else(|| {
        ProviderError::NotFound(format!(
            "host adapter {host_adapter} links to {io_adapter}, which CDIM does not know"
        ))
    })?;
    if !io.device.is_io_adapter() {
        return Err(ProviderError::Config(format!(
            "{io_adapter}, linked from host adapter {host_adapter}, is a {} and not an eeio destinationFabricAdapter",
            io.device.kind
        )));
    }
    Ok(Place {
        node: node.id,
        io_adapter,
    })
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
    fn machine_id_then_provider_id_verbatim() {
        let host = TestHost::new()
            .with_node(
                "w0",
                r#"{"metadata": {"name": "w0"}, "spec": {"providerID": "3B4EBEEA-B6DD"}}"#,
            )
            .with_node("bare", r#"{"metadata": {"name": "bare"}, "spec": {}}"#);
        assert_eq!(node_of(&host, &res("w0", None)).unwrap(), "3B4EBEEA-B6DD");
        assert_eq!(node_of(&host, &res("gone", Some("N9"))).unwrap(), "N9");
        assert!(matches!(
            node_of(&host, &res("bare", None)),
            Err(ProviderError::Config(_))
        ));
        assert!(matches!(
            node_of(&host, &res("gone", None)),
            Err(ProviderError::NotFound(_))
        ));
        let names = names_by_node(&host).unwrap();
        assert_eq!(
            names.into_iter().collect::<Vec<_>>(),
            [("3b4ebeea-b6dd".to_string(), "w0".to_string())]
        );
    }
}
