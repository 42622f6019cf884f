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
