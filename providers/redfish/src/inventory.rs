//! Check (a device's health) and the listing of every device composed into the
//! cluster's systems.

use cro_provider_sdk::{ComposableResource, DeviceInfo, Host, LogLevel, ProviderError};

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
