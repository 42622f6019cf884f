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
    if let Some(outcome) = watch_decomposition(fabric, &key, &block.id, system)? {
        return Ok(outcome);
    }
    decompose(fabric, r, &key, &block.id, system)
}

/// Follows a decomposition this provider started (its task under `key`): `None` when
/// there is none, or it is done yet the block was read composed (another change put
/// it back), so it is decomposed again.
fn watch_decomposition<H: Host + ?Sized>(
    fabric: &Fabric<'_, H>,
    key: &str,
    block: &str,
    system: &str,
) -> Result<Option<RemoveOutcome>, ProviderError> {
    let host = fabric.client.host();
    let Some(task) = host.state_get(key).and_then(|t| String::from_utf8(t).ok()) else {
        return Ok(None);
    };
    match fabric.task(&task)?.outcome() {
        TaskOutcome::Running => Ok(Some(RemoveOutcome::InProgress(format!(
            "resource block {block} is being decomposed from system {system} (task {task})"
        )))),
        TaskOutcome::Failed(code, message) => {
            host.state_remove(key);
            Err(ProviderError::Fabric {
                status: 500,
                code,
                message: format!(
                    "decomposing resource block {block} from system {system} failed: {message}"
                ),
            })
        }
        TaskOutcome::Completed => {
            host.state_remove(key);
            Ok(None)
        }
    }
}

/// PATCHes the system's links without `block`; a slow decomposition's task is kept
/// under `key` for the next call to watch.
fn decompose<H: Host + ?Sized>(
    fabric: &Fabric<'_, H>,
    r: &ComposableResource,
    key: &str,
    block: &str,
    system: &str,
) -> Result<RemoveOutcome, ProviderError> {
    let host = fabric.client.host();
    let result = fabric.recompose(system, |current| {
        if current.iter().any(|l| l.last_segment() == block) {
            Some(
                current
                    .iter()
                    .filter(|l| l.last_segment() != block)
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
        release(host, &r.name, block);
    }
    match result {
        Ok(Recomposed::Done | Recomposed::Unchanged) => Ok(RemoveOutcome::Removed),
        Ok(Recomposed::Accepted { task }) => {
            host.state_set(key, task.as_bytes(), Some(DETACH_TTL_MS));
            Ok(RemoveOutcome::InProgress(format!(
                "resource block {block} is being decomposed from system {system} (task {task})"
            )))
        }
        // Removing adds no block, so `ResourceInUse` here means another change of the
        // system is running: ours waits for it.
        Err(e) if is_in_use(&e) => Ok(RemoveOutcome::InProgress(format!(
            "another change of system {system} is running; resource block {block} is decomposed after it"
        ))),
        Err(e) => Err(e),
    }
}
