//! Check (a GPU's health), the listing of every GPU connected to the cluster's
//! nodes, and the free pool.

use cro_provider_sdk::{
    ComposableResource, DeviceInfo, DeviceType, FabricPool, FreeDevices, Host, LogLevel,
    PoolOutcome, PoolQuery, ProviderError,
};

use crate::client::Client;
use crate::node::names_by_node;

/// Ok when the GPU is detected, connected, `Enabled` and `OK` (the Go client's test);
/// `warning` / `critical` for those healths or another state, `not-found` when CDIM
/// does not know it, does not detect it, or it is connected to nothing.
pub fn check<H: Host + ?Sized>(
    client: &Client<'_, H>,
    r: &ComposableResource,
) -> Result<(), ProviderError> {
    let Some(gpu) = r
        .fabric_device_id
        .as_deref()
        .map(str::trim)
        .filter(|g| !g.is_empty())
    else {
        return Err(ProviderError::NotFound(format!(
            "{} names no CDIM device to check",
            r.name
        )));
    };
    let Some(e) = client.resource(gpu)? else {
        return Err(ProviderError::NotFound(format!(
            "CDIM does not know device {gpu}"
        )));
    };
    if !e.detected {
        return Err(ProviderError::NotFound(format!(
            "CDIM no longer detects GPU {gpu}"
        )));
    }
    if e.device.connected_to().is_none() {
        return Err(ProviderError::NotFound(format!(
            "GPU {gpu} is connected to no node"
        )));
    }
    if e.device.healthy() {
        return Ok(());
    }
    let (state, health) = (&e.device.status.state, &e.device.status.health);
    let what = format!("GPU {gpu} reports state {state:?}, health {health:?}");
    if health.eq_ignore_ascii_case("critical") {
        Err(ProviderError::Critical(what))
    } else {
        Err(ProviderError::Warning(what))
    }
}

/// Every detected GPU on a CDIM node a Kubernetes Node names (by `spec.providerID`);
/// nodes of no Kubernetes Node are not the cluster's and are skipped, as the Go client
/// does.
pub fn list<H: Host + ?Sized>(client: &Client<'_, H>) -> Result<Vec<DeviceInfo>, ProviderError> {
    let nodes = client.nodes()?;
    let names = names_by_node(client.host())?;
    let mut out = Vec::new();
    for node in nodes {
        if node.id.is_empty() {
            continue;
        }
        let Some(name) = names.get(&node.id.to_ascii_lowercase()) else {
            client.host().log(
                LogLevel::Debug,
                &format!("CDIM node {} is no Node's providerID: skipped", node.id),
            );
            continue;
        };
        for e in &node.resources {
            if !e.detected || !e.device.is_gpu() || e.device.id.is_empty() {
                continue;
            }
            out.push(DeviceInfo {
                node: name.clone(),
                machine_id: node.id.clone(),
                device_type: DeviceType::Gpu,
                model: e.device.model.clone(),
                device_id: client.cfg.device_id(&e.device.id),
                fabric_device_id: e.device.id.clone(),
            });
        }
    }
    Ok(out)
}

/// The id of the one pool CDIM is: any free GPU can be connected to any of its nodes.
pub const POOL_ID: &str = "cdim";

/// The GPUs an attach could take (detected, healthy, connected to nothing; model
/// compared like an attach: trimmed, case-insensitive), counted per asked kind; one
/// pool reaching every asked Node whose providerID is a CDIM node.
pub fn pool<H: Host + ?Sized>(
    client: &Client<'_, H>,
    query: &PoolQuery,
) -> Result<PoolOutcome, ProviderError> {
    let names = names_by_node(client.host())?;
    let nodes: Vec<String> = client
        .nodes()?
        .iter()
        .filter_map(|n| names.get(&n.id.to_ascii_lowercase()))
        .filter(|name| query.nodes.contains(name))
        .cloned()
        .collect();
    let resources = client.resources()?;
    let free = query
        .kinds
        .iter()
        .map(|kind| {
            let count = if kind.device_type == DeviceType::Gpu {
                resources
                    .iter()
                    .filter(|e| {
                        e.detected
                            && e.device.is_gpu()
                            && !e.device.id.is_empty()
                            && e.device.connected_to().is_none()
                            && e.node_ids.is_empty()
                            && e.device.healthy()
                            && e.device
                                .model
                                .trim()
                                .eq_ignore_ascii_case(kind.model.trim())
                    })
                    .count()
            } else {
                // CDIM composes GPUs only.
                0
            };
            FreeDevices {
                kind: kind.clone(),
                count: u32::try_from(count).unwrap_or(u32::MAX),
                sizes: Vec::new(),
            }
        })
        .collect();
    Ok(PoolOutcome::Pools(vec![FabricPool {
        id: POOL_ID.to_string(),
        nodes,
        free,
    }]))
}
