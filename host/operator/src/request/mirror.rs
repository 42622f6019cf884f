//! `status.resources` of a request: each ComposableResource's state, ids, node and error.

use std::collections::BTreeMap;

use cro_api::{ComposableResource, ScalarResourceStatus};
use kube::ResourceExt;

pub type Entries = BTreeMap<String, ScalarResourceStatus>;

pub fn entry_of(r: &ComposableResource) -> ScalarResourceStatus {
    let status = r.status.clone().unwrap_or_default();
    ScalarResourceStatus {
        state: status.state,
        device_id: status.device_id,
        cdi_device_id: status.cdi_device_id,
        node_name: r.spec.target_node.clone(),
        error: status.error,
    }
}

/// `wanted` with every entry that has an object refreshed from it.
pub fn mirrored(wanted: &Entries, objects: &[ComposableResource]) -> Entries {
    wanted
        .iter()
        .map(|(name, entry)| {
            let fresh = objects
                .iter()
                .find(|o| o.name_any() == *name)
                .map(entry_of)
                .unwrap_or_else(|| entry.clone());
            (name.clone(), fresh)
        })
        .collect()
}
