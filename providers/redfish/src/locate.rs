//! Finding the block of a resource's device: by its fabric id (the block's `Id`) when
//! recorded, else by its device id among the blocks composed into the system.

use cro_provider_sdk::{ComposableResource, Host, ProviderError};

use crate::fabric::Fabric;
use crate::resources::Block;

#[derive(Debug)]
pub enum Located {
    /// The resource names no device.
    Nothing,
    /// The service knows no such block (or no block of the system has the device).
    Gone,
    Block(Block),
}

fn present(s: &Option<String>) -> Option<&str> {
    s.as_deref().map(str::trim).filter(|s| !s.is_empty())
}

pub fn locate<H: Host + ?Sized>(
    fabric: &Fabric<'_, H>,
    r: &ComposableResource,
    system: &str,
) -> Result<Located, ProviderError> {
    if let Some(block) = present(&r.fabric_device_id) {
        if block.contains(['/', '?', '#', '%', '\\', ' ']) || block == ".." {
            return Err(ProviderError::Other(format!(
                "{}'s fabric device id '{block}' is not a resource block id",
                r.name
            )));
        }
        return Ok(match fabric.block(block)? {
            Some(b) => Located::Block(b),
            None => Located::Gone,
        });
    }
    let Some(device_id) = present(&r.device_id) else {
        return Ok(Located::Nothing);
    };
    by_device_id(fabric, device_id, system)
}

/// Like [`locate`], but a resource that names no device is looked up among the attaches
/// this provider has not finished (its in-flight record): a detach while the attach is
/// still composing must not leave the block to be composed for nobody.
pub fn locate_for_detach<H: Host + ?Sized>(
    fabric: &Fabric<'_, H>,
    r: &ComposableResource,
    system: &str,
) -> Result<Located, ProviderError> {
    if present(&r.fabric_device_id).is_some() || present(&r.device_id).is_some() {
        return locate(fabric, r, system);
    }
    let host = fabric.client.host();
    let key = format!("{}{}", crate::attach::IN_FLIGHT_PREFIX, r.name);
    let Some(block) = host.state_get(&key).and_then(|b| String::from_utf8(b).ok()) else {
        return Ok(Located::Nothing);
    };
    match fabric.block(&block)? {
        Some(b) if b.linked_to(system) => Ok(Located::Block(b)),
        // Never composed (or already taken back): nothing of this resource's is left.
        _ => {
            host.state_remove(&key);
            Ok(Located::Gone)
        }
    }
}

fn by_device_id<H: Host + ?Sized>(
    fabric: &Fabric<'_, H>,
    device_id: &str,
    system: &str,
) -> Result<Located, ProviderError> {
    let sys = fabric.system(system)?;
    for slot in fabric.composed(&sys)? {
        let id = slot
            .device
            .as_ref()
            .and_then(|d| d.device_id(&slot.block.id).ok());
        if id.as_deref() == Some(device_id) {
            return Ok(Located::Block(slot.block));
        }
    }
    Ok(Located::Gone)
}
