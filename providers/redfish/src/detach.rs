//! Detach: PATCH the system's `Links.ResourceBlocks` without the device's block.
//! Idempotent: a block already unused (or in another system, or unknown) is removed.
//! A slow decomposition is `in-progress`; its task is kept in `state` so the next call
//! watches it instead of PATCHing again.

use cro_provider_sdk::{ComposableResource, Host, ProviderError, RemoveOutcome};

use crate::attach::release;
use crate::client::is_in_use;
use crate::fabric::{Fabric, Recomposed};
use crate::locate::{Located, locate_for_detach};
use crate::resources::{Composition, TaskOutcome};

const DETACH_PREFIX: &str = "redfish/detach/";
const DETACH_TTL_MS: u64 = 24 * 3600 * 1000;

pub fn remove<H: Host + ?Sized>(
    fabric: &Fabric<'_, H>,
    r: &ComposableResource,
    system: &str,
) -> Result<RemoveOutcome, ProviderError> {
    let host = fabric.client.host();
    let block = match locate_for_detach(fabric, r, system)? {
        Located::Nothing | Located::Gone => return Ok(RemoveOutcome::Removed),
        Located::Block(b) => b,
    };
    let key = format!("{DETACH_PREFIX}{}", block.id);
    if !block.linked_to(system) || block.composition() == Composition::Unused {
        host.state_remove(&key);
        release(host, &r.name, &block.id);
        return Ok(RemoveOutcome::Removed);
    }
    if block.composition() == Composition::Composing {
        return Ok(RemoveOutcome::InProgress(format!(
            "resource block {} is still being composed into system {system}; it is decomposed once that ends",
            block.id
        )));
    }
    // A decomposition this provider started: watch it.
    if let Some(task) = host.state_get(&key).and_then(|t| String::from_utf8(t).ok()) {
        match fabric.task(&task)?.outcome() {
            TaskOutcome::Running => {
                return Ok(RemoveOutcome::InProgress(format!(
                    "resource block {} is being decomposed from system {system} (task {task})",
                    block.id
                )));
            }
            TaskOutcome::Failed(code, message) => {
                host.state_remove(&key);
                return Err(ProviderError::Fabric {
                    status: 500,
                    code,
                    message: format!(
                        "decomposing resource block {} from system {system} failed: {message}",
                        block.id
                    ),
                });
            }
            // Done, yet the block was read composed: another change put it back; go again.
            TaskOutcome::Completed => host.state_remove(&key),
        }
    }
    let id = block.id.clone();
    let result = fabric.recompose(system, |current| {
        if current.iter().any(|l| l.last_segment() == id) {
            Some(
                current
                    .iter()
                    .filter(|l| l.last_segment() != id)
                    .cloned()
                    .collect(),
            )
        } else {
            None
        }
    });
    // The block is on its way out: an unfinished attach of this resource (one that
    // never returned the ids) holds nothing any more.
    if matches!(
        result,
        Ok(Recomposed::Done | Recomposed::Unchanged | Recomposed::Accepted { .. })
    ) {
        release(host, &r.name, &id);
    }
    match result {
        Ok(Recomposed::Done | Recomposed::Unchanged) => Ok(RemoveOutcome::Removed),
        Ok(Recomposed::Accepted { task }) => {
            host.state_set(&key, task.as_bytes(), Some(DETACH_TTL_MS));
            Ok(RemoveOutcome::InProgress(format!(
                "resource block {id} is being decomposed from system {system} (task {task})"
            )))
        }
        // Removing adds no block, so `ResourceInUse` here means another change of the
        // system is running: ours waits for it.
        Err(e) if is_in_use(&e) => Ok(RemoveOutcome::InProgress(format!(
            "another change of system {system} is running; resource block {id} is decomposed after it"
        ))),
        Err(e) => Err(e),
    }
}
