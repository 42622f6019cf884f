//! Check (a device's health), the listing of every device composed into the
//! cluster's systems, and the free pool.

use cro_provider_sdk::{
    ComposableResource, DeviceInfo, DeviceType, FabricPool, FreeDevices, Host, LogLevel, PoolKind,
    PoolOutcome, PoolQuery, ProviderError,
};

use crate::fabric::Fabric;
use crate::locate::{Located, locate};
use crate::machine::nodes_by_system;
use crate::resources::Composition;

/// Ok when the device's block is composed into the system with health `OK`; `warning`
/// / `critical` for those healths, `not-found` when it is not composed into the system.
pub fn check<H: Host + ?Sized>(
    fabric: &Fabric<'_, H>,
    r: &ComposableResource,
    system: &str,
) -> Result<(), ProviderError> {
    let block = match locate(fabric, r, system)? {
        Located::Nothing => {
            return Err(ProviderError::NotFound(format!(
                "{} names no device to check",
                r.name
            )));
        }
        Located::Gone => {
            return Err(ProviderError::NotFound(format!(
                "the device of {} is not composed into system {system}",
                r.name
            )));
        }
        Located::Block(b) => b,
    };
    let here = block.linked_to(system);
    match block.composition() {
        Composition::Composed if here => {}
        Composition::Composing if here => {
            return Err(ProviderError::Warning(format!(
                "resource block {} is still being composed into system {system}",
                block.id
            )));
        }
        _ => {
            return Err(ProviderError::NotFound(format!(
                "resource block {} is not composed into system {system} (it is {})",
                block.id, block.composition.state
            )));
        }
    }
    match block.status.health.as_deref() {
        Some("OK") => Ok(()),
        Some("Warning") => Err(ProviderError::Warning(format!(
            "resource block {} reports health Warning",
            block.id
        ))),
        Some("Critical") => Err(ProviderError::Critical(format!(
            "resource block {} reports health Critical",
            block.id
        ))),
        other => Err(ProviderError::malformed(format!(
            "resource block {} reports health {other:?}, not OK, Warning or Critical",
            block.id
        ))),
    }
}

/// Every non-compute block composed into a system that a Node names
/// (`redfish://<system id>`); systems of no Node are not the cluster's and are skipped.
pub fn list<H: Host + ?Sized>(fabric: &Fabric<'_, H>) -> Result<Vec<DeviceInfo>, ProviderError> {
    let host = fabric.client.host();
    let nodes = nodes_by_system(host)?;
    let mut out = Vec::new();
    for link in fabric.systems()? {
        let path = link.path()?;
        let id = link.last_segment().to_string();
        let Some(node) = nodes.get(&id) else {
            host.log(
                LogLevel::Debug,
                &format!("system {id} is no Node's (no providerID redfish://{id}): skipped"),
            );
            continue;
        };
        let system: crate::resources::System = fabric.client.get(path)?;
        for slot in fabric.composed(&system)? {
            if slot.block.composition() != Composition::Composed {
                continue;
            }
            let (Some(device_type), Some(device)) = (slot.block.device_type(), &slot.device) else {
                continue;
            };
            out.push(DeviceInfo {
                node: node.clone(),
                machine_id: id.clone(),
                device_type,
                model: device.model().to_string(),
                device_id: device.device_id(&slot.block.id)?,
                fabric_device_id: slot.block.id.clone(),
            });
        }
    }
    Ok(out)
}

/// The id of the one pool a composition service is: any unused block can be composed
/// into any of its systems.
pub const POOL_ID: &str = "composition-service";

/// The unused blocks of the asked kinds (model compared like an attach does: trimmed,
/// case-insensitive), with memory sizes; one pool reaching every asked node whose
/// providerID names a system of the service. A block `Composing` is not free.
pub fn pool<H: Host + ?Sized>(
    fabric: &Fabric<'_, H>,
    query: &PoolQuery,
) -> Result<PoolOutcome, ProviderError> {
    let host = fabric.client.host();
    let by_system = nodes_by_system(host)?;
    let systems: std::collections::BTreeSet<String> = fabric
        .systems()?
        .iter()
        .map(|l| l.last_segment().to_string())
        .collect();
    let nodes: Vec<String> = by_system
        .iter()
        .filter(|(system, node)| systems.contains(*system) && query.nodes.contains(node))
        .map(|(_, node)| node.clone())
        .collect();
    let mut free: Vec<FreeDevices> = query
        .kinds
        .iter()
        .map(|kind| FreeDevices {
            kind: kind.clone(),
            count: 0,
            sizes: Vec::new(),
        })
        .collect();
    for link in fabric.all_blocks()? {
        let Some(block) = fabric.block_at(link.path()?)? else {
            continue;
        };
        if block.composition() != Composition::Unused || block.device_type().is_none() {
            continue;
        }
        let slot = fabric.slot(block)?;
        let (Some(device_type), Some(device)) = (slot.block.device_type(), &slot.device) else {
            continue;
        };
        let Some(entry) = free
            .iter_mut()
            .find(|f| same_kind(&f.kind, device_type, device.model()))
        else {
            continue;
        };
        entry.count = entry.count.saturating_add(1);
        if device_type == DeviceType::Cxlmemory
            && let Some(mib) = device.capacity_mib
        {
            entry.sizes.push(mib.saturating_mul(1 << 20));
        }
    }
    // Sizes are reported only when every free device of the kind said its size.
    for f in &mut free {
        if f.sizes.len() != f.count as usize {
            f.sizes.clear();
        }
    }
    Ok(PoolOutcome::Pools(vec![FabricPool {
        id: POOL_ID.to_string(),
        nodes,
        free,
    }]))
}

fn same_kind(kind: &PoolKind, device_type: DeviceType, model: &str) -> bool {
    kind.device_type == device_type && kind.model.trim().eq_ignore_ascii_case(model)
}
